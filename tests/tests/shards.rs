//! A cluster of several shards, end to end on real processes: every key's
//! calls reach its shard's leader from any node, leaders spread over the
//! voters, calls that name no key cover every shard, the meta shard's
//! defaults and tokens reach every shard, a backup of S shards restores into
//! S′, and a node's death moves only the shards it led.

use std::collections::BTreeMap;
use std::time::Duration;

use permitd_core::shard::shard_of;
use permitd_tests::{eventually_seen, granted, request, Cluster, Settings};
use reqwest::Method;
use serde_json::{json, Value};

const SHARDS: u32 = 3;

fn sharded(shards: u32) -> Settings {
    Settings {
        shards: Some(shards),
        // Long claim deadlines: a grant restored from a backup is still held.
        defaults: "limit = 100\nroundWaitMs = 5\nroundPeriodMs = 20\ngrantTimeoutMs = 600000\n"
            .into(),
        ..Settings::default()
    }
}

/// Every shard's leader, once each voter leads its preferred shards
/// (`leader/handover.rs`: shard k prefers the (k mod 3)-th voter).
async fn spread_leaders(cluster: &Cluster) -> BTreeMap<u32, u64> {
    (0..).zip(cluster.wait_spread().await).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_reaches_its_shard_and_keyless_calls_cover_every_shard() {
    let cluster = Cluster::start(sharded(SHARDS)).await;
    let leaders = spread_leaders(&cluster).await;
    let keys = permitd_tests::cluster::keys_covering_shards("acct", 30, SHARDS);

    // Any node takes any key's call; its shard's leader answers.
    for (i, key) in keys.iter().enumerate() {
        let via = (i as u64 % 3) + 1;
        let answer = cluster
            .post(
                via,
                &format!("/v1/semaphores/{key}"),
                &request("c1", &[("g", 2, 1)]),
            )
            .await;
        assert_eq!(answer.status, 200, "{key} via {via}: {}", answer.body);
        assert_eq!(granted(&answer.body), 2);
        let shard = shard_of(key, SHARDS).unwrap();
        assert_eq!(answer.shard, Some(shard), "{key}");
        assert_eq!(answer.leader, Some(leaders[&shard]), "{key}");
    }

    // The listing pages through every shard's keys in key order.
    let mut listed = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let query = match &after {
            Some(after) => format!("/v1/semaphores?limit=7&after={after}"),
            None => "/v1/semaphores?limit=7".into(),
        };
        let page = cluster.get(2, &query).await;
        assert_eq!(page.status, 200, "{}", page.body);
        for key in page.body["keys"].as_array().unwrap() {
            assert_eq!(key["usage"]["granted"], 2, "{key}");
            listed.push(key["key"].as_str().unwrap().to_owned());
        }
        match page.body["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(listed, keys, "every key once, in order");

    // A batch over every shard is answered item by item, in order.
    let items: Vec<Value> = keys
        .iter()
        .take(9)
        .enumerate()
        .map(|(i, key)| json!({"key": key, "message": request("c2", &[("g", i as u64 + 1, 1)])}))
        .chain([json!({"key": "bad", "message": {"v": 1, "type": "bogus"}})])
        .collect();
    let batch = cluster
        .post(3, "/v1/batch", &json!({"v": 1, "items": items}))
        .await;
    assert_eq!(batch.status, 200, "{}", batch.body);
    let answers = batch.body["items"].as_array().unwrap();
    assert_eq!(answers.len(), 10);
    for (i, answer) in answers.iter().take(9).enumerate() {
        assert_eq!(answer["status"], 200, "{answer}");
        assert_eq!(
            granted(&answer["answer"]),
            i as u64 + 1,
            "item {i} in place"
        );
    }
    assert_eq!(answers[9]["status"], 400, "{}", answers[9]);

    backup_and_restore_into_another_shard_count(&cluster, &keys).await;
}

/// A backup of every shard, restored into a new cluster of two shards: every
/// key's usage as it was.
async fn backup_and_restore_into_another_shard_count(cluster: &Cluster, keys: &[String]) {
    let backup = cluster.get(1, "/cluster/snapshot").await;
    assert_eq!(backup.status, 200, "{}", backup.body);
    let saved = backup.body["state"]["keys"].as_object().unwrap();
    assert_eq!(saved.len(), keys.len(), "every shard's keys");
    let other = Cluster::start(sharded(2)).await;
    other.wait_for_leader().await;
    let restored = other.post(2, "/cluster/restore", &backup.body).await;
    assert_eq!(restored.status, 200, "{}", restored.body);
    assert_eq!(restored.body["restoredKeys"], keys.len());
    for key in keys {
        let before = cluster.usage(1, key).await;
        let after = other.usage(3, key).await;
        assert_eq!(before, after, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_and_tokens_of_the_meta_shard_reach_every_shard() {
    let cluster = Cluster::start(sharded(SHARDS)).await;
    spread_leaders(&cluster).await;
    let keys = permitd_tests::cluster::keys_covering_shards("acct", 30, SHARDS);
    let one_per_shard: Vec<&String> = (0..SHARDS)
        .map(|shard| {
            keys.iter()
                .find(|key| shard_of(key, SHARDS).unwrap() == shard)
                .unwrap()
        })
        .collect();

    let changed = cluster
        .put(2, "/cluster/defaults", &json!({"limit": 7}))
        .await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    for key in &one_per_shard {
        let (copied, seen) = eventually_seen(Duration::from_secs(10), || async {
            let config = cluster
                .get(3, &format!("/v1/semaphores/{key}/config"))
                .await;
            (config.body["limit"] == 7, config.body)
        })
        .await;
        assert!(copied, "{key}'s shard took the new default: {seen}");
    }

    let created = cluster
        .post(
            3,
            "/v1/tokens",
            &json!({"name": "runner", "role": "runner", "keys": ["acct-*"], "clientIds": ["runner-*"]}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let token = created.body["token"].as_str().unwrap().to_owned();
    for key in &one_per_shard {
        let (served, seen) = eventually_seen(Duration::from_secs(10), || async {
            let path = format!("/v1/semaphores/{key}");
            let body = request("runner-1", &[("g", 1, 1)]);
            let answer = cluster
                .call_as(Some(&token), 1, Method::POST, &path, Some(&body))
                .await;
            (answer.status == 200, answer.body)
        })
        .await;
        assert!(served, "{key}'s shard leader knows the token: {seen}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_moves_only_its_shards_and_takes_them_back() {
    let mut cluster = Cluster::start(sharded(SHARDS)).await;
    let leaders = spread_leaders(&cluster).await;
    let keys = permitd_tests::cluster::keys_covering_shards("acct", 30, SHARDS);
    // Shard 2 is node 3's; the keys of the other shards keep answering.
    let dead_shard = 2;
    let victim = leaders[&dead_shard];
    let survivor_keys: Vec<&String> = keys
        .iter()
        .filter(|key| shard_of(key, SHARDS).unwrap() != dead_shard)
        .collect();
    let dead_key = keys
        .iter()
        .find(|key| shard_of(key, SHARDS).unwrap() == dead_shard)
        .unwrap();
    cluster.kill(victim);
    let started = std::time::Instant::now();
    let mut other_calls = 0;
    let mut dead_shard_served = None;
    while started.elapsed() < Duration::from_secs(10) && dead_shard_served.is_none() {
        for key in survivor_keys.iter().take(6) {
            let answer = cluster
                .post(
                    1,
                    &format!("/v1/semaphores/{key}"),
                    &request("c3", &[("g", 1, 1)]),
                )
                .await;
            assert_eq!(
                answer.status, 200,
                "{key} while node {victim} is dead: {}",
                answer.body
            );
            other_calls += 1;
        }
        let answer = cluster
            .post(
                2,
                &format!("/v1/semaphores/{dead_key}"),
                &request("c3", &[("g", 1, 1)]),
            )
            .await;
        if answer.status == 200 {
            dead_shard_served = Some(started.elapsed());
        }
    }
    let served_after = dead_shard_served.expect("the dead node's shard serves again");
    assert!(other_calls > 0);
    eprintln!("shard {dead_shard} served again after {served_after:?}; {other_calls} calls to the other shards all answered");

    cluster.restart(victim);
    let back = spread_leaders(&cluster).await;
    assert_eq!(back[&dead_shard], victim, "the node took its shard back");
}

/// Every shard of the cluster quiet: each led by a node that counts it in
/// `permitd_quiet_shards` (`node/src/raft/quiescence.rs`).
async fn all_quiet(cluster: &Cluster) {
    let (quiet, seen) = eventually_seen(Duration::from_secs(30), || async {
        let mut total = 0.0;
        for id in 1..=3 {
            total += cluster
                .metric(id, "permitd_quiet_shards")
                .await
                .unwrap_or(0.0);
        }
        (total == f64::from(SHARDS), total)
    })
    .await;
    assert!(quiet, "{seen} of {SHARDS} shards quiet");
}

/// Idle shards go quiet (no heartbeats; one liveness exchange per pair of
/// nodes stands for them: `node/src/raft/liveness.rs`). A write to a quiet
/// shard is answered and the shard goes quiet again after it; a node
/// restarted while the shards it follows are quiet finds their leaders (the
/// exchanges carry its wakes), and those leaders keep their terms: the other
/// follower counts the liveness claims as its leader heard, so it refuses the
/// restarted node's pre-votes as it did when heartbeats came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_shards_go_quiet_and_wake_for_a_write_or_a_restarted_follower() {
    let mut cluster = Cluster::start(sharded(SHARDS)).await;
    let leaders = spread_leaders(&cluster).await;
    all_quiet(&cluster).await;
    let before = cluster.shard_leaders_and_terms().await;

    for shard in 0..SHARDS {
        let key = cluster.key_in_shard("quiet", shard);
        let answer = cluster
            .post(
                2,
                &format!("/v1/semaphores/{key}"),
                &request("c1", &[("g", 1, 1)]),
            )
            .await;
        assert_eq!(answer.status, 200, "{key}: {}", answer.body);
        assert_eq!(granted(&answer.body), 1, "{key}");
    }
    all_quiet(&cluster).await;

    // Node 1 leads shard 0 and follows the others.
    let restarted = leaders[&0];
    cluster.kill(restarted);
    cluster.restart(restarted);
    let found = cluster
        .wait_caught_up(restarted, Duration::from_secs(30))
        .await;
    assert!(found, "node {restarted} names every shard's leader again");
    spread_leaders(&cluster).await;
    all_quiet(&cluster).await;
    let after = cluster.shard_leaders_and_terms().await;
    for shard in (0..SHARDS as usize).filter(|shard| leaders[&(*shard as u32)] != restarted) {
        assert_eq!(
            after[shard], before[shard],
            "shard {shard}, quiet while node {restarted} restarted, kept its leader and term"
        );
    }
    let mut wakes = 0.0;
    for id in 1..=3 {
        wakes += cluster
            .metric(id, "permitd_liveness_wakes_total")
            .await
            .unwrap_or(0.0);
    }
    eprintln!("before {before:?} after {after:?} wakes {wakes}");
    assert!(wakes > 0.0, "the restarted node's answers woke its shards");
}
