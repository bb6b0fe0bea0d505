//! A node back from a pause never deposes a healthy leader (the election guard's
//! pre-vote, `node/src/raft/election_guard.rs`), with the shipped timings
//! (`cluster.toml`: heartbeats every 40 ms, elections 120–240 ms, which the
//! harness uses by default).
//!
//! Before the guard, a follower SIGSTOPped for 2 s took the leadership on 7 of
//! 7 tries. `STEADY_LEADER_PAUSES` sets how many pauses (default 5; the note of
//! the change that added this ran 20).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use permitd_tests::{eventually, request, Cluster, Settings};
use serde_json::json;

/// How long each pause lasts: well past the leader lease plus the election
/// timeout (360–480 ms), so the paused node's election timer is overdue when it
/// wakes.
const PAUSE: Duration = Duration::from_secs(2);

fn signal(cluster: &Cluster, id: u64, signal: Signal) {
    let pid = cluster.node(id).pid().expect("the node runs");
    kill(Pid::from_raw(pid as i32), signal).expect("signal the node");
}

/// The leader and term a node reports.
async fn leader_and_term(cluster: &Cluster, id: u64) -> (Option<u64>, Option<u64>) {
    let status = cluster.status(id).await.unwrap_or_default();
    (status["leader"].as_u64(), status["term"].as_u64())
}

/// Light load on the leader until `stop`: a grant taken and given back every
/// few milliseconds. Counts answers and 503s.
fn light_load(
    cluster: &Arc<Cluster>,
    leader: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64)> {
    let cluster = cluster.clone();
    tokio::spawn(async move {
        let (mut answered, mut unavailable) = (0, 0);
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            let client = format!("light-{}", round % 4);
            let answer = cluster
                .post(
                    leader,
                    "/v1/semaphores/steady",
                    &request(&client, &[("g", 1, round)]),
                )
                .await;
            match answer.status {
                200 => answered += 1,
                503 => unavailable += 1,
                other => panic!("unexpected answer {other}: {}", answer.body),
            }
            if let Some(grant_id) = answer.body["grants"][0]["grantId"].as_str() {
                let release = json!({"type": "sync", "v": 1, "clientId": client,
                    "grants": [{"grantId": grant_id, "claimed": 1, "released": 1}]});
                match cluster
                    .post(leader, "/v1/semaphores/steady", &release)
                    .await
                    .status
                {
                    200 => answered += 1,
                    503 => unavailable += 1,
                    other => panic!("unexpected answer {other} to a release"),
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (answered, unavailable)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_back_from_a_pause_never_takes_the_leadership() {
    let pauses: u64 = std::env::var("STEADY_LEADER_PAUSES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(5);
    let cluster = Arc::new(Cluster::start(Settings::default()).await);
    let leader = cluster.wait_for_leader().await;
    let (_, term) = leader_and_term(&cluster, leader).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = light_load(&cluster, leader, stop.clone());
    let followers: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|node| node.id)
        .filter(|&id| id != leader)
        .collect();
    let caught_up = AtomicU64::new(0);
    for pause in 0..pauses {
        let follower = followers[pause as usize % followers.len()];
        signal(&cluster, follower, Signal::SIGSTOP);
        tokio::time::sleep(PAUSE).await;
        signal(&cluster, follower, Signal::SIGCONT);
        let back = eventually(Duration::from_secs(10), || async {
            let (seen_leader, _) = leader_and_term(&cluster, follower).await;
            let theirs = cluster.status(follower).await.unwrap_or_default();
            let ours = cluster.status(leader).await.unwrap_or_default();
            seen_leader.is_some() && theirs["lastApplied"] == ours["lastApplied"]
        })
        .await;
        assert!(back, "pause {pause}: node {follower} did not catch up");
        caught_up.fetch_add(1, Ordering::Relaxed);
        for id in [leader, follower] {
            assert_eq!(
                leader_and_term(&cluster, id).await,
                (Some(leader), term),
                "pause {pause}: node {id} names another leader or term after node {follower} came back"
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (answered, unavailable) = load.await.unwrap();
    eprintln!(
        "{} pauses, leader {leader} kept term {term:?}; light load: {answered} answered, {unavailable} unavailable",
        caught_up.load(Ordering::Relaxed)
    );
    assert!(answered > 0, "the load ran");
    assert_eq!(unavailable, 0, "no request saw a leader change");
}
