//! Failover of parked requests: a leader that dies or loses its leadership
//! fails the requests waiting for a round at once, with a retryable error; a
//! new leader serves, and what was acknowledged before is kept.

use permitd_core::contract::protocol::PermitRequest;
use permitd_sim::scenario::{now, Cluster, Scenario};
use permitd_sim::trace::Trace;
use serde_json::json;

use crate::{config, ms, path, request};

/// A key whose round waits long: its requests stay parked on the leader.
const SLOW: &str = "slow";

/// Replaces the e2e `killing_the_leader_fails_waiting_requests_and_loses_no_grant`
/// (tests/tests/failover.rs, which SIGKILLed it): a request forwarded by a
/// follower and parked on the leader fails with 503 and `Retry-After` once
/// the leader dies; a new leader is elected and serves, and every grant
/// acknowledged before the crash is still counted.
#[test]
fn a_crashed_leader_fails_waiting_requests_and_loses_no_grant() {
    crashed_leader();
}

/// A scenario gives the same history every time: the crash (whose dropped
/// connections' segments would leave in an order that follows process-wide
/// task ids) included.
#[test]
fn a_scenario_replays_to_the_same_trace() {
    let (first, second) = (crashed_leader(), crashed_leader());
    assert!(first.events() > 20, "{} events", first.events());
    assert_eq!(
        first.hash(),
        second.hash(),
        "the runs differ:\n{:?}\n{:?}",
        first.last(),
        second.last()
    );
}

fn crashed_leader() -> Trace {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        let follower = cluster.others(leader)[0];
        let mut acknowledged = 0;
        for client in 0..5 {
            let mut body = request(&format!("c{client}"), None);
            body["demand"][0]["count"] = json!(3);
            let answer = cluster.post(follower, &path("ha"), &body).await;
            assert_eq!(answer.status, 200, "{}", answer.body);
            acknowledged += answer.granted();
        }
        assert_eq!(acknowledged, 15);
        cluster
            .configure(follower, SLOW, config(10, 30_000, 30_000))
            .await;
        let waiting = cluster.spawn_post(follower, &path(SLOW), &request("w", None));
        tokio::time::sleep(ms(10)).await;
        assert_eq!(
            cluster.waiting(leader, SLOW).await,
            1,
            "parked on the leader"
        );
        cluster.crash(leader).await;
        let crashed = now();
        let failed = waiting.await.expect("the call");
        assert_eq!(failed.status, 503, "{}", failed.body);
        assert!(failed.retry_after.is_some(), "with Retry-After");
        assert!(
            failed.at < crashed + ms(2_000),
            "failed at {:?}, long before its round",
            failed.at
        );

        let new_leader = cluster.leader().await;
        assert_ne!(new_leader, leader);
        let served = cluster
            .eventually(ms(5_000), || async {
                let answer = cluster
                    .post(follower, &path("ha"), &request("after", None))
                    .await;
                answer.status == 200 && answer.granted() == 1
            })
            .await;
        assert!(served, "the new leader serves");
        for node in cluster.others(leader) {
            let usage = cluster.get(node, &format!("{}/usage", path("ha"))).await;
            assert_eq!(
                usage.body["granted"],
                acknowledged + 1,
                "node {node}: {}",
                usage.body
            );
        }
    })
}

/// Replaces the e2e `a_node_without_quorum_answers_no_quorum_with_retry_after`:
/// with two of three nodes dead, the survivor stops being ready and answers
/// requests 503 `no_quorum` with `Retry-After`.
#[test]
fn a_node_without_quorum_answers_no_quorum_with_retry_after() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        let others = cluster.others(leader);
        let (survivor, other) = (others[0], others[1]);
        cluster.crash(leader).await;
        cluster.crash(other).await;
        let unready = cluster
            .eventually(ms(5_000), || async {
                let ready = cluster.get(survivor, "/readyz").await;
                (ready.status, ready.code()) == (503, "no_quorum")
            })
            .await;
        assert!(unready, "the survivor stops being ready");
        let answer = cluster
            .post(survivor, &path("alone"), &request("c", None))
            .await;
        assert_eq!(
            (answer.status, answer.code()),
            (503, "no_quorum"),
            "{}",
            answer.body
        );
        assert!(answer.retry_after.is_some(), "with Retry-After");
    });
}

/// Pauses `leader` (every link held) until the other two elect a new leader;
/// returns it. The paused leader still believes it leads.
async fn depose(cluster: &Cluster, leader: u64) -> u64 {
    cluster.pause(leader);
    loop {
        let new_leader = cluster.leader().await;
        if new_leader != leader {
            return new_leader;
        }
        tokio::time::sleep(ms(10)).await;
    }
}

/// Replaces the e2e `a_leader_that_loses_leadership_fails_its_waiting_requests_with_leader_changed`
/// (tests/tests/failover.rs, which SIGSTOPped it): a leader paused past the
/// election timeout comes back to a newer term and steps down; the request
/// parked on it fails at once with 503 `leader_changed` and `Retry-After`.
#[test]
fn a_leader_that_loses_leadership_fails_its_parked_requests_with_leader_changed() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        cluster
            .configure(leader, SLOW, config(10, 60_000, 60_000))
            .await;
        let waiting = cluster.spawn_post(leader, &path(SLOW), &request("w", None));
        tokio::time::sleep(ms(10)).await;
        assert_eq!(
            cluster.waiting(leader, SLOW).await,
            1,
            "parked on the leader"
        );
        let new_leader = depose(&cluster, leader).await;
        assert_ne!(new_leader, leader);
        cluster.resume(leader);
        let resumed = now();
        let failed = waiting.await.expect("the call");
        assert_eq!(
            (failed.status, failed.code()),
            (503, "leader_changed"),
            "{}",
            failed.body
        );
        assert!(failed.retry_after.is_some(), "with Retry-After");
        assert!(
            failed.at <= resumed + ms(100),
            "failed at {:?}, back at {resumed:?}",
            failed.at
        );
    });
}

/// The client's side of a leader change: the real Rust client's request
/// parked on a leader that loses its leadership gets the retryable
/// `leader_changed`, and its retry (same `requestId`) is granted by the new
/// leader, once.
#[test]
fn a_clients_parked_request_is_retried_and_granted_by_the_new_leader() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        cluster.configure(leader, SLOW, config(10, 500, 500)).await;
        let client = cluster.client(7);
        let asked: PermitRequest = serde_json::from_value(request("w", None)).expect("a request");
        let call = tokio::spawn(async move { client.request(SLOW, asked).await });
        tokio::time::sleep(ms(100)).await;
        assert_eq!(
            cluster.waiting(leader, SLOW).await,
            1,
            "parked on the leader"
        );
        let new_leader = depose(&cluster, leader).await;
        cluster.resume(leader);
        let grant = call
            .await
            .expect("the call")
            .expect("granted after a retry");
        assert_eq!(grant.grants.iter().map(|g| g.permits).sum::<u64>(), 1);
        let usage = cluster
            .get(new_leader, &format!("{}/usage", path(SLOW)))
            .await;
        assert_eq!(usage.body["granted"], 1, "granted once: {}", usage.body);
    });
}
