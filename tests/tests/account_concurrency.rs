//! The account-concurrency example end to end over HTTP ("account A may run 10
//! jobs at once, its workflow wf-capped at most 3"): one key per account,
//! workflow caps as group limits, a workflow that is not permitted, cumulative
//! reports, and the claim-deadline reclaim. The scenario runs as named phases.

use std::time::Duration;

use permitd_tests::{eventually, granted, request, Cluster, Settings};
use serde_json::{json, Value};

const KEY: &str = "account-42";

fn grant_of<'a>(answer: &'a Value, group: &str) -> &'a Value {
    answer["grants"]
        .as_array()
        .and_then(|grants| grants.iter().find(|grant| grant["group"] == group))
        .unwrap_or_else(|| panic!("no grant for {group} in {answer}"))
}

fn blocked_reason(answer: &Value, group: &str) -> Option<String> {
    answer["blocked"].as_array().and_then(|blocked| {
        blocked
            .iter()
            .find(|entry| entry["group"] == group)
            .and_then(|entry| entry["reason"].as_str().map(str::to_owned))
    })
}

async fn configure(cluster: &Cluster, leader: u64) {
    let config =
        json!({"limit": 10, "roundWaitMs": 300, "roundPeriodMs": 20, "grantTimeoutMs": 2000});
    let answer = cluster
        .put(leader, &format!("/v1/semaphores/{KEY}/config"), &config)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["limit"], 10);
    let capped = cluster
        .put(
            leader,
            &format!("/v1/semaphores/{KEY}/groups/wf-capped"),
            &json!({"limit": 3}),
        )
        .await;
    assert_eq!(capped.status, 200, "{}", capped.body);
    let off = cluster
        .put(
            leader,
            &format!("/v1/semaphores/{KEY}/groups/wf-off"),
            &json!({"permitted": false}),
        )
        .await;
    assert_eq!(off.status, 200, "{}", off.body);
}

/// The phases share one cluster and one account; each takes what the previous
/// left (the answers of the first round, the account's usage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_limits_workflow_caps_reports_and_reclaim() {
    let cluster = Cluster::start(Settings::default()).await;
    // The node that runs the account's rounds: its shard's leader.
    let leader = cluster.key_leader(KEY).await;
    let follower = cluster.follower_of(leader);
    configure(&cluster, leader).await;
    let (a, b) = one_round_shares_the_account_limit(&cluster, leader, follower).await;
    every_node_reports_the_same_usage(&cluster).await;
    reports_free_capacity_once_and_only_for_their_owner(&cluster, leader, follower, &a).await;
    the_reclaim_timer_returns_unclaimed_permits(&cluster, leader, follower).await;
    a_late_claim_of_a_reclaimed_grant_finds_nothing(&cluster, follower, &b).await;
    the_freed_room_goes_to_the_next_runner(&cluster, follower).await;
}

fn semaphore_path() -> String {
    format!("/v1/semaphores/{KEY}")
}

/// Two runners ask within one round wait; runner-a's work is older. Returns
/// both answers.
async fn one_round_shares_the_account_limit(
    cluster: &Cluster,
    leader: u64,
    follower: u64,
) -> (Value, Value) {
    let path = semaphore_path();
    let runner_a = request(
        "runner-a",
        &[("wf-capped", 5, 1_000), ("wf-open", 4, 1_000)],
    );
    let runner_b = request("runner-b", &[("wf-open", 10, 2_000), ("wf-off", 1, 2_000)]);
    let (a, b) = tokio::join!(
        cluster.post(leader, &path, &runner_a),
        cluster.post(follower, &path, &runner_b)
    );
    assert_eq!((a.status, b.status), (200, 200), "{} {}", a.body, b.body);
    assert_eq!(b.leader, Some(leader), "the follower names the leader");
    assert_eq!(grant_of(&a.body, "wf-capped")["permits"], 3);
    assert_eq!(
        blocked_reason(&a.body, "wf-capped").as_deref(),
        Some("group_limit")
    );
    assert_eq!(grant_of(&a.body, "wf-open")["permits"], 4);
    assert_eq!(grant_of(&b.body, "wf-open")["permits"], 3);
    assert_eq!(blocked_reason(&b.body, "wf-open").as_deref(), Some("limit"));
    assert_eq!(
        blocked_reason(&b.body, "wf-off").as_deref(),
        Some("not_permitted")
    );
    assert_eq!(
        granted(&a.body) + granted(&b.body),
        10,
        "exactly the account limit"
    );
    let fence = grant_of(&a.body, "wf-open")["fence"].as_u64().unwrap();
    assert_eq!(
        grant_of(&b.body, "wf-open")["fence"].as_u64(),
        Some(fence),
        "one round"
    );
    (a.body, b.body)
}

async fn every_node_reports_the_same_usage(cluster: &Cluster) {
    for node in [1, 2, 3] {
        let usage = cluster.usage(node, KEY).await;
        assert_eq!(usage["granted"], 10, "node {node}: {usage}");
        assert_eq!(usage["available"], 0);
        assert_eq!(
            usage["groups"]["wf-capped"],
            json!({"granted": 3, "limit": 3})
        );
        assert_eq!(usage["groups"]["wf-open"], json!({"granted": 7}));
    }
}

/// runner-a reports: the capped work finished, the open work runs. The same
/// report again frees nothing twice; another client's report is unknown.
async fn reports_free_capacity_once_and_only_for_their_owner(
    cluster: &Cluster,
    leader: u64,
    follower: u64,
    a: &Value,
) {
    let path = semaphore_path();
    let capped_id = grant_of(a, "wf-capped")["grantId"].clone();
    let open_id = grant_of(a, "wf-open")["grantId"].clone();
    let sync = json!({"type": "sync", "v": 1, "clientId": "runner-a", "grants": [
        {"grantId": capped_id, "claimed": 3, "released": 3},
        {"grantId": open_id, "claimed": 4, "released": 0}]});
    let synced = cluster.post(follower, &path, &sync).await;
    assert_eq!(synced.status, 200, "{}", synced.body);
    assert_eq!(synced.body["type"], "synced");
    let statuses: Vec<&str> = synced.body["grantResults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|result| result["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["ok", "ok"]);
    assert_eq!(cluster.post(leader, &path, &sync).await.status, 200);
    let stolen = json!({"type": "sync", "v": 1, "clientId": "runner-b", "grants": [
        {"grantId": open_id, "claimed": 4, "released": 4}]});
    let stolen = cluster.post(leader, &path, &stolen).await;
    assert_eq!(stolen.body["grantResults"][0]["status"], "not_found");
    assert_eq!(cluster.usage(follower, KEY).await["granted"], 7);
}

/// runner-b never claims its grant: the reclaim timer returns it, with no
/// request from anyone (the log grows by a reclaim entry, and a follower's
/// gauge, refreshed only when an entry touching the key applies, drops).
async fn the_reclaim_timer_returns_unclaimed_permits(
    cluster: &Cluster,
    leader: u64,
    follower: u64,
) {
    let shard = cluster.shard_of_key(KEY);
    let index_before = cluster.shard_applied(leader, shard).await;
    assert!(index_before.is_some(), "the leader answers its shard map");
    let reclaimed = eventually(Duration::from_secs(10), || async {
        let metrics = cluster
            .http
            .get(format!("{}/metrics", cluster.node(follower).url()))
            .send()
            .await;
        let Ok(metrics) = metrics else { return false };
        let text = metrics.text().await.unwrap_or_default();
        text.contains(&format!("permitd_key_granted{{key=\"{KEY}\"}} 4"))
    })
    .await;
    assert!(reclaimed, "the follower saw the reclaim entry apply");
    // The follower applied it: the account's shard's log grew by an entry.
    let index_after = cluster.shard_applied(follower, shard).await;
    assert!(index_after > index_before, "a reclaim entry was appended");
    assert_eq!(cluster.usage(leader, KEY).await["granted"], 4);
}

/// With no permit claimed, the reclaim removed runner-b's grant whole.
async fn a_late_claim_of_a_reclaimed_grant_finds_nothing(
    cluster: &Cluster,
    follower: u64,
    b: &Value,
) {
    let late_id = grant_of(b, "wf-open")["grantId"].clone();
    let late = json!({"type": "sync", "v": 1, "clientId": "runner-b", "grants": [
        {"grantId": late_id, "claimed": 3, "released": 0}]});
    let late = cluster.post(follower, &semaphore_path(), &late).await;
    assert_eq!(
        late.body["grantResults"][0]["status"], "not_found",
        "{}",
        late.body
    );
    assert_eq!(late.body["grantResults"][0]["claimed"], 0);
}

async fn the_freed_room_goes_to_the_next_runner(cluster: &Cluster, follower: u64) {
    let next = cluster
        .post(
            follower,
            &semaphore_path(),
            &request("runner-c", &[("wf-open", 10, 3_000)]),
        )
        .await;
    assert_eq!(granted(&next.body), 6, "{}", next.body);
    assert_eq!(
        blocked_reason(&next.body, "wf-open").as_deref(),
        Some("limit")
    );
}
