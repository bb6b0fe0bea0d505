//! Small helpers: quantiles of samples, HTTP calls with the admin token,
//! the leader's log index, a node's leader map and a process's resident memory.

use std::time::{Duration, Instant};

use permitd_core::contract::paths::CLUSTER_SHARDS;
use permitd_core::contract::ShardMap;
use serde_json::Value;

use crate::{Cluster, ADMIN_TOKEN};

/// The `q` quantile (0..=1) of `samples` by nearest rank; `NaN` when empty.
pub fn quantile(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

/// How long a configuration write retries a cluster that is electing.
const CONFIG_RETRY_FOR: Duration = Duration::from_secs(20);

/// `PUT` with the admin token through any node (followers forward); retries
/// 503 (an election) for a while, then panics unless it answers 200.
pub async fn put_admin(cluster: &Cluster, id: u64, path: &str, body: &Value) {
    let url = format!("{}{path}", cluster.node(id).url());
    let deadline = Instant::now() + CONFIG_RETRY_FOR;
    loop {
        let answer = cluster
            .http
            .put(&url)
            .bearer_auth(ADMIN_TOKEN)
            .json(body)
            .send()
            .await
            .expect("node answers");
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        if status.as_u16() == 503 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert!(status.is_success(), "PUT {path}: {status} {text}");
        return;
    }
}

/// `PUT /cluster/defaults` (every key without a config of its own).
pub async fn set_defaults(cluster: &Cluster, leader: u64, defaults: &Value) {
    put_admin(cluster, leader, "/cluster/defaults", defaults).await;
}

/// `PUT /v1/semaphores/{key}/config`; retries 503 for a while, then panics
/// unless it answers 200.
pub async fn set_key_config(cluster: &Cluster, leader: u64, key: &str, config: &Value) {
    let path = format!("/v1/semaphores/{key}/config");
    let deadline = Instant::now() + CONFIG_RETRY_FOR;
    loop {
        let answer = cluster.put(leader, &path, config).await;
        if answer.status == 503 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert_eq!(answer.status, 200, "config of {key}: {}", answer.body);
        return;
    }
}

/// The leader's last log index (0 when it does not answer).
pub async fn last_log_index(cluster: &Cluster, leader: u64) -> u64 {
    cluster
        .status(leader)
        .await
        .and_then(|status| status["lastLogIndex"].as_u64())
        .unwrap_or(0)
}

/// Node `id`'s view of every shard (`GET /cluster/shards`), or `None` when it
/// does not answer.
pub async fn shard_map(cluster: &Cluster, id: u64) -> Option<ShardMap> {
    let map = cluster.admin_get(id, CLUSTER_SHARDS).await?;
    serde_json::from_value(map).ok()
}

/// `VmRSS` of a process, in bytes, from `/proc/<pid>/status`.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Milliseconds in a duration, as a float.
pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
