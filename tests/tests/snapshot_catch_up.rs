//! A follower that lost its whole data dir catches up from a snapshot while the
//! cluster keeps granting: the leader has purged the log it would need, so only
//! a snapshot can bring it back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use permitd_tests::{eventually, request, Cluster, Settings};

/// Concurrent request loops while the follower is rebuilt.
const LOAD_WORKERS: usize = 8;
/// Keys the load spreads over.
const LOAD_KEYS: usize = 40;
/// Log index the leader must pass before the follower is wiped: beyond every
/// node's first snapshot (500, 625, 750 entries) plus the 50 kept behind it.
const LOG_BEFORE_WIPE: u64 = 900;
/// Longest the rebuilt follower may take to catch up.
const CATCH_UP: Duration = Duration::from_secs(60);

fn load(cluster: &Cluster, leader: u64, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    for worker in 0..LOAD_WORKERS {
        let (http, url) = (cluster.http.clone(), cluster.node(leader).url());
        let (stop, sent) = (stop.clone(), sent.clone());
        tokio::spawn(async move {
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let key = (worker + round * LOAD_WORKERS) % LOAD_KEYS;
                let body = request(&format!("load-{worker}"), &[("g", 1, 1)]);
                let _ = http
                    .post(format!("{url}/v1/semaphores/load-{key}"))
                    .json(&body)
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
                sent.fetch_add(1, Ordering::Relaxed);
                round += 1;
            }
        });
    }
}

async fn log_index(cluster: &Cluster, id: u64, field: &str) -> u64 {
    cluster
        .status(id)
        .await
        .and_then(|status| status[field].as_u64())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_restarted_empty_catches_up_from_a_snapshot_under_load() {
    let settings = Settings {
        raft_toml: "log_kept_after_snapshot = 50\n".into(),
        ..Settings::default()
    };
    let mut cluster = Cluster::start(settings).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let (stop, sent) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    load(&cluster, leader, stop.clone(), sent.clone());

    let logged = eventually(Duration::from_secs(120), || async {
        log_index(&cluster, leader, "lastLogIndex").await >= LOG_BEFORE_WIPE
    })
    .await;
    assert!(logged, "the load reached index {LOG_BEFORE_WIPE}");

    cluster.kill(follower);
    let data_dir = cluster.dir.path().join(format!("data/node-{follower}"));
    std::fs::remove_dir_all(&data_dir).expect("the follower's data dir is deleted");
    let restarted = Instant::now();
    cluster.restart(follower);
    let target = log_index(&cluster, leader, "lastLogIndex").await;
    let caught_up = eventually(CATCH_UP, || async {
        log_index(&cluster, follower, "lastApplied").await >= target
    })
    .await;
    let took = restarted.elapsed();
    assert!(caught_up, "the rebuilt follower reached index {target}");
    eprintln!(
        "rebuilt follower caught up to index {target} in {} ms under load ({} requests sent)",
        took.as_millis(),
        sent.load(Ordering::Relaxed)
    );
    stop.store(true, Ordering::Relaxed);

    let log = std::fs::read_to_string(cluster.dir.path().join(format!("node-{follower}.log")))
        .expect("the follower's log");
    assert!(
        log.contains("installing snapshot"),
        "the follower caught up from a snapshot"
    );
    let snapshots = std::fs::read_dir(data_dir.join("snapshots"))
        .expect("the follower keeps the snapshot as a file")
        .count();
    assert!(snapshots >= 1);
    // Once the load stopped, the rebuilt follower keeps up with the tip: it
    // applies everything the leader had applied by then. (Comparing all nodes for
    // equality at one instant races entries still in flight, e.g. reclaim passes.)
    let tip = log_index(&cluster, leader, "lastApplied").await;
    let in_step = eventually(Duration::from_secs(20), || async {
        log_index(&cluster, follower, "lastApplied").await >= tip
    })
    .await;
    assert!(in_step, "the rebuilt follower applied the log up to {tip}");
}
