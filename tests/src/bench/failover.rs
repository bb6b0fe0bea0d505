//! Failover: SIGKILL the leader, then ask the survivors for a grant until one
//! answers; the time from the kill to that first grant is one sample. The
//! killed node is restarted and caught up before the next kill, so every kill
//! starts from a healthy three-node cluster.

use std::time::{Duration, Instant};

use permitd_core::contract::protocol::SemaphoreResponse;
use serde_json::json;

use super::grant::bench_http;
use super::stats::{last_log_index, ms, quantile, set_key_config};
use crate::Cluster;

/// Longest a failover may take before the sample is given up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);
/// Limit of one probe request.
const PROBE_TIMEOUT: Duration = Duration::from_millis(400);
/// Pause between two failed probes.
const PROBE_PAUSE: Duration = Duration::from_millis(2);
/// Longest a restarted node may take to catch up.
const CATCH_UP: Duration = Duration::from_secs(30);

/// What the kills measured.
#[derive(Debug, Clone, Default)]
pub struct FailoverResult {
    pub kills: usize,
    pub ms_p50: f64,
    pub ms_max: f64,
    pub samples_ms: Vec<f64>,
}

/// `kills` leader kills on `cluster`.
pub async fn run(cluster: &mut Cluster, kills: usize) -> FailoverResult {
    let key = "failover";
    let leader = cluster.wait_for_leader().await;
    let config = json!({"limit": 1_000_000, "roundWaitMs": 1, "roundPeriodMs": 1,
        "grantTimeoutMs": 1_000});
    set_key_config(cluster, leader, key, &config).await;
    let http = bench_http(cluster);
    let mut samples_ms = Vec::with_capacity(kills);
    for kill in 0..kills {
        let leader = cluster.wait_for_leader().await;
        let survivors: Vec<String> = cluster
            .nodes
            .iter()
            .filter(|node| node.id != leader && node.is_running())
            .map(|node| format!("{}/v1/semaphores/{key}", node.url()))
            .collect();
        let killed_at = Instant::now();
        cluster.kill(leader);
        let Some(took) = first_grant(&http, &survivors, killed_at, kill).await else {
            eprintln!("failover {kill}: no grant within {GIVE_UP_AFTER:?}");
            break;
        };
        samples_ms.push(ms(took));
        cluster.restart(leader);
        cluster.wait_healthy().await;
        catch_up(cluster, leader).await;
    }
    let mut sorted = samples_ms.clone();
    FailoverResult {
        kills: samples_ms.len(),
        ms_p50: quantile(&mut sorted, 0.5),
        ms_max: sorted.last().copied().unwrap_or(f64::NAN),
        samples_ms,
    }
}

/// Probes the survivors in turn until one grants; the time since `killed_at`.
async fn first_grant(
    http: &reqwest::Client,
    survivors: &[String],
    killed_at: Instant,
    kill: usize,
) -> Option<Duration> {
    let demand_at = permitd_client::client::now_ms();
    let request = super::one_permit(format!("failover-{kill}"), demand_at, Vec::new());
    let body = serde_json::to_vec(&request).expect("protocol values serialise");
    for attempt in 0usize.. {
        if killed_at.elapsed() > GIVE_UP_AFTER {
            return None;
        }
        let url = &survivors[attempt % survivors.len()];
        let answer = http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(PROBE_TIMEOUT)
            .body(body.clone())
            .send()
            .await;
        if let Ok(answer) = answer {
            if answer.status().is_success() {
                let bytes = answer.bytes().await.unwrap_or_default();
                if let Ok(SemaphoreResponse::Grant(grant)) = serde_json::from_slice(&bytes) {
                    if !grant.grants.is_empty() {
                        return Some(killed_at.elapsed());
                    }
                }
            }
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    None
}

/// Waits until the restarted node has applied what the leader had logged.
async fn catch_up(cluster: &Cluster, restarted: u64) {
    let leader = cluster.wait_for_leader().await;
    let target = last_log_index(cluster, leader).await;
    let deadline = Instant::now() + CATCH_UP;
    while Instant::now() < deadline {
        let applied = cluster
            .status(restarted)
            .await
            .and_then(|status| status["lastApplied"].as_u64())
            .unwrap_or(0);
        if applied >= target {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let heartbeats settle so the next kill starts from a steady cluster.
    tokio::time::sleep(Duration::from_millis(300)).await;
}
