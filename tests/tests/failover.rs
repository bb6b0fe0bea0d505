//! SIGKILL of the leader: the requests waiting for a round fail at once, a new
//! leader is elected and serves, and every grant acknowledged before the kill is
//! still counted.

use std::time::Duration;

use permitd_tests::{eventually, granted, request, wait_for_pending, Cluster, Settings};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_fails_waiting_requests_and_loses_no_grant() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let mut acknowledged = 0;
    for client in 0..5 {
        let answer = cluster
            .post(
                follower,
                "/v1/semaphores/ha",
                &request(&format!("c{client}"), &[("g", 3, 1)]),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        acknowledged += granted(&answer.body);
    }
    assert_eq!(acknowledged, 15);
    // A key whose round waits long: its requests are parked on the leader.
    let slow = json!({"roundWaitMs": 30000, "roundPeriodMs": 30000});
    assert_eq!(
        cluster
            .put(follower, "/v1/semaphores/slow/config", &slow)
            .await
            .status,
        200
    );
    let waiting = {
        let url = format!("{}/v1/semaphores/slow", cluster.node(follower).url());
        let http = cluster.http.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let answer = http
                .post(url)
                .json(&request("w", &[("g", 1, 1)]))
                .send()
                .await;
            (
                answer.map(|answer| {
                    let retry = answer.headers().contains_key("retry-after");
                    (answer.status().as_u16(), retry)
                }),
                started.elapsed(),
            )
        })
    };
    // Forwarded by the follower and parked on the leader.
    wait_for_pending(&cluster, leader, 1).await;
    cluster.kill(leader);
    let (answer, waited) = waiting.await.unwrap();
    let (status, retry_after) = answer.expect("the follower answers");
    assert_eq!(status, 503, "the waiting request failed");
    assert!(retry_after, "with Retry-After");
    assert!(
        waited < Duration::from_secs(20),
        "it failed long before its round"
    );

    let new_leader = cluster.wait_for_leader().await;
    assert_ne!(new_leader, leader);
    let served = eventually(Duration::from_secs(10), || async {
        let answer = cluster
            .post(
                follower,
                "/v1/semaphores/ha",
                &request("after", &[("g", 1, 1)]),
            )
            .await;
        answer.status == 200 && granted(&answer.body) == 1
    })
    .await;
    assert!(served, "the new leader serves");
    for node in [new_leader, cluster.follower_of(new_leader)] {
        let usage = cluster.usage(node, "ha").await;
        assert_eq!(usage["granted"], acknowledged + 1, "node {node}: {usage}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_quorum_answers_no_quorum_with_retry_after() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let survivor = cluster.follower_of(leader);
    let other = cluster
        .nodes
        .iter()
        .map(|node| node.id)
        .find(|id| *id != leader && *id != survivor)
        .unwrap();
    cluster.kill(leader);
    cluster.kill(other);
    // Once its election timeout passes, the survivor knows no leader. (Before
    // that, /readyz already answers 503 `timeout`: the leader it still names
    // cannot be reached.)
    let unready = eventually(Duration::from_secs(10), || async {
        let ready = cluster.get(survivor, "/readyz").await;
        (ready.status, ready.code()) == (503, "no_quorum")
    })
    .await;
    assert!(unready, "the survivor stops being ready");
    let body = request("c", &[("g", 1, 1)]);
    let answer = cluster.post(survivor, "/v1/semaphores/alone", &body).await;
    assert_eq!(
        (answer.status, answer.code()),
        (503, "no_quorum"),
        "{answer:?}"
    );
    assert!(answer.retry_after.is_some(), "with Retry-After");
}

/// A leader that is paused past the election timeout and comes back finds a newer
/// term and steps down: the request parked on it fails at once with 503
/// `leader_changed` and `Retry-After` (a live leader losing leadership, not a kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_leadership_fails_its_waiting_requests_with_leader_changed() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let slow = json!({"roundWaitMs": 60000, "roundPeriodMs": 60000});
    assert_eq!(
        cluster
            .put(leader, "/v1/semaphores/slow/config", &slow)
            .await
            .status,
        200
    );
    // Parked on the leader itself, so the answer comes from the old leader.
    let waiting = {
        let url = format!("{}/v1/semaphores/slow", cluster.node(leader).url());
        let http = cluster.http.clone();
        tokio::spawn(async move {
            let answer = http
                .post(url)
                .json(&request("w", &[("g", 1, 1)]))
                .timeout(Duration::from_secs(40))
                .send()
                .await
                .expect("the old leader answers");
            let retry_after = answer.headers().contains_key("retry-after");
            let status = answer.status().as_u16();
            let body: serde_json::Value = answer.json().await.unwrap_or_default();
            (status, retry_after, body)
        })
    };
    wait_for_pending(&cluster, leader, 1).await;
    let pid = Pid::from_raw(cluster.node(leader).pid().expect("running") as i32);
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    // The others elect a new leader while this one is frozen.
    let others: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|node| node.id)
        .filter(|id| *id != leader)
        .collect();
    let elected = eventually(Duration::from_secs(15), || async {
        for id in &others {
            if let Some(status) = cluster.status(*id).await {
                let new_leader = status["leader"].as_u64();
                if new_leader.is_some() && new_leader != Some(leader) {
                    return true;
                }
            }
        }
        false
    })
    .await;
    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    assert!(elected, "the other two elected a new leader");
    let (status, retry_after, body) = waiting.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "leader_changed", "{body}");
    assert!(retry_after, "with Retry-After");
}

/// A new leader knows nothing of its followers' logs and searches them from
/// its oldest entry; a follower whose vote said it holds a run gets an empty
/// probe for it instead of the run (`node/src/raft/peer_logs.rs`). The cluster
/// then goes on as before: the new leader grants, the follower applies
/// everything, and the killed node, back, catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_probes_the_runs_its_follower_holds_instead_of_sending_them() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    // Far more entries than one append carries (64), all held by the followers.
    for client in 0..200 {
        let key = format!("run-{}", client % 10);
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
            "/v1/semaphores/after",
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
