//! SIGKILL of the leader, and the new leader's search of its followers' logs.
//! (A leader's death or loss of leadership with requests parked on it is a
//! scenario of the simulator: `sim/tests/scenarios/failover.rs`.)

use permitd_tests::{granted, request, Cluster, Settings};

/// A new leader knows nothing of its followers' logs and searches them from
/// its oldest entry; a follower whose vote said it holds a run gets an empty
/// probe for it instead of the run (`node/src/raft/peer_logs.rs`). The cluster
/// then goes on as before: the new leader grants, the follower applies
/// everything, and the killed node, back, catches up. At several shards the
/// keys are the meta shard's, the shard whose leader the test kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_probes_the_runs_its_follower_holds_instead_of_sending_them() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let keys = meta_shard_keys(&cluster, "run", 11);
    // Far more entries than one append carries (64), all held by the followers.
    for client in 0..200 {
        let key = &keys[client % 10];
        let answer = cluster
            .post(
                leader,
                &format!("/v1/semaphores/{key}"),
                &request(&format!("c{client}"), &[("g", 1, 1)]),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    cluster.wait_applied_everywhere(leader).await;
    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader().await;
    let answer = cluster
        .post(
            new_leader,
            &format!("/v1/semaphores/{}", keys[10]),
            &request("after", &[("g", 1, 1)]),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(granted(&answer.body), 1);
    let probed = cluster
        .metric(new_leader, "permitd_raft_runs_found_held_total")
        .await
        .unwrap_or(0.0);
    assert!(probed >= 1.0, "runs found held: {probed}");
    cluster.wait_applied_everywhere(new_leader).await;
    cluster.restart(leader);
    cluster.wait_healthy().await;
    cluster.wait_applied_everywhere(new_leader).await;
}

/// `count` keys `{prefix}-{i}` of the meta shard, the one whose leader
/// `/cluster/status` names (every key at one shard).
fn meta_shard_keys(cluster: &Cluster, prefix: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|key| cluster.shard_of_key(key) == 0)
        .take(count)
        .collect()
}
