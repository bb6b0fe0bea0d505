//! A leader cut off from its followers answers instead of holding requests (the
//! finding "a leader cut off from its followers keeps parked requests and both
//! entry slots until the partition heals"): once an entry has not committed for
//! `[limits] commit_timeout_ms`, its callers and everything waiting get 503
//! `no_quorum` with `Retry-After`, new requests get it at once, and service
//! resumes when the followers are back.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use permitd_tests::{eventually, request, Cluster, Settings};

const COMMIT_TIMEOUT_MS: u64 = 1_000;
/// Room for a loaded machine on top of the commit timeout.
const SLACK: Duration = Duration::from_secs(3);

fn signal(cluster: &Cluster, id: u64, signal: Signal) {
    let pid = cluster.node(id).pid().expect("running");
    kill(Pid::from_raw(pid as i32), signal).expect("signal sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_its_followers_answers_no_quorum_within_the_commit_timeout() {
    let settings = Settings {
        extra_toml: format!("[limits]\ncommit_timeout_ms = {COMMIT_TIMEOUT_MS}\n"),
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let leader = cluster.wait_for_leader().await;
    let path = "/v1/semaphores/k";
    let answer = cluster
        .post(leader, path, &request("a", &[("g", 1, 1)]))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);

    let followers: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|node| node.id)
        .filter(|id| *id != leader)
        .collect();
    for id in &followers {
        signal(&cluster, *id, Signal::SIGSTOP);
    }
    let deadline = Duration::from_millis(COMMIT_TIMEOUT_MS) + SLACK;
    let started = Instant::now();
    let stuck = cluster
        .post(leader, path, &request("b", &[("g", 1, 1)]))
        .await;
    let waited = started.elapsed();
    assert_eq!(
        (stuck.status, stuck.code()),
        (503, "no_quorum"),
        "{}",
        stuck.body
    );
    assert!(stuck.retry_after.is_some(), "503 carries Retry-After");
    assert!(waited < deadline, "answered after {waited:?}");
    // While the leader stays cut off, a new request is refused at once, not parked.
    let started = Instant::now();
    let refused = cluster
        .post(leader, path, &request("c", &[("g", 1, 1)]))
        .await;
    assert_eq!(
        (refused.status, refused.code()),
        (503, "no_quorum"),
        "{}",
        refused.body
    );
    assert!(
        started.elapsed() < SLACK,
        "refused after {:?}",
        started.elapsed()
    );

    for id in &followers {
        signal(&cluster, *id, Signal::SIGCONT);
    }
    // The stuck entry commits (or a new leader takes over): requests are granted again.
    let served = eventually(Duration::from_secs(20), || async {
        for node in &cluster.nodes {
            let answer = cluster
                .post(node.id, path, &request("d", &[("g", 1, 1)]))
                .await;
            if answer.status == 200 {
                return true;
            }
        }
        false
    })
    .await;
    assert!(served, "service resumes once the followers are back");
}

/// A read confirms the leadership with a quorum, and openraft gives each
/// confirmation one heartbeat interval. Followers silent for a few hundred
/// milliseconds (busy with large appends, here SIGSTOPped) must not make a
/// leader that still leads answer a read `503 no_quorum`: the leader asks
/// again, for up to a second (before: 503 after ~40 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_outlasts_a_short_silence_of_the_followers() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let path = "/v1/semaphores/k/usage";
    cluster.take(leader, "k", "a", 1).await;
    let followers = cluster.followers_of(leader);
    for &id in &followers {
        signal(&cluster, id, Signal::SIGSTOP);
    }
    let read = cluster.get(leader, path);
    let resume = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        for &id in &followers {
            signal(&cluster, id, Signal::SIGCONT);
        }
    };
    let (answer, ()) = tokio::join!(read, resume);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["granted"], 1, "{}", answer.body);
}
