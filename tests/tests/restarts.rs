//! Restarts keep state: one node, then the whole cluster, without re-initialising.

use permitd_tests::{eventually, granted, request, Cluster, Settings};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restart_keeps_its_grants() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let answer = cluster
        .post(
            leader,
            "/v1/semaphores/kept",
            &request("c", &[("g", 40, 1)]),
        )
        .await;
    assert_eq!(granted(&answer.body), 40);
    let follower = cluster.follower_of(leader);
    cluster.stop(follower);
    cluster.restart(follower);
    cluster.wait_healthy().await;
    let applied = eventually(Duration::from_secs(10), || async {
        let status = cluster.status(follower).await;
        let leader_status = cluster.status(leader).await;
        match (status, leader_status) {
            (Some(status), Some(leader_status)) => {
                status["lastApplied"] == leader_status["lastApplied"] && status["leader"].is_u64()
            }
            _ => false,
        }
    })
    .await;
    assert!(applied, "the restarted node caught up");
    assert_eq!(cluster.usage(follower, "kept").await["granted"], 40);
    let status = cluster.status(follower).await.unwrap();
    assert_eq!(status["members"].as_array().unwrap().len(), 3, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cluster_restart_keeps_all_state() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let config =
        json!({"limit": 7, "roundWaitMs": 10, "roundPeriodMs": 10, "grantTimeoutMs": 600000});
    assert_eq!(
        cluster
            .put(leader, "/v1/semaphores/durable/config", &config)
            .await
            .status,
        200
    );
    let group = cluster
        .put(
            leader,
            "/v1/semaphores/durable/groups/wf",
            &json!({"limit": 5}),
        )
        .await;
    assert_eq!(group.status, 200);
    let answer = cluster
        .post(
            leader,
            "/v1/semaphores/durable",
            &request("c", &[("wf", 9, 1)]),
        )
        .await;
    assert_eq!(granted(&answer.body), 5);
    let before = cluster.usage(leader, "durable").await;

    for id in [1, 2, 3] {
        cluster.stop(id);
    }
    for id in [1, 2, 3] {
        cluster.restart(id);
    }
    cluster.wait_healthy().await;
    let leader = cluster.wait_for_leader().await;
    assert_eq!(cluster.usage(leader, "durable").await, before);
    let config = cluster.get(leader, "/v1/semaphores/durable/config").await;
    assert_eq!(config.body["limit"], 7);
    // A fresh init is refused: the cluster resumed.
    assert_eq!(
        cluster
            .post_admin(leader, "/cluster/init", &json!({}))
            .await
            .0,
        409
    );
    // Grant ids and fences stay unique and increasing after the restart.
    let next = cluster
        .post(
            leader,
            "/v1/semaphores/durable",
            &request("d", &[("other", 5, 2)]),
        )
        .await;
    assert_eq!(granted(&next.body), 2, "{}", next.body);
    let old_fence = answer.body["grants"][0]["fence"].as_u64().unwrap();
    assert!(next.body["grants"][0]["fence"].as_u64().unwrap() > old_fence);
}
