//! The leader and its term hold, with the shipped timings, through what a
//! healthy cluster meets (issue 25, "a test with the shipped timings"): bursts
//! of large requests, a snapshot build at 100,000 keys, a flood of metrics
//! scrapes, a follower paused and resumed, and a minute of mixed load.
//!
//! Every cluster here starts from the repository's `cluster.toml`
//! ([`Settings::shipped`]: its whole `[raft]` table, heartbeats every 40 ms,
//! elections 120–240 ms, RPCs 1 s, and its `[limits]` and `[defaults]`), not
//! the harness's test timings, so the test follows the file. Each scenario
//! starts its own cluster, one scenario at a time, reads the leader and term
//! every node agrees on, runs its work, and fails if any node ends on another
//! term or leader, or if the work itself did not succeed.
//!
//! At several shards (`PERMITD_TEST_SHARDS`) every node leads some shards and
//! follows the others: the paused follower's scenario loads only keys of the
//! shards the paused node follows and requires that those keep their leader
//! and term (the shards it leads fail over while it sleeps, as they should).
//! The other scenarios read the leader and term of `/cluster/status`, the meta
//! shard's.
//!
//! Three scenarios are `#[ignore]`d in the debug run of `cargo test`: the
//! bursts, the 100,000 keys and the mixed load need a release binary on a
//! two-core machine (debug nodes decode megabytes several times slower and
//! starve each other). `./test.sh` runs them last, on a release build, with
//! `PERMITD_BIN=$CARGO_TARGET_DIR/release/permitd ... -- --ignored`.
//!
//! Sizes and durations, for longer runs: `SHIPPED_TIMINGS_BURSTS` (default 2;
//! the issue's target is 10), `SHIPPED_TIMINGS_CALLERS` (120),
//! `SHIPPED_TIMINGS_KEYS` (100,000), `SHIPPED_TIMINGS_SCRAPE_SECONDS` (10),
//! `SHIPPED_TIMINGS_PAUSES` (2), `SHIPPED_TIMINGS_MIXED_SECONDS` (60),
//! `SHIPPED_TIMINGS_MIXED_LARGE` (8 large requests every few seconds of it; 0
//! for none).
//! `PERMITD_KEEP_DIRS=1` keeps the node logs of a failed run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use permitd_tests::{eventually_seen, request, Cluster, Settings, SNAPSHOT_EVERY_LOGS};
use serde_json::{json, Value};

/// One scenario at a time: each runs three nodes, and two at once on a small
/// machine would measure each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

/// `(node, leader, term)` as every node reports them.
async fn views(cluster: &Cluster) -> Vec<(u64, Option<u64>, Option<u64>)> {
    let mut seen = Vec::new();
    for node in &cluster.nodes {
        let status = cluster.status(node.id).await.unwrap_or(Value::Null);
        seen.push((node.id, status["leader"].as_u64(), status["term"].as_u64()));
    }
    seen
}

/// The leader and term every node agrees on.
async fn agreed_leader_and_term(cluster: &Cluster) -> (u64, u64) {
    let (agreed, seen) = eventually_seen(Duration::from_secs(30), || async {
        let seen = views(cluster).await;
        let first = (seen[0].1, seen[0].2);
        let agreed = first.0.is_some()
            && first.1.is_some()
            && seen.iter().all(|view| (view.1, view.2) == first);
        (agreed, seen)
    })
    .await;
    assert!(agreed, "the nodes agree on a leader and term: {seen:?}");
    (seen[0].1.expect("agreed"), seen[0].2.expect("agreed"))
}

/// Per node: pre-votes asked and answered, stalls of the node's own runtime,
/// leader changes seen.
async fn raft_counters(cluster: &Cluster) -> String {
    let mut lines = Vec::new();
    for node in &cluster.nodes {
        let mut line = format!("node {}:", node.id);
        for name in [
            "permitd_raft_prevotes_total",
            "permitd_raft_stalls_total",
            "permitd_leader_changes_total",
        ] {
            let value = cluster.metric_total(node.id, name).await.unwrap_or(0.0);
            line.push_str(&format!(" {name}={value}"));
        }
        lines.push(line);
    }
    lines.join("; ")
}

/// The lines of every node's log about votes, elections and stalls (the last
/// 20 per node), for a failure's message.
fn election_log(cluster: &Cluster) -> String {
    let mut text = String::new();
    for node in &cluster.nodes {
        let log = cluster.dir.path().join(format!("node-{}.log", node.id));
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = log
            .lines()
            .filter(|line| {
                let line = line.to_ascii_lowercase();
                ["vote", "elect", "term", "stall", "leader"]
                    .iter()
                    .any(|word| line.contains(word))
            })
            .collect();
        text.push_str(&format!("--- node {} ---\n", node.id));
        for line in &lines[lines.len().saturating_sub(20)..] {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// Fails unless every node names `leader` and `term` again once the work is
/// done (a term never goes back, so any election in between shows).
async fn assert_unmoved(cluster: &Cluster, scenario: &str, before: (u64, u64), started: Instant) {
    // A node that names no leader yet (its view after a long silence) is
    // waited for; a new term never comes back to the old one.
    let (settled, seen) = eventually_seen(Duration::from_secs(30), || async {
        let seen = views(cluster).await;
        (seen.iter().all(|view| view.1.is_some()), seen)
    })
    .await;
    let counters = raft_counters(cluster).await;
    eprintln!(
        "{scenario}: leader {} term {} before; after {:?} (node, leader, term); {:.1} s; {counters}",
        before.0,
        before.1,
        seen,
        started.elapsed().as_secs_f64()
    );
    let moved = !settled
        || seen
            .iter()
            .any(|(_, leader, term)| (*leader, *term) != (Some(before.0), Some(before.1)));
    assert!(
        !moved,
        "{scenario}: the leader or term moved: before leader {} term {}, after {seen:?}; \
         {counters}; logs in {}:\n{}",
        before.0,
        before.1,
        cluster.dir.path().display(),
        election_log(cluster)
    );
}

/// Answers by status and error code.
#[derive(Debug, Default)]
struct Tally(BTreeMap<String, u64>);

impl Tally {
    fn count(&mut self, status: u16, body: &Value) {
        let key = match status {
            200 => "200".to_owned(),
            _ => format!("{status} {}", body["error"]["code"].as_str().unwrap_or("")),
        };
        *self.0.entry(key).or_default() += 1;
    }

    fn ok(&self) -> u64 {
        self.0.get("200").copied().unwrap_or(0)
    }

    fn failed(&self) -> u64 {
        self.0.values().sum::<u64>() - self.ok()
    }

    fn merge(&mut self, other: Tally) {
        for (key, count) in other.0 {
            *self.0.entry(key).or_default() += count;
        }
    }
}

/// A grant taken and given back through node `via` every few milliseconds
/// until `stop`, as a steady client would.
fn light_load(
    cluster: &Arc<Cluster>,
    via: u64,
    key: &str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Tally> {
    let cluster = cluster.clone();
    let path = format!("/v1/semaphores/{key}");
    tokio::spawn(async move {
        let mut tally = Tally::default();
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            let client = format!("light-{}", round % 4);
            let answer = cluster
                .post(via, &path, &request(&client, &[("g", 1, round)]))
                .await;
            tally.count(answer.status, &answer.body);
            if let Some(grant_id) = answer.body["grants"][0]["grantId"].as_str() {
                let release = json!({"type": "sync", "v": 1, "clientId": client,
                    "grants": [{"grantId": grant_id, "claimed": 1, "released": 1}]});
                let answer = cluster.post(via, &path, &release).await;
                tally.count(answer.status, &answer.body);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tally
    })
}

/// Ends the loads started with `stop`; their answers.
async fn finish_loads(
    stop: &AtomicBool,
    loads: Vec<tokio::task::JoinHandle<Tally>>,
    what: &str,
) -> Tally {
    stop.store(true, Ordering::Relaxed);
    let mut tally = Tally::default();
    for load in loads {
        tally.merge(load.await.expect("a load task ends"));
    }
    eprintln!("{what}: {:?}", tally.0);
    tally
}

/// Fails unless the load ran and every answer was a 200.
fn assert_all_ok(tally: &Tally, what: &str) {
    assert!(tally.ok() > 0, "{what}: the load ran");
    assert_eq!(
        tally.failed(),
        0,
        "{what}: every answer a 200: {:?}",
        tally.0
    );
}

/// `POST /v1/batch` of one `request` for one permit per key, from `client`;
/// an error unless every item was granted.
async fn request_each(
    cluster: &Cluster,
    via: u64,
    keys: &[String],
    client: &str,
) -> Result<(), String> {
    let items: Vec<Value> = keys
        .iter()
        .map(|key| json!({"key": key, "message": request(client, &[("g", 1, 1)])}))
        .collect();
    let answer = cluster
        .post(via, "/v1/batch", &json!({"v": 1, "items": items}))
        .await;
    if answer.status != 200 {
        return Err(format!("a batch: {} {}", answer.status, answer.body));
    }
    for (key, item) in keys.iter().zip(answer.body["items"].as_array().unwrap()) {
        if item["status"] != 200 || permitd_tests::granted(&item["answer"]) != 1 {
            return Err(format!("{key} in a batch: {item}"));
        }
    }
    Ok(())
}

/// A valid request of ~650 KB: demand for one permit, and the most grant and
/// lease reports a message may carry, of 64-byte ids the cluster never issued
/// (as in `bounded_entries.rs`).
fn large_request(client: &str) -> Vec<u8> {
    const COUNT: u64 = 999_999_999;
    let id = |kind: &str, report: usize| {
        format!("{kind}-{client}-{report:05}-{}", "x".repeat(64))[..64].to_owned()
    };
    let grants: Vec<String> = (0..4_096)
        .map(|report| {
            let id = id("g", report);
            format!(r#"{{"grantId":"{id}","claimed":{COUNT},"released":{COUNT}}}"#)
        })
        .collect();
    let leases: Vec<String> = (0..1_024)
        .map(|report| {
            let id = id("l", report);
            format!(r#"{{"leaseId":"{id}","drawn":{COUNT},"released":{COUNT},"retired":false}}"#)
        })
        .collect();
    format!(
        r#"{{"type":"request","v":1,"clientId":"{client}","demand":[{{"group":"g","count":1,"oldestAt":1}}],"grants":[{}],"leases":[{}]}}"#,
        grants.join(","),
        leases.join(",")
    )
    .into_bytes()
}

/// `bodies` sent at once to `key` on node `via`; the tally of their answers,
/// each 200 counted only if it granted the permit.
async fn large_burst(cluster: &Cluster, via: u64, key: &str, bodies: &[Arc<Vec<u8>>]) -> Tally {
    let config = json!({"limit": 100_000});
    let answer = cluster
        .put(via, &format!("/v1/semaphores/{key}/config"), &config)
        .await;
    let mut tally = Tally::default();
    if answer.status != 200 {
        tally.count(answer.status, &answer.body);
        return tally;
    }
    let url = format!("{}/v1/semaphores/{key}", cluster.node(via).url());
    let calls: Vec<_> = bodies
        .iter()
        .map(|body| {
            let (http, url, body) = (cluster.http.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                let answer = http
                    .post(url)
                    .header("content-type", "application/json")
                    .timeout(Duration::from_secs(120))
                    .body(body.to_vec())
                    .send()
                    .await;
                match answer {
                    Ok(answer) => {
                        let status = answer.status().as_u16();
                        (status, answer.json::<Value>().await.unwrap_or(Value::Null))
                    }
                    Err(error) => (0, json!({"error": {"code": error.to_string()}})),
                }
            })
        })
        .collect();
    for call in calls {
        let (status, body) = call.await.expect("a call task ends");
        let status = if status == 200 && permitd_tests::granted(&body) != 1 {
            299 // answered, but not granted
        } else {
            status
        };
        tally.count(status, &body);
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a release binary (PERMITD_BIN; ./test.sh runs it): debug builds lose the term, \
            120 × 628 KB, term 1 -> 2 to 1 -> 15; release held every run since the Raft runtime, \
            10 bursts in one; docs/operations.md, Tested with these timings"]
async fn bursts_of_large_requests() {
    let _one = ONE_AT_A_TIME.lock().await;
    let bursts = env_or("SHIPPED_TIMINGS_BURSTS", 2);
    let callers = env_or("SHIPPED_TIMINGS_CALLERS", 120) as usize;
    let cluster = Cluster::start(Settings::shipped()).await;
    let before = agreed_leader_and_term(&cluster).await;
    let bodies: Vec<Arc<Vec<u8>>> = tokio::task::spawn_blocking(move || {
        (0..callers)
            .map(|caller| Arc::new(large_request(&format!("big-{caller:04}"))))
            .collect()
    })
    .await
    .unwrap();
    assert!(bodies[0].len() > 600_000, "{} bytes", bodies[0].len());
    let started = Instant::now();
    let mut tallies = Vec::new();
    for burst in 0..bursts {
        let at = Instant::now();
        let tally = large_burst(&cluster, before.0, &format!("burst-{burst}"), &bodies).await;
        eprintln!(
            "burst {burst}: {callers} × {} KB in {:.1} s: {:?}",
            bodies[0].len() / 1000,
            at.elapsed().as_secs_f64(),
            tally.0
        );
        let granted = tally.ok() == callers as u64;
        tallies.push(tally);
        if !granted {
            break;
        }
    }
    // The term first: a failed burst usually means it moved.
    assert_unmoved(&cluster, "bursts", before, started).await;
    for (burst, tally) in tallies.iter().enumerate() {
        assert_eq!(
            tally.ok(),
            callers as u64,
            "burst {burst}: every request granted: {:?}",
            tally.0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a release binary (PERMITD_BIN; ./test.sh runs it): before the Raft runtime \
            term 1 -> 6 in 1 of 4 runs, 300-600 stalls, 72-92 s; release now: term held, 0 \
            stalls, 100,000 keys in 4.2 s, 7.5 s in all"]
async fn snapshot_at_100k_keys() {
    let _one = ONE_AT_A_TIME.lock().await;
    let keys = env_or("SHIPPED_TIMINGS_KEYS", 100_000) as usize;
    let settings = Settings::shipped();
    let settings = Settings {
        // Grants that outlive the test, so that every key stays in the state.
        defaults: settings
            .defaults
            .replace("grantTimeoutMs = 10000", "grantTimeoutMs = 3600000"),
        // The harness's policy, every 500 entries (staggered per node), not the
        // file's 5,000: every node then builds snapshots while the state grows
        // and again at 100,000 keys within seconds. More builds, not fewer.
        snapshot_every_logs: SNAPSHOT_EVERY_LOGS,
        ..settings
    };
    assert!(settings.defaults.contains("grantTimeoutMs = 3600000"));
    let cluster = Arc::new(Cluster::start(settings).await);
    let before = agreed_leader_and_term(&cluster).await;
    let leader = before.0;
    let started = Instant::now();
    // Set by the first batch that fails, or when every node has snapshotted.
    let stop = Arc::new(AtomicBool::new(false));
    // Six workers, each one batch of up to 128 keys (a batch's most) at a time.
    let populate = |client: String| {
        let next = Arc::new(AtomicUsize::new(0));
        let workers: Vec<tokio::task::JoinHandle<Option<String>>> = (0..6)
            .map(|_| {
                let (cluster, next, client, stop) =
                    (cluster.clone(), next.clone(), client.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let first = next.fetch_add(128, Ordering::Relaxed);
                        if first >= keys {
                            return None;
                        }
                        let names: Vec<String> = (first..keys.min(first + 128))
                            .map(|index| format!("k-{index}"))
                            .collect();
                        if let Err(error) = request_each(&cluster, leader, &names, &client).await {
                            stop.store(true, Ordering::Relaxed);
                            return Some(error);
                        }
                    }
                    None
                })
            })
            .collect();
        workers
    };
    let mut failures = Vec::new();
    for worker in populate("first".into()) {
        failures.extend(worker.await.expect("a populate worker"));
    }
    let populated = started.elapsed();
    let target = cluster.last_applied(leader).await.unwrap_or(0);
    // More of the same on the same keys (one more permit each) until every
    // node has built a snapshot of all of them.
    let mut again: Vec<tokio::task::JoinHandle<Option<String>>> = Vec::new();
    let mut pass = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut snapshotted = false;
    while !stop.load(Ordering::Relaxed) {
        if again.iter().all(|worker| worker.is_finished()) {
            for worker in again.drain(..) {
                failures.extend(worker.await.expect("a populate worker"));
            }
            pass += 1;
            again = populate(format!("again-{pass}"));
        }
        let mut all = true;
        for node in &cluster.nodes {
            let index = cluster
                .metric_total(node.id, "permitd_snapshot_index")
                .await;
            all &= index.is_some_and(|index| index >= target as f64);
        }
        snapshotted = all;
        if all || Instant::now() > deadline {
            stop.store(true, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for worker in again {
        failures.extend(worker.await.expect("a populate worker"));
    }
    let (mut builds, mut helds) = (Vec::new(), Vec::new());
    for node in &cluster.nodes {
        let held = cluster.metric(node.id, "permitd_keys_held").await;
        let count = cluster
            .metric(node.id, "permitd_snapshot_build_seconds_count")
            .await;
        let sum = cluster
            .metric(node.id, "permitd_snapshot_build_seconds_sum")
            .await;
        let bytes = cluster.metric(node.id, "permitd_snapshot_bytes").await;
        builds.push(format!(
            "node {}: {held:?} keys, {count:?} builds, {sum:?} s in all, last {bytes:?} bytes",
            node.id
        ));
        helds.push(held);
    }
    eprintln!(
        "{keys} keys populated in {:.1} s (to entry {target}), {pass} more passes; {}",
        populated.as_secs_f64(),
        builds.join("; ")
    );
    assert_unmoved(&cluster, "snapshot at 100k keys", before, started).await;
    assert_eq!(failures, Vec::<String>::new(), "every key granted");
    assert!(
        snapshotted,
        "every node built a snapshot after entry {target}"
    );
    for held in helds {
        assert_eq!(held, Some(keys as f64), "every node holds every key");
    }
}

/// Scrapers back to back on every node (`SHIPPED_TIMINGS_SCRAPERS`, 6 by
/// default: ~20-40 scrapes a second), beside a light load. With 24 the term
/// held too (2 of 2 runs), but the light load got 503 `no_quorum`: an entry
/// waited past the 3 s commit timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_flood() {
    let _one = ONE_AT_A_TIME.lock().await;
    let seconds = env_or("SHIPPED_TIMINGS_SCRAPE_SECONDS", 10);
    let cluster = Arc::new(Cluster::start(Settings::shipped()).await);
    let before = agreed_leader_and_term(&cluster).await;
    let leader = before.0;
    // 1,000 keys: each has its own series (the most that do), so a scrape is
    // as long as it gets, and every scrape walks every key.
    for chunk in 0..8 {
        let keys: Vec<String> = (chunk * 125..(chunk + 1) * 125)
            .map(|index| format!("scraped-{index}"))
            .collect();
        request_each(&cluster, leader, &keys, "scraped")
            .await
            .expect("every key granted");
    }
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let loads = vec![light_load(&cluster, leader, "steady", stop.clone())];
    let scrapes = Arc::new(AtomicUsize::new(0));
    let scrapers: Vec<_> = (0..env_or("SHIPPED_TIMINGS_SCRAPERS", 6) as usize)
        .map(|scraper| {
            let (cluster, scrapes) = (cluster.clone(), scrapes.clone());
            let id = cluster.nodes[scraper % cluster.nodes.len()].id;
            let url = format!("{}/metrics", cluster.node(id).url());
            tokio::spawn(async move {
                let until = Instant::now() + Duration::from_secs(seconds);
                let mut bytes = 0;
                while Instant::now() < until {
                    let answer = cluster.http.get(&url).send().await.expect("a scrape");
                    assert_eq!(answer.status(), 200, "a scrape of node {id}");
                    bytes += answer.bytes().await.expect("the scrape's body").len();
                    scrapes.fetch_add(1, Ordering::Relaxed);
                }
                bytes
            })
        })
        .collect();
    let mut bytes = 0;
    for scraper in scrapers {
        bytes += scraper.await.expect("a scraper ends");
    }
    let tally = finish_loads(&stop, loads, "light load during the scrapes").await;
    eprintln!(
        "{} scrapes in {seconds} s, {} MB",
        scrapes.load(Ordering::Relaxed),
        bytes / 1_000_000
    );
    assert_unmoved(&cluster, "scrape flood", before, started).await;
    assert_all_ok(&tally, "light load during the scrapes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_follower() {
    let _one = ONE_AT_A_TIME.lock().await;
    let pauses = env_or("SHIPPED_TIMINGS_PAUSES", 2);
    let cluster = Arc::new(Cluster::start(Settings::shipped()).await);
    // The node never paused: at one shard the leader, at several the meta
    // shard's (its followers are paused in turn).
    let (leader, _) = agreed_leader_and_term(&cluster).await;
    let followers: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|node| node.id)
        .filter(|&id| id != leader)
        .collect();
    let mut tally = Tally::default();
    for pause in 0..pauses {
        let follower = followers[pause as usize % followers.len()];
        // Only the shards the paused node follows (at one shard, the
        // cluster's one group): those it leads fail over while it sleeps, as
        // they should.
        let followed: Vec<(u32, u64, u64)> = (0..)
            .zip(cluster.shard_leaders_and_terms().await)
            .filter(|(_, (leader, _))| *leader != follower)
            .map(|(shard, (leader, term))| (shard, leader, term))
            .collect();
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let loads = followed
            .iter()
            .map(|&(shard, leader, _)| {
                let key = cluster.key_in_shard("steady", shard);
                light_load(&cluster, leader, &key, stop.clone())
            })
            .collect();
        cluster.pause(follower, true);
        // Well past the lease plus an election timeout (360–480 ms): the
        // paused node's timer is overdue when it wakes.
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.pause(follower, false);
        let back = cluster
            .wait_caught_up(follower, Duration::from_secs(10))
            .await;
        assert!(back, "pause {pause}: node {follower} caught up");
        let what = format!("light load during pause {pause} (node {follower})");
        let this_pause = finish_loads(&stop, loads, &what).await;
        let scenario = format!("paused follower, pause {pause} (node {follower})");
        assert_shards_unmoved(&cluster, &scenario, &followed, started).await;
        assert_all_ok(&this_pause, &what);
        tally.merge(this_pause);
        // The shards the paused node led go back to it (at several shards)
        // before the next pause, from the steady state.
        cluster.wait_spread().await;
    }
    assert_all_ok(&tally, "light load during the pauses");
}

/// [`assert_unmoved`] for the shards in `before` (`(shard, leader, term)`):
/// fails unless every node names the same leader and term of each once the
/// work is done.
async fn assert_shards_unmoved(
    cluster: &Cluster,
    scenario: &str,
    before: &[(u32, u64, u64)],
    started: Instant,
) {
    let view_of = |views: &[(u64, Vec<Value>)]| -> Vec<(u64, u32, Option<u64>, Option<u64>)> {
        let mut seen = Vec::new();
        for (id, view) in views {
            for &(shard, _, _) in before {
                let status = view.get(shard as usize).cloned().unwrap_or_default();
                seen.push((
                    *id,
                    shard,
                    status["leader"].as_u64(),
                    status["term"].as_u64(),
                ));
            }
        }
        seen
    };
    // A node that names no leader yet (its view after a long silence) is
    // waited for; a new term never comes back to the old one.
    let (settled, seen) = eventually_seen(Duration::from_secs(30), || async {
        let seen = view_of(&cluster.shard_views().await);
        let complete = seen.len() == cluster.nodes.len() * before.len();
        (complete && seen.iter().all(|view| view.2.is_some()), seen)
    })
    .await;
    let counters = raft_counters(cluster).await;
    eprintln!(
        "{scenario}: (shard, leader, term) before {before:?}; after {seen:?} (node, shard, \
         leader, term); {:.1} s; {counters}",
        started.elapsed().as_secs_f64()
    );
    let moved = !settled
        || seen.iter().any(|(_, shard, leader, term)| {
            let (_, was_leader, was_term) = before
                .iter()
                .find(|(was, _, _)| was == shard)
                .expect("a shard of before");
            (*leader, *term) != (Some(*was_leader), Some(*was_term))
        });
    assert!(
        !moved,
        "{scenario}: a leader or term moved: before {before:?} (shard, leader, term), after \
         {seen:?} (node, shard, leader, term); {counters}; logs in {}:\n{}",
        cluster.dir.path().display(),
        election_log(cluster)
    );
}

/// Batches of requests and releases on 64 keys, one after another, through
/// node `via`, until `stop`.
fn batch_load(
    cluster: &Arc<Cluster>,
    via: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Tally> {
    let cluster = cluster.clone();
    tokio::spawn(async move {
        let mut tally = Tally::default();
        let keys: Vec<String> = (0..64).map(|index| format!("mixed-{index}")).collect();
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            let items: Vec<Value> = keys
                .iter()
                .map(|key| json!({"key": key, "message": request("batcher", &[("g", 1, round)])}))
                .collect();
            let answer = cluster
                .post(via, "/v1/batch", &json!({"v": 1, "items": items}))
                .await;
            tally.count(answer.status, &answer.body);
            let mut releases = Vec::new();
            for (key, item) in keys
                .iter()
                .zip(answer.body["items"].as_array().into_iter().flatten())
            {
                tally.count(item["status"].as_u64().unwrap_or(0) as u16, &item["error"]);
                for grant in item["answer"]["grants"].as_array().into_iter().flatten() {
                    releases.push(json!({"key": key, "message": {"type": "sync", "v": 1,
                        "clientId": "batcher", "grants": [{"grantId": grant["grantId"],
                        "claimed": grant["permits"], "released": grant["permits"]}]}}));
                }
            }
            if !releases.is_empty() {
                let answer = cluster
                    .post(via, "/v1/batch", &json!({"v": 1, "items": releases}))
                    .await;
                tally.count(answer.status, &answer.body);
            }
        }
        tally
    })
}

/// Reads until `stop`: metrics, usage, the key listing and status of every
/// node, and a key configuration written now and then.
fn reader_load(cluster: &Arc<Cluster>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Tally> {
    let cluster = cluster.clone();
    tokio::spawn(async move {
        let mut tally = Tally::default();
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            let id = cluster.nodes[round as usize % cluster.nodes.len()].id;
            for path in [
                "/metrics",
                "/v1/semaphores/mixed-1/usage",
                "/v1/semaphores",
                "/cluster/status",
            ] {
                let answer = cluster
                    .http
                    .get(format!("{}{path}", cluster.node(id).url()))
                    .send()
                    .await;
                let status = answer.map(|answer| answer.status().as_u16()).unwrap_or(0);
                // Which read failed, by path (a scrape's body is not JSON).
                tally.count(status, &json!({"error": {"code": path}}));
            }
            let config = json!({"limit": 100 + round % 10});
            let answer = cluster
                .put(
                    id,
                    &format!("/v1/semaphores/config-{}/config", round % 50),
                    &config,
                )
                .await;
            tally.count(answer.status, &answer.body);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tally
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a release binary (PERMITD_BIN; ./test.sh runs it): debug nodes starve each \
            other on 2 cores (1 of 2 debug minutes held); release held the term 4 of 4 minutes and 30 minutes (4.57 million \
            calls, all 200); docs/operations.md, Tested with these timings"]
async fn mixed_load_one_minute() {
    let _one = ONE_AT_A_TIME.lock().await;
    let seconds = env_or("SHIPPED_TIMINGS_MIXED_SECONDS", 60);
    let cluster = Arc::new(Cluster::start(Settings::shipped()).await);
    let before = agreed_leader_and_term(&cluster).await;
    let leader = before.0;
    let follower = cluster.follower_of(leader);
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let loads = vec![
        light_load(&cluster, leader, "steady", stop.clone()),
        // Forwarded by a follower to the leader.
        light_load(&cluster, follower, "forwarded", stop.clone()),
        batch_load(&cluster, leader, stop.clone()),
        reader_load(&cluster, stop.clone()),
    ];
    // Every few seconds, a burst of large requests (8 by default;
    // `SHIPPED_TIMINGS_MIXED_LARGE=0` leaves them out).
    let large_callers = env_or("SHIPPED_TIMINGS_MIXED_LARGE", 8);
    let bodies: Vec<Arc<Vec<u8>>> = (0..large_callers)
        .map(|caller| Arc::new(large_request(&format!("mixed-big-{caller}"))))
        .collect();
    let mut large = Tally::default();
    let mut burst = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        if bodies.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        large.merge(large_burst(&cluster, leader, &format!("mixed-big-{burst}"), &bodies).await);
        burst += 1;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    eprintln!("large requests: {:?}", large.0);
    let tally = finish_loads(&stop, loads, "mixed load").await;
    assert_unmoved(&cluster, "mixed load", before, started).await;
    assert_eq!(
        large.failed(),
        0,
        "every large request granted: {:?}",
        large.0
    );
    assert_all_ok(&tally, "mixed load");
}
