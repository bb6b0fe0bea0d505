//! The grant path: clients that ask for one permit per request and report it
//! claimed and released in their next request (no leases), straight to the
//! leader, as fast as answers come back.
//!
//! Every client is one tokio task with its own request loop. Only answers that
//! arrive inside the measurement window (after a warm-up) count; the window's
//! log entries come from the leader's `lastLogIndex`. Round overhead is the
//! client's request latency minus `roundWaitMs`: with one client that is the
//! round itself (queueing, proposal, replication, fsync, apply, HTTP).
//!
//! A client's demand carries its real creation time as `oldestAt` (set when
//! the client starts wanting its next permit, kept until a grant answers it),
//! so rounds serve clients in the order their demand arose. The window's cost
//! ([`super::cpu`]) counts each granted permit as one cycle and every HTTP
//! call the clients send.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use permitd_client::client::now_ms;
use permitd_core::contract::protocol::{
    GrantReport, PermitSync, SemaphoreRequest, SemaphoreResponse, V1,
};
use serde_json::json;

use super::cpu::{Calls, Cost, Window};
use super::stats::{ms, quantile, set_defaults};
use crate::{Cluster, ADMIN_TOKEN};

/// Most requests one client sends in one run, whatever the time.
const MAX_REQUESTS_PER_CLIENT: u64 = 10_000_000;
/// Limit of one HTTP call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// One grant-path run.
#[derive(Debug, Clone)]
pub struct GrantRun {
    pub clients: usize,
    pub keys: usize,
    pub round_wait_ms: u64,
    pub limit: u64,
    pub grant_timeout_ms: u64,
    /// Each request also sends a `sync` with its reports (messages section).
    pub with_syncs: bool,
    pub warmup: Duration,
    pub measure: Duration,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct GrantResult {
    pub permits_per_s: f64,
    pub messages_per_s: f64,
    pub requests_per_s: f64,
    pub syncs_per_s: f64,
    pub entries_per_s: f64,
    pub latency_ms_p50: f64,
    pub latency_ms_p99: f64,
    pub overhead_ms_p50: f64,
    pub overhead_ms_p99: f64,
    pub errors: u64,
    /// CPU, entries and calls per granted permit in the window.
    pub cost: Cost,
}

/// What one client saw inside the window.
#[derive(Debug, Default)]
struct ClientTally {
    permits: u64,
    requests: u64,
    syncs: u64,
    errors: u64,
    latencies_ms: Vec<f64>,
}

/// Runs `run` against `cluster`'s `leader`; `tag` keeps its keys apart.
pub async fn run(cluster: &Cluster, leader: u64, run: &GrantRun, tag: &str) -> GrantResult {
    run_routed(cluster, leader, run, tag, |_| leader).await
}

/// [`run`] with each key's calls sent to the node `route` names for the key
/// (with shards: the key's shard leader, as a client that routes by key
/// would). `leader` takes the defaults and opens the window.
pub async fn run_routed(
    cluster: &Cluster,
    leader: u64,
    run: &GrantRun,
    tag: &str,
    route: impl Fn(&str) -> u64,
) -> GrantResult {
    let wait = run.round_wait_ms;
    set_defaults(
        cluster,
        leader,
        &json!({"limit": run.limit, "roundWaitMs": wait, "roundPeriodMs": wait,
                "grantTimeoutMs": run.grant_timeout_ms}),
    )
    .await;
    let http = bench_http(cluster);
    let started = Instant::now();
    let window_start = started + run.warmup;
    let window_end = window_start + run.measure;
    let calls = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(run.clients);
    for client in 0..run.clients {
        let key = format!("{tag}-{}", client % run.keys);
        let url = cluster.node(route(&key)).url();
        let endpoint = format!("{url}/v1/semaphores/{key}");
        tasks.push(tokio::spawn(client_loop(
            http.clone(),
            endpoint,
            format!("{tag}-client-{client}"),
            run.with_syncs,
            calls.clone(),
            (window_start, window_end),
        )));
    }
    tokio::time::sleep_until(window_start.into()).await;
    let window = Window::open(cluster, leader, Calls::Client(calls)).await;
    tokio::time::sleep_until(window_end.into()).await;
    let cost = window.close(cluster).await;
    let mut total = ClientTally::default();
    for task in tasks {
        let tally = task.await.expect("client task");
        total.permits += tally.permits;
        total.requests += tally.requests;
        total.syncs += tally.syncs;
        total.errors += tally.errors;
        total.latencies_ms.extend(tally.latencies_ms);
    }
    let cost = cost.with_cycles_per_s(total.permits as f64 / run.measure.as_secs_f64());
    summarise(total, run, cost)
}

fn summarise(mut total: ClientTally, run: &GrantRun, cost: Cost) -> GrantResult {
    let seconds = run.measure.as_secs_f64();
    let latency_ms_p50 = quantile(&mut total.latencies_ms, 0.5);
    let latency_ms_p99 = quantile(&mut total.latencies_ms, 0.99);
    let wait = run.round_wait_ms as f64;
    GrantResult {
        permits_per_s: total.permits as f64 / seconds,
        messages_per_s: (total.requests + total.syncs) as f64 / seconds,
        requests_per_s: total.requests as f64 / seconds,
        syncs_per_s: total.syncs as f64 / seconds,
        entries_per_s: cost.entries_per_s(),
        latency_ms_p50,
        latency_ms_p99,
        overhead_ms_p50: latency_ms_p50 - wait,
        overhead_ms_p99: latency_ms_p99 - wait,
        errors: total.errors,
        cost,
    }
}

/// The bench's own HTTP client to `cluster`: pooled keep-alive connections (or
/// HTTP/2, [`super::transport`]), no Nagle.
pub fn bench_http(cluster: &Cluster) -> reqwest::Client {
    // Auth is on in the harness: every bench call carries the admin token.
    let mut headers = reqwest::header::HeaderMap::new();
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let value = reqwest::header::HeaderValue::from_str(&bearer).expect("a header value");
    headers.insert(reqwest::header::AUTHORIZATION, value);
    let builder = reqwest::Client::builder();
    super::transport::transport()
        .http(cluster, builder)
        .default_headers(headers)
        .tcp_nodelay(true)
        .timeout(CALL_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .expect("http client")
}

/// One client: request one permit, report the previous ones claimed and released.
async fn client_loop(
    http: reqwest::Client,
    endpoint: String,
    client_id: String,
    with_syncs: bool,
    calls: Arc<AtomicU64>,
    (window_start, window_end): (Instant, Instant),
) -> ClientTally {
    let mut tally = ClientTally::default();
    let mut held: Vec<GrantReport> = Vec::new();
    // When the demand not yet granted arose (ms since the Unix epoch).
    let mut demand_since: Option<u64> = None;
    for _ in 0..MAX_REQUESTS_PER_CLIENT {
        if Instant::now() >= window_end {
            break;
        }
        let oldest_at = *demand_since.get_or_insert_with(now_ms);
        let request = super::one_permit(client_id.clone(), oldest_at, std::mem::take(&mut held));
        let sent = Instant::now();
        calls.fetch_add(1, Ordering::Relaxed);
        let answer = send(&http, &endpoint, &request).await;
        let done = Instant::now();
        let counted = done >= window_start && done <= window_end;
        let Some(SemaphoreResponse::Grant(grant)) = answer else {
            tally.errors += u64::from(counted);
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        held = grant
            .grants
            .iter()
            .map(|granted| GrantReport {
                grant_id: granted.grant_id.to_string(),
                claimed: granted.permits,
                released: granted.permits,
            })
            .collect();
        if !held.is_empty() {
            demand_since = None;
        }
        if counted {
            tally.requests += 1;
            tally.permits += held.iter().map(|report| report.claimed).sum::<u64>();
            tally.latencies_ms.push(ms(done - sent));
        }
        if with_syncs && !held.is_empty() {
            let sync = SemaphoreRequest::Sync(PermitSync {
                v: V1,
                client_id: client_id.clone(),
                grants: held.clone(),
                leases: None,
            });
            calls.fetch_add(1, Ordering::Relaxed);
            let synced = send(&http, &endpoint, &sync).await;
            let in_window = Instant::now() <= window_end && done >= window_start;
            match synced {
                Some(SemaphoreResponse::Synced(_)) => tally.syncs += u64::from(in_window),
                _ => tally.errors += u64::from(in_window),
            }
        }
    }
    tally
}

async fn send(
    http: &reqwest::Client,
    endpoint: &str,
    message: &SemaphoreRequest,
) -> Option<SemaphoreResponse> {
    let body = serde_json::to_vec(message).expect("protocol values serialise");
    let answer = http
        .post(endpoint)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .ok()?;
    if !answer.status().is_success() {
        return None;
    }
    let bytes = answer.bytes().await.ok()?;
    serde_json::from_slice(&bytes).ok()
}
