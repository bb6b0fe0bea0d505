//! `DELETE /v1/semaphores/{key}` and `permitctl config delete` against a real
//! three-node cluster: an idle configured key, a key in use (409, nothing
//! changes, no entry), a forced delete (holders released, events in every
//! node's log, usage zero), and a delete replayed by `requestId` or retried
//! without one. A delete while requests wait for the key's round, or that
//! commits together with one, is a scenario of the simulator
//! (`sim/tests/scenarios/delete_key.rs`).

use std::time::Duration;

use permitd_tests::{eventually, Answer, Cluster, Settings};
use reqwest::Method;
use serde_json::{json, Value};

/// The cluster defaults of [`Settings::default`]: a deleted key runs with these.
const DEFAULT_LIMIT: u64 = 100;

async fn delete(cluster: &Cluster, node: u64, key: &str, query: &str) -> Answer {
    let path = format!("/v1/semaphores/{key}{query}");
    cluster.call(node, Method::DELETE, &path, None).await
}

async fn last_log_index(cluster: &Cluster, node: u64) -> Value {
    cluster.status(node).await.expect("status")["lastLogIndex"].clone()
}

async fn listed_keys(cluster: &Cluster, node: u64) -> Vec<String> {
    let listing = cluster.get(node, "/v1/semaphores").await;
    assert_eq!(listing.status, 200, "{}", listing.body);
    listing.body["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|entry| entry["key"].as_str().expect("key").to_owned())
        .collect()
}

/// Waits until every node's log shows `count` lines naming `event` for `key`.
async fn every_node_logged(cluster: &Cluster, event: &str, key: &str, count: usize) {
    for node in &cluster.nodes {
        let log = cluster.dir.path().join(format!("node-{}.log", node.id));
        let seen = eventually(Duration::from_secs(10), || {
            let log = log.clone();
            async move {
                std::fs::read_to_string(&log).is_ok_and(|text| {
                    let lines = text
                        .lines()
                        .filter(|line| line.contains(event) && line.contains(key));
                    lines.count() == count
                })
            }
        })
        .await;
        assert!(seen, "node {} logged {count} {event} of {key}", node.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_key_goes_a_key_in_use_is_refused_and_force_releases_its_holders() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);

    // Idle, with settings of its own: deleted, it follows the defaults.
    let config = json!({"limit": 7, "roundWaitMs": 20, "roundPeriodMs": 20});
    let answer = cluster
        .put(follower, "/v1/semaphores/idle/config", &config)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let group = json!({"limit": 2, "permitted": true});
    let answer = cluster
        .put(follower, "/v1/semaphores/idle/groups/g", &group)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(listed_keys(&cluster, follower)
        .await
        .contains(&"idle".to_owned()));
    let deleted = cluster.permitctl(&["--json", "config", "delete", "idle"]);
    assert!(deleted.success, "{deleted:?}");
    let deleted = deleted.json();
    assert_eq!(deleted["existed"], true, "{deleted}");
    assert_eq!(
        deleted["released"],
        json!({"grants": 0, "leases": 0, "permits": 0})
    );
    let config = cluster.get(follower, "/v1/semaphores/idle/config").await;
    assert_eq!(config.body["limit"], DEFAULT_LIMIT, "{}", config.body);
    assert!(!listed_keys(&cluster, leader)
        .await
        .contains(&"idle".to_owned()));
    // A retry after it applied (no requestId): 200, and nothing was there.
    let again = delete(&cluster, follower, "idle", "").await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["existed"], false, "{}", again.body);
    let table = cluster.permitctl(&["config", "delete", "idle"]);
    assert!(
        table.success && table.stdout.contains("nothing was kept"),
        "{table:?}"
    );
    every_node_logged(&cluster, "key_deleted", "idle", 1).await;

    // In use: refused before anything enters the log, and nothing changes.
    let config = json!({"limit": 10, "roundWaitMs": 20, "roundPeriodMs": 20});
    let answer = cluster
        .put(follower, "/v1/semaphores/busy/config", &config)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    cluster.take(follower, "busy", "runner-a", 4).await;
    cluster.take(leader, "busy", "runner-b", 3).await;
    let holders = cluster.get(leader, "/v1/semaphores/busy/holders").await;
    let dropped_grant = holders.body["clients"]["runner-a"]["grants"][0]["grantId"].clone();
    let before = last_log_index(&cluster, leader).await;
    let refused = delete(&cluster, follower, "busy", "").await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert_eq!(refused.code(), "key_in_use");
    let message = refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("2 grants") && message.contains("force=true"),
        "{message}"
    );
    assert_eq!(last_log_index(&cluster, leader).await, before, "no entry");
    let ctl = cluster.permitctl(&["config", "delete", "busy"]);
    assert!(!ctl.success && ctl.stderr.contains("key_in_use"), "{ctl:?}");
    assert_eq!(cluster.usage(leader, "busy").await["granted"], 7);
    let config = cluster.get(follower, "/v1/semaphores/busy/config").await;
    assert_eq!(config.body["limit"], 10, "the settings stay");

    // Forced: every holder released as a force release does, then the key goes.
    let forced = cluster.permitctl(&["--json", "config", "delete", "busy", "--force"]);
    assert!(forced.success, "{forced:?}");
    let forced = forced.json();
    assert_eq!(forced["existed"], true);
    assert_eq!(forced["clients"], 2);
    assert_eq!(
        forced["released"],
        json!({"grants": 2, "leases": 0, "permits": 7})
    );
    for node in 1..=3 {
        let usage = cluster.usage(node, "busy").await;
        assert_eq!(
            (usage["granted"].as_u64(), usage["limit"].as_u64()),
            (Some(0), Some(DEFAULT_LIMIT))
        );
    }
    every_node_logged(&cluster, "client_released", "busy", 2).await;
    every_node_logged(&cluster, "key_deleted", "busy", 1).await;
    // A runner that was not dead after all: its report frees nothing twice.
    let sync = json!({"type": "sync", "v": 1, "clientId": "runner-a",
        "grants": [{"grantId": dropped_grant, "claimed": 4, "released": 4}]});
    let answer = cluster.post(follower, "/v1/semaphores/busy", &sync).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(cluster.usage(leader, "busy").await["granted"], 0);
    let holders = cluster.get(leader, "/v1/semaphores/busy/holders").await;
    assert_eq!(holders.body["clients"], json!({}), "{}", holders.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_replayed_by_request_id_gets_its_first_answer_and_changes_nothing() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    cluster.take(leader, "replayed", "first", 2).await;
    let query = "?force=true&requestId=delete-1";
    let first = delete(&cluster, follower, "replayed", query).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["released"]["permits"], 2);

    // The key is used again; a replay through either node, with or without
    // force, answers as the first time and releases nothing.
    cluster.take(follower, "replayed", "second", 3).await;
    for (node, query) in [(follower, query), (leader, "?requestId=delete-1")] {
        let replay = delete(&cluster, node, "replayed", query).await;
        assert_eq!(replay.status, 200, "{}", replay.body);
        assert_eq!(replay.body, first.body, "identical answer");
    }
    assert_eq!(cluster.usage(leader, "replayed").await["granted"], 3);
    every_node_logged(&cluster, "key_deleted", "replayed", 1).await;

    // A retry without the requestId is a delete of its own: the key is in use.
    let retry = delete(&cluster, follower, "replayed", "").await;
    assert_eq!(retry.status, 409, "{}", retry.body);
    // A requestId of another key is that key's own.
    let other = delete(&cluster, follower, "elsewhere", "?requestId=delete-1").await;
    assert_eq!(other.status, 200, "{}", other.body);
    assert_eq!(other.body["existed"], false);
    // Bad input is refused at the edge, naming the field.
    let long = "r".repeat(129);
    let bad = delete(
        &cluster,
        follower,
        "replayed",
        &format!("?requestId={long}"),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.body["error"]["field"], "requestId");
    let bad = delete(&cluster, follower, "replayed", "?force=maybe").await;
    assert_eq!(bad.status, 400, "{}", bad.body);
}
