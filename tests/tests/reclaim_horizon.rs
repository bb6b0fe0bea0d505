//! Idle keys cost the leader no per-key bookkeeping outside the state, and
//! still behave: a claim deadline beyond `[limits] reclaim_horizon_ms` has no
//! timer when its grant is made, yet a scan arms it as it comes near and the
//! reclaim entry runs with no request; the all-keys usage gauges, added up from
//! the state at each scrape, follow both keys.

use std::time::{Duration, Instant};

use permitd_tests::{eventually, Cluster, Settings};
use serde_json::json;

/// The leader arms only deadlines this close, and scans every half of it.
const HORIZON_MS: u64 = 1_000;
/// The far key's claim deadline: three horizons ahead when its grant is made.
const FAR_TIMEOUT_MS: u64 = 3 * HORIZON_MS;

async fn configure(cluster: &Cluster, leader: u64, key: &str, grant_timeout_ms: u64) {
    let config = json!({"limit": 10, "roundWaitMs": 1, "roundPeriodMs": 1,
        "grantTimeoutMs": grant_timeout_ms});
    let path = format!("/v1/semaphores/{key}/config");
    let answer = cluster.put(leader, &path, &config).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}

async fn metrics(cluster: &Cluster, id: u64) -> String {
    let url = format!("{}/metrics", cluster.node(id).url());
    match cluster.http.get(url).send().await {
        Ok(answer) => answer.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Whether `text` has the sample `line` (a whole line, `name{labels} value`).
fn has_sample(text: &str, line: &str) -> bool {
    text.lines().any(|sample| sample == line)
}

#[tokio::test]
async fn a_deadline_beyond_the_horizon_is_reclaimed_on_time() {
    let cluster = Cluster::start(Settings {
        extra_toml: format!("[limits]\nreclaim_horizon_ms = {HORIZON_MS}\n"),
        ..Settings::default()
    })
    .await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    configure(&cluster, leader, "far", FAR_TIMEOUT_MS).await;
    configure(&cluster, leader, "near-enough", 600_000).await;
    cluster.take(leader, "near-enough", "b", 2).await;
    let granted_at = Instant::now();
    cluster.take(leader, "far", "a", 3).await;

    let totals = eventually(Duration::from_secs(5), || async {
        let text = metrics(&cluster, follower).await;
        has_sample(&text, "permitd_keys_held 2") && has_sample(&text, "permitd_keys_granted 5")
    })
    .await;
    assert!(totals, "the follower's totals add up both keys");

    // The follower's per-key gauge changes only when an entry touching the key
    // applies: here, the leader's reclaim entry (nobody sends a request).
    let reclaimed = eventually(Duration::from_millis(FAR_TIMEOUT_MS + 5_000), || async {
        let text = metrics(&cluster, follower).await;
        has_sample(&text, "permitd_key_granted{key=\"far\"} 0")
    })
    .await;
    assert!(
        reclaimed,
        "the far deadline was reclaimed without a request"
    );
    assert!(
        granted_at.elapsed() >= Duration::from_millis(FAR_TIMEOUT_MS),
        "not before the deadline"
    );
    // Totals are walked at most once a second: a scrape may reuse the last walk.
    let totals_follow = eventually(Duration::from_secs(3), || async {
        has_sample(&metrics(&cluster, follower).await, "permitd_keys_granted 2")
    })
    .await;
    assert!(totals_follow, "{}", metrics(&cluster, follower).await);
    assert_eq!(cluster.usage(leader, "near-enough").await["granted"], 2);
}
