//! A node back from a pause never deposes a healthy leader (the election guard's
//! pre-vote, `node/src/raft/election_guard.rs`), with the shipped timings
//! (`cluster.toml`: heartbeats every 40 ms, elections 120–240 ms, which the
//! harness uses by default).
//!
//! Before the guard, a follower SIGSTOPped for 2 s took the leadership on 7 of
//! 7 tries. `STEADY_LEADER_PAUSES` sets how many pauses (default 5; the note of
//! the change that added this ran 20).
//!
//! At several shards (`PERMITD_TEST_SHARDS`) every node leads some shards and
//! follows the others, so "a follower" is a follower of some shards: each
//! pause loads only keys of the shards the paused node follows (through their
//! leaders), and requires that those shards keep their leader and term. The
//! shards it leads fail over while it sleeps, as they should, and go back to
//! it (the preferred leader) before the next pause.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use permitd_tests::{request, Cluster, Settings};
use serde_json::json;

/// How long each pause lasts: well past the leader lease plus the election
/// timeout (360–480 ms), so the paused node's election timer is overdue when it
/// wakes.
const PAUSE: Duration = Duration::from_secs(2);

fn signal(cluster: &Cluster, id: u64, signal: Signal) {
    let pid = cluster.node(id).pid().expect("the node runs");
    kill(Pid::from_raw(pid as i32), signal).expect("signal the node");
}

/// The shards `follower` does not lead, each with its leader and the term
/// every node agrees on: the Raft groups in which it is a follower (at one
/// shard, the cluster's one group).
async fn followed_shards(cluster: &Cluster, follower: u64) -> Vec<(u32, u64, u64)> {
    let shards = cluster.shard_leaders_and_terms().await;
    (0..)
        .zip(shards)
        .filter(|(_, (leader, _))| *leader != follower)
        .map(|(shard, (leader, term))| (shard, leader, term))
        .collect()
}

/// Light load until `stop`: on each of `keys` in turn, a grant taken from and
/// given back to the key's shard leader every few milliseconds. Counts
/// answers and 503s.
fn light_load(
    cluster: &Arc<Cluster>,
    keys: Vec<(String, u64)>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64)> {
    let cluster = cluster.clone();
    tokio::spawn(async move {
        let (mut answered, mut unavailable) = (0, 0);
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            let (key, leader) = &keys[round as usize % keys.len()];
            let path = format!("/v1/semaphores/{key}");
            let client = format!("light-{}", round % 4);
            let answer = cluster
                .post(*leader, &path, &request(&client, &[("g", 1, round)]))
                .await;
            match answer.status {
                200 => answered += 1,
                503 => unavailable += 1,
                other => panic!("unexpected answer {other}: {}", answer.body),
            }
            if let Some(grant_id) = answer.body["grants"][0]["grantId"].as_str() {
                let release = json!({"type": "sync", "v": 1, "clientId": client,
                    "grants": [{"grantId": grant_id, "claimed": 1, "released": 1}]});
                match cluster.post(*leader, &path, &release).await.status {
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
    // The node never paused: at one shard the leader, at several the meta
    // shard's (its followers are paused in turn).
    let leader = cluster.wait_for_leader().await;
    let followers: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|node| node.id)
        .filter(|&id| id != leader)
        .collect();
    let (mut answered, mut unavailable) = (0, 0);
    for pause in 0..pauses {
        let follower = followers[pause as usize % followers.len()];
        // Only the shards the paused node follows: those it leads fail over
        // while it sleeps, as they should.
        let followed = followed_shards(&cluster, follower).await;
        let keys = followed
            .iter()
            .map(|&(shard, leader, _)| (cluster.key_in_shard("steady", shard), leader))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let load = light_load(&cluster, keys, stop.clone());
        signal(&cluster, follower, Signal::SIGSTOP);
        tokio::time::sleep(PAUSE).await;
        signal(&cluster, follower, Signal::SIGCONT);
        let back = cluster
            .wait_caught_up(follower, Duration::from_secs(10))
            .await;
        assert!(back, "pause {pause}: node {follower} did not catch up");
        stop.store(true, Ordering::Relaxed);
        let (ok, failed) = load.await.unwrap();
        (answered, unavailable) = (answered + ok, unavailable + failed);
        let views = cluster.shard_views().await;
        for (id, view) in &views {
            for &(shard, shard_leader, term) in &followed {
                let status = view.get(shard as usize).cloned().unwrap_or_default();
                assert_eq!(
                    (status["leader"].as_u64(), status["term"].as_u64()),
                    (Some(shard_leader), Some(term)),
                    "pause {pause}: node {id} names another leader or term of shard {shard} \
                     after node {follower} came back: {views:?}"
                );
            }
        }
        assert_eq!(
            unavailable, 0,
            "pause {pause}: no request saw a leader change"
        );
        let shards: Vec<u32> = followed.iter().map(|(shard, _, _)| *shard).collect();
        eprintln!("pause {pause}: node {follower} paused; shards {shards:?} kept leader and term");
        // The shards the paused node led go back to it (at several shards)
        // before the next pause, from the steady state.
        cluster.wait_spread().await;
    }
    eprintln!(
        "{pauses} pauses of followers of node {leader}, every followed shard kept its leader and \
         term; light load: {answered} answered, {unavailable} unavailable"
    );
    assert!(answered > 0, "the load ran");
    assert_eq!(unavailable, 0, "no request saw a leader change");
}
