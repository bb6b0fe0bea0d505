//! Power loss, not only SIGKILL: every node's data dir is on a `powerfs`
//! mount that drops every write not made durable by `fsync`, and every create,
//! rename or unlink not made durable by a directory `fsync`, when the power is
//! cut (`permitd_tests::disks`). After each cut, what the cluster answered
//! with 200 must still hold (`permitd_tests::power_loss`): grants with their
//! fences and `requestId` replays, configurations, tokens. No term may have had
//! two leaders, and each node's applied state must be a replay of its log.
//!
//! Scenarios (one test each, a cluster each):
//! - (a) a follower loses power under load and restarts;
//! - (b) the leader loses power right after answering a round;
//! - (c) all three nodes lose power at once under load, then all restart;
//! - (d) a soak of the three, drawn at random: `POWER_LOSS_ROUNDS` cuts
//!   (default 10; `POWER_LOSS_SEED` replays a run).

use std::time::{SystemTime, UNIX_EPOCH};

use permitd_tests::power_loss::{self, Workload, DEFAULTS};
use permitd_tests::{granted, request, Cluster, Settings};
use serde_json::json;

/// Grant writers running during the cuts.
const WRITERS: usize = 4;
/// Acknowledged grants to wait for between cuts (the cluster is serving again).
const ACKS_BETWEEN_CUTS: usize = 40;
/// Entries between snapshots on a power-loss cluster (several per run).
const SNAPSHOT_EVERY_LOGS: u64 = 60;
/// Cuts the soak makes on one cluster before it checks it and starts another.
const CUTS_PER_CLUSTER: usize = 10;

async fn power_cluster() -> Cluster {
    Cluster::start(Settings {
        defaults: DEFAULTS.into(),
        power_loss_disks: true,
        // Snapshots, purges and a lazily synced state tree all inside each
        // run: the log keeps only a few entries behind a snapshot.
        snapshot_every_logs: SNAPSHOT_EVERY_LOGS,
        raft_toml: "log_kept_after_snapshot = 10\n".into(),
        ..Settings::default()
    })
    .await
}

#[derive(Debug, Clone, Copy)]
enum Cut {
    Follower,
    LeaderAfterAnswer,
    Everyone,
}

/// Cuts the power as `cut` says, restarts the nodes, waits for them to lead
/// and serve again. `seed` decides torn writes.
async fn cut_and_restart(cluster: &mut Cluster, cut: Cut, seed: u64) -> Vec<u64> {
    let leader = cluster.wait_for_leader().await;
    let victims = match cut {
        Cut::Follower => vec![cluster.follower_of(leader)],
        Cut::LeaderAfterAnswer => {
            answer_a_round(cluster, leader, seed).await;
            vec![leader]
        }
        Cut::Everyone => cluster.nodes.iter().map(|node| node.id).collect(),
    };
    let torn = seed.is_multiple_of(2).then_some(seed);
    let reports = cluster.power_loss(&victims, torn);
    eprintln!("power loss {cut:?} on {victims:?}: {reports:?}");
    if victims.len() == 1 && !seed.is_multiple_of(3) {
        // Mostly, the survivors elect (or keep) a leader before the victim is
        // back: a quick restart would let a cut leader resume its own term.
        let next = cluster.wait_for_leader().await;
        eprintln!("leader while node {} was down: {next}", victims[0]);
    }
    for id in &victims {
        cluster.restart(*id);
    }
    cluster.wait_healthy().await;
    cluster.wait_for_leader().await;
    // Every shard led again (with shards, the victim takes its own back).
    cluster.wait_spread().await;
    victims
}

/// One request answered by `leader` itself with a grant, just before its cut.
async fn answer_a_round(cluster: &Cluster, leader: u64, seed: u64) {
    let mut body = request(&format!("last-{seed}"), &[("g", 1, 1)]);
    body["requestId"] = json!(format!("last-{seed}"));
    let answer = cluster.post(leader, "/v1/semaphores/pl-last", &body).await;
    assert_eq!(answer.status, 200, "the leader answers: {:?}", answer.body);
    assert_eq!(granted(&answer.body), 1);
}

/// Runs `cuts` under load, then checks everything the cluster acknowledged,
/// the leaders per term, catch-up and each node's replay.
async fn run(cuts: &[(Cut, u64)]) {
    let mut cluster = power_cluster().await;
    let workload = Workload::start(&cluster, WRITERS);
    assert!(
        workload.wait_for_more(ACKS_BETWEEN_CUTS).await,
        "no grant before the first cut"
    );
    let mut last_answers = Vec::new();
    for (cut, seed) in cuts {
        cut_and_restart(&mut cluster, *cut, *seed).await;
        if let Cut::LeaderAfterAnswer = cut {
            last_answers.push(*seed);
        }
        assert!(
            workload.wait_for_more(ACKS_BETWEEN_CUTS).await,
            "the cluster never served again after {cut:?} (seed {seed})"
        );
    }
    let ledger = workload.stop().await;
    let mut violations = power_loss::check_ledger(&cluster, &ledger).await;
    violations.extend(check_last_answers(&cluster, &last_answers).await);
    assert!(
        power_loss::wait_caught_up(&cluster).await,
        "a restarted node never caught up"
    );
    let ids: Vec<u64> = cluster.nodes.iter().map(|node| node.id).collect();
    violations.extend(power_loss::terms_with_two_leaders(cluster.dir.path(), &ids));
    violations.extend(audit_every_node(&mut cluster).await);
    eprintln!(
        "power loss: {} cuts, {} grants, {} tokens, config {} acknowledged; {} refused; {} violations",
        cuts.len(),
        ledger.grants.lock().unwrap().len(),
        ledger.tokens.lock().unwrap().len(),
        ledger.config_acked.load(std::sync::atomic::Ordering::SeqCst),
        ledger.refused.load(std::sync::atomic::Ordering::Relaxed),
        violations.len()
    );
    assert!(violations.is_empty(), "after {cuts:?}: {violations:#?}");
}

/// The grant each cut leader answered just before its cut is still there.
async fn check_last_answers(cluster: &Cluster, seeds: &[u64]) -> Vec<String> {
    let leader = cluster.wait_for_leader().await;
    let mut violations = Vec::new();
    for seed in seeds {
        let client = format!("last-{seed}");
        let holders = cluster.get(leader, "/v1/semaphores/pl-last/holders").await;
        if holders.body["clients"][&client]["grants"]
            .as_array()
            .map_or(0, Vec::len)
            != 1
        {
            violations.push(format!(
                "the grant the leader answered before its cut ({client}) is gone"
            ));
        }
    }
    violations
}

/// Stops every node and checks its applied state against a replay of its log.
async fn audit_every_node(cluster: &mut Cluster) -> Vec<String> {
    let ids: Vec<u64> = cluster.nodes.iter().map(|node| node.id).collect();
    let mut violations = Vec::new();
    for id in ids {
        cluster.kill(id);
        let dir = cluster.dir.path().join(permitd_tests::disks::data_dir(id));
        let scratch = tempfile::tempdir().unwrap();
        match permitd_storage::audit::check_replay(&dir, scratch.path()).await {
            Ok(audits) => eprintln!("node {id}, shard by shard: {audits:?}"),
            Err(error) => violations.push(format!("node {id}: {error}")),
        }
    }
    violations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_loses_power_under_load() {
    run(&[(Cut::Follower, 1), (Cut::Follower, 2)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_loses_power_right_after_answering() {
    run(&[(Cut::LeaderAfterAnswer, 3), (Cut::LeaderAfterAnswer, 4)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_loses_power_at_once() {
    run(&[(Cut::Everyone, 5), (Cut::Everyone, 6)]).await;
}

/// A mix of cuts, drawn from one seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_soak() {
    let rounds: usize = std::env::var("POWER_LOSS_ROUNDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(10);
    let seed: u64 = std::env::var("POWER_LOSS_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |now| now.as_nanos() as u64)
        });
    eprintln!("POWER_LOSS_SEED={seed} POWER_LOSS_ROUNDS={rounds}");
    let mut state = seed.max(1);
    let cuts: Vec<(Cut, u64)> = (0..rounds)
        .map(|_| {
            // xorshift64: the whole run follows from the seed.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let cut = match state % 3 {
                0 => Cut::Follower,
                1 => Cut::LeaderAfterAnswer,
                _ => Cut::Everyone,
            };
            (cut, state)
        })
        .collect();
    // A fresh cluster per batch keeps the ledger and each key's remembered
    // answers bounded however long the soak runs.
    for batch in cuts.chunks(CUTS_PER_CLUSTER) {
        run(batch).await;
    }
}

/// `permitd serve` with no config, in a working directory on a power-loss disk:
/// its default data dir is the relative `data`, which nothing fsynced into `.`
/// before this test existed. The power is cut right after the first grant is
/// answered (seconds after the first start, before any filesystem would have
/// committed the directory on its own); after the restart the node must have the
/// same admin token and replay the grant's `requestId` with the same answer,
/// not start a new cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_in_a_relative_data_dir_survives_a_power_cut() {
    let root = tempfile::tempdir().unwrap();
    let (backing, mount) = (root.path().join("backing"), root.path().join("disk"));
    std::fs::create_dir_all(&backing).unwrap();
    std::fs::create_dir_all(&mount).unwrap();
    let disk = permitd_powerfs::PowerFs::mount(&backing, &mount).expect("powerfs mounts");
    let api = format!("127.0.0.1:{}", permitd_tests::free_port());
    let raft = format!("127.0.0.1:{}", permitd_tests::free_port());
    let serve = || {
        std::process::Command::new(permitd_tests::permitd_bin())
            .args(["serve", "--api-addr", &api, "--raft-addr", &raft])
            .current_dir(&mount)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("permitd serve starts")
    };
    let url = format!("http://{api}/v1/semaphores/first-start");
    let http = reqwest::Client::new();
    let token_file = mount.join("data").join("admin-token");
    let mut node = serve();
    let token = generated_token(&token_file).await;
    let first = solo_grant(&http, &url, &token).await;
    node.kill().unwrap();
    node.wait().unwrap();
    let report = disk.power_loss(Some(7)).expect("power loss");
    eprintln!("power loss after the first start: {report:?}");
    let token_after = std::fs::read_to_string(&token_file).unwrap_or_default();
    assert_eq!(token_after, token, "the admin token survived the cut");
    let mut node = serve();
    let replayed = solo_grant(&http, &url, &token).await;
    node.kill().unwrap();
    node.wait().unwrap();
    assert_eq!(
        replayed["grants"], first["grants"],
        "the grant answered before the cut is replayed, not granted anew"
    );
}

/// Waits for the embedded node's generated admin token.
async fn generated_token(token_file: &std::path::Path) -> String {
    let generated = permitd_tests::eventually(std::time::Duration::from_secs(20), || async {
        std::fs::read_to_string(token_file).is_ok_and(|token| token.len() >= 32)
    })
    .await;
    assert!(generated, "an admin token was generated");
    std::fs::read_to_string(token_file).unwrap()
}

/// Sends one grant request (client `first`, a fixed `requestId`) until the node
/// answers 200 with a permit; returns the answer.
async fn solo_grant(http: &reqwest::Client, url: &str, token: &str) -> serde_json::Value {
    let mut body = request("first", &[("g", 1, 1)]);
    body["requestId"] = json!("first-grant");
    let (answered, answer) =
        permitd_tests::eventually_seen(std::time::Duration::from_secs(20), || async {
            let answer = http.post(url).bearer_auth(token).json(&body).send().await;
            let Some(answer) = answer.ok().filter(|answer| answer.status() == 200) else {
                return (false, serde_json::Value::Null);
            };
            let body: serde_json::Value = answer.json().await.unwrap_or_default();
            (granted(&body) == 1, body)
        })
        .await;
    assert!(answered, "the embedded node granted a permit: {answer}");
    answer
}
