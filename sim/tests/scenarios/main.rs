//! Scenario tests: the rounds driver, held requests, early reports, deleting
//! a key during a round, the election guard and failover, each a script
//! against the simulator's three real nodes with no random faults
//! (`permitd_sim::scenario`), asserting what the clients got and at what
//! simulated time. Each replaces an end-to-end test of `tests/tests/` that
//! started real processes and waited in real time, or covers a rule that had
//! no test; a doc comment names the e2e test it replaces, deleted in the same
//! change (`git log -- tests/tests/<file>` shows it); docs/simulation.md,
//! "Scenario tests", lists them all.
//!
//! `cargo test -p permitd-sim --release --test scenarios`

mod delete_key;
mod early_reports;
mod election;
mod failover;
mod held_requests;
mod rounds;

use std::time::Duration;

use permitd_node::leader::rounds::RoundLimits;
use permitd_sim::scenario::{Answer, Cluster};
use serde_json::{json, Value};

pub const fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// The API path of `key`.
pub fn path(key: &str) -> String {
    format!("/v1/semaphores/{key}")
}

/// A request of `client` for one permit of group `g`, with `waitMs` if given.
pub fn request(client: &str, wait_ms: Option<u64>) -> Value {
    let mut body = json!({"type": "request", "v": 1, "clientId": client,
        "demand": [{"group": "g", "count": 1, "oldestAt": 1}]});
    if let Some(wait_ms) = wait_ms {
        body["waitMs"] = json!(wait_ms);
    }
    body
}

/// A grant report of `grant_id`: one permit claimed, `released` released.
pub fn report(grant_id: &str, released: u64) -> Value {
    json!([{"grantId": grant_id, "claimed": 1, "released": released}])
}

/// A sync of `client` that claims `grant_id`'s one permit and releases it.
pub fn release(client: &str, grant_id: &str) -> Value {
    json!({"type": "sync", "v": 1, "clientId": client, "grants": report(grant_id, 1)})
}

/// Round timings of `wait_ms` and `period_ms` for a key of `limit`.
pub fn config(limit: u64, wait_ms: u64, period_ms: u64) -> Value {
    json!({"limit": limit, "roundWaitMs": wait_ms, "roundPeriodMs": period_ms})
}

/// Posts `request` of `client` to `key` on `node` and asserts one permit was
/// granted; returns the answer.
pub async fn take(cluster: &Cluster, node: u64, key: &str, client: &str) -> Answer {
    let answer = cluster.post(node, &path(key), &request(client, None)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.granted(), 1, "{}", answer.body);
    answer
}

/// The log index the leader's status shows.
pub async fn last_log_index(cluster: &Cluster, node: u64) -> u64 {
    let status = cluster.status(node).await.expect("the node answers");
    status.last_log_index.unwrap_or(0)
}

/// The commit timeout of the scenarios that stall a leader (`[limits]
/// commit_timeout_ms`).
pub const COMMIT_TIMEOUT: Duration = ms(1_000);

/// The default limits with [`COMMIT_TIMEOUT`].
pub fn with_commit_timeout() -> RoundLimits {
    RoundLimits {
        commit_timeout: COMMIT_TIMEOUT,
        ..RoundLimits::default()
    }
}

/// Pauses every follower of `leader` (nothing it proposes can commit);
/// returns them.
pub fn pause_followers(cluster: &Cluster, leader: u64) -> Vec<u64> {
    let followers = cluster.others(leader);
    followers.iter().for_each(|id| cluster.pause(*id));
    followers
}

pub fn resume_all(cluster: &Cluster, nodes: &[u64]) {
    nodes.iter().for_each(|id| cluster.resume(*id));
}
