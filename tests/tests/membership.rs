//! A fourth node joins: added as a learner through a follower (forwarded to the
//! leader), catches up, and is promoted to voter.

use std::time::Duration;

use permitd_tests::{eventually, granted, request, Cluster, Settings};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_joins_as_learner_and_becomes_a_voter() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let answer = cluster
        .post(
            leader,
            "/v1/semaphores/grow",
            &request("c", &[("g", 12, 1)]),
        )
        .await;
    assert_eq!(granted(&answer.body), 12);

    let id = cluster.spawn_extra_node();
    cluster.wait_healthy().await;
    let node = cluster.node(id);
    let add = json!({"action": "addLearner", "id": id,
        "apiAddr": node.api_addr, "raftAddr": node.raft_addr});
    let follower = cluster.follower_of(leader);
    let (status, body) = cluster.post_admin(follower, "/cluster/members", &add).await;
    assert_eq!(status, 200, "{body}");
    let role = |body: &serde_json::Value| {
        body["members"]
            .as_array()
            .and_then(|members| members.iter().find(|member| member["id"] == id))
            .map(|member| member["role"].as_str().unwrap_or("").to_owned())
    };
    assert_eq!(role(&body).as_deref(), Some("learner"), "{body}");

    let promote = json!({"action": "changeMembership", "voters": [1, 2, 3, id]});
    let (status, body) = cluster
        .post_admin(leader, "/cluster/members", &promote)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(role(&body).as_deref(), Some("voter"), "{body}");

    let caught_up = eventually(Duration::from_secs(10), || async {
        let (Some(new), Some(old)) = (cluster.status(id).await, cluster.status(leader).await)
        else {
            return false;
        };
        new["lastApplied"] == old["lastApplied"] && role(&new).as_deref() == Some("voter")
    })
    .await;
    assert!(caught_up, "the new voter applied everything");
    assert_eq!(cluster.usage(id, "grow").await["granted"], 12);
}
