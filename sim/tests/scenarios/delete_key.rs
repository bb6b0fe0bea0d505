//! Deleting a key while its round waits or is being committed (docs/protocol.md,
//! "Deleting a key"; `node/src/leader/rounds.rs`, `deleted_after`): the
//! requests waiting run in a later round under the defaults; a round applied
//! together with the delete is not handed out.

use std::time::Duration;

use permitd_node::leader::rounds::RoundLimits;
use permitd_sim::scenario::{Answer, Cluster, Scenario};
use serde_json::{json, Value};

use crate::{config, last_log_index, ms, path, pause_followers, request, resume_all};

/// The limit of a key nobody configured (`KeyConfig::default()`).
const DEFAULT_LIMIT: u64 = 100;

async fn delete(cluster: &Cluster, node: u64, key: &str, query: &str) -> Answer {
    let path = format!("{}{query}", path(key));
    cluster
        .call(node, http::Method::DELETE, &path, None, None)
        .await
}

/// A request of `client` for `count` permits.
fn asking(client: &str, count: u64) -> Value {
    let mut body = request(client, None);
    body["demand"][0]["count"] = json!(count);
    body
}

/// Replaces the e2e `a_delete_during_a_round_leaves_waiting_requests_to_a_round_under_the_defaults`
/// (tests/tests/delete_key.rs): waiting demand keeps a key in use (409); a
/// forced delete leaves the request parked, and its round, a later entry,
/// runs on the deleted key: the defaults, no holders.
#[test]
fn a_delete_during_a_round_leaves_waiting_requests_to_a_round_under_the_defaults() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        let follower = cluster.others(leader)[0];
        // The deleted settings would grant 1; the defaults grant all 5.
        cluster
            .configure(follower, "round", config(1, 2_000, 20))
            .await;
        let waiting = cluster.spawn_post(follower, &path("round"), &asking("waiter", 5));
        tokio::time::sleep(ms(20)).await;
        assert_eq!(cluster.waiting(leader, "round").await, 1, "parked");

        let refused = delete(&cluster, follower, "round", "").await;
        assert_eq!(refused.status, 409, "{}", refused.body);
        let message = refused.body["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("1 requests waiting"), "{message}");

        let forced = delete(&cluster, follower, "round", "?force=true").await;
        assert_eq!(forced.status, 200, "{}", forced.body);
        assert_eq!(forced.body["released"]["permits"], 0);
        let answer = waiting.await.expect("the request");
        assert_eq!(
            answer.granted(),
            5,
            "granted under the defaults: {}",
            answer.body
        );
        let fence = answer.body["grants"][0]["fence"].as_u64().expect("fence");
        let deleted_at = forced.body["logIndex"].as_u64().expect("logIndex");
        assert!(
            fence > deleted_at,
            "the round came after the delete: {fence} > {deleted_at}"
        );
        for node in cluster.nodes() {
            let usage = cluster.get(node, &format!("{}/usage", path("round"))).await;
            let (granted, limit) = (usage.body["granted"].as_u64(), usage.body["limit"].as_u64());
            assert_eq!(
                (granted, limit),
                (Some(5), Some(DEFAULT_LIMIT)),
                "node {node}"
            );
        }
        let holders = cluster
            .get(leader, &format!("{}/holders", path("round")))
            .await;
        assert_eq!(holders.body["clients"]["waiter"]["grants"][0]["permits"], 5);
    });
}

/// Waits until `leader`'s log holds more than `index` entries; its new last index.
async fn appended_after(cluster: &Cluster, leader: u64, index: u64) -> u64 {
    let grown = cluster
        .eventually(ms(2_000), || async {
            last_log_index(cluster, leader).await > index
        })
        .await;
    assert!(grown, "the leader appended nothing after {index}");
    last_log_index(cluster, leader).await
}

/// How long the followers are paused: several Raft RPC deadlines, so that the
/// leader's append of the round alone times out and the next one carries the
/// round and the delete together; well inside the commit timeout.
const PAUSED: Duration = ms(1_500);

/// Replaces the e2e `a_round_committed_together_with_the_delete_is_not_handed_out`
/// (tests/tests/delete_key.rs): a round and a forced delete of its key
/// commit and apply together; the round's grant is released by the delete
/// before its answer goes out, so its caller gets 503 `key_deleted` and asks
/// again.
#[test]
fn a_round_committed_together_with_the_delete_is_not_handed_out() {
    let limits = RoundLimits {
        commit_timeout: ms(20_000),
        ..RoundLimits::default()
    };
    Scenario::new()
        .rounds(limits)
        .rpc_timeout_ms(200)
        .run(|cluster| async move {
            let leader = cluster.leader().await;
            cluster
                .configure(leader, "raced", json!({"limit": 10}))
                .await;
            let before = last_log_index(&cluster, leader).await;
            let followers = pause_followers(&cluster, leader);
            let round = cluster.spawn_post(leader, &path("raced"), &asking("racer", 4));
            let round_index = appended_after(&cluster, leader, before).await;
            let forced = {
                let cluster = cluster.clone();
                tokio::spawn(async move { delete(&cluster, leader, "raced", "?force=true").await })
            };
            appended_after(&cluster, leader, round_index).await;
            tokio::time::sleep(PAUSED).await;
            resume_all(&cluster, &followers);

            let forced = forced.await.expect("the delete");
            assert_eq!(forced.status, 200, "{}", forced.body);
            assert_eq!(
                forced.body["released"],
                json!({"grants": 1, "leases": 0, "permits": 4})
            );
            let round = round.await.expect("the request");
            assert_eq!(
                (round.status, round.code()),
                (503, "key_deleted"),
                "{}",
                round.body
            );
            assert!(round.retry_after.is_some(), "ask again: {}", round.body);
            let usage = cluster
                .get(leader, &format!("{}/usage", path("raced")))
                .await;
            assert_eq!(usage.body["granted"], 0, "{}", usage.body);
            let again = cluster
                .post(leader, &path("raced"), &asking("racer", 4))
                .await;
            assert_eq!(again.granted(), 4, "{}", again.body);
            let usage = cluster
                .get(leader, &format!("{}/usage", path("raced")))
                .await;
            assert_eq!(usage.body["limit"], DEFAULT_LIMIT, "{}", usage.body);
        });
}
