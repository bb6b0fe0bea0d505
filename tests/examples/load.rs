//! A bounded load run against a fresh three-node cluster on loopback:
//! `cargo run -p permitd-tests --example load -- [seconds] [clients] [keys]`.
//!
//! Every client loops: ask for one permit on one of the keys (through a random
//! node: followers forward), then report it claimed and released in its next
//! request. Prints grants per second, client-side request latency, and the
//! leader's round latency quantiles from its `/metrics` histogram.

use std::time::{Duration, Instant};

use permitd_tests::{granted, Cluster, Settings};
use serde_json::{json, Value};

#[tokio::main]
async fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seconds = args.first().copied().unwrap_or(10).min(120);
    let clients = args.get(1).copied().unwrap_or(32).min(1_000);
    let keys = args.get(2).copied().unwrap_or(8).max(1);
    let settings = Settings {
        nodes: 3,
        defaults: "limit = 100000\nroundWaitMs = 5\nroundPeriodMs = 5\ngrantTimeoutMs = 60000\n"
            .into(),
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let leader = cluster.wait_for_leader().await;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for client in 0..clients {
        let url = cluster.node(1 + client % 3).url();
        let http = cluster.http.clone();
        let key = format!("load-{}", client % keys);
        tasks.push(tokio::spawn(run_client(http, url, key, client, deadline)));
    }
    let mut grants = 0;
    let mut latencies = Vec::new();
    for task in tasks {
        let (count, mut seen) = task.await.expect("client task");
        grants += count;
        latencies.append(&mut seen);
    }
    latencies.sort();
    let quantile = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
    println!(
        "{seconds}s, {clients} clients, {keys} keys: {grants} grants, {:.0} grants/s",
        grants as f64 / seconds as f64
    );
    println!(
        "request latency p50 {:?} p99 {:?} ({} requests)",
        quantile(0.5),
        quantile(0.99),
        latencies.len()
    );
    let metrics = cluster
        .http
        .get(format!("{}/metrics", cluster.node(leader).url()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    for q in [0.5, 0.99] {
        println!(
            "round latency p{:.0} <= {}s (histogram bucket)",
            q * 100.0,
            bucket_quantile(&metrics, q)
        );
    }
}

async fn run_client(
    http: reqwest::Client,
    url: String,
    key: String,
    client: u64,
    deadline: Instant,
) -> (u64, Vec<Duration>) {
    let mut held: Vec<Value> = Vec::new();
    let mut grants = 0;
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        let reports: Vec<Value> = held
            .iter()
            .map(|g| json!({"grantId": g["grantId"], "claimed": g["permits"], "released": g["permits"]}))
            .collect();
        let body = json!({"type": "request", "v": 1, "clientId": format!("client-{client}"),
            "demand": [{"group": "g", "count": 1, "oldestAt": 1}], "grants": reports});
        let started = Instant::now();
        let answer = http
            .post(format!("{url}/v1/semaphores/{key}"))
            .json(&body)
            .send()
            .await;
        let Ok(answer) = answer else { continue };
        let Ok(answer) = answer.json::<Value>().await else {
            continue;
        };
        latencies.push(started.elapsed());
        grants += granted(&answer);
        held = answer["grants"].as_array().cloned().unwrap_or_default();
    }
    (grants, latencies)
}

/// The upper bound of the histogram bucket holding quantile `q`.
fn bucket_quantile(metrics: &str, q: f64) -> String {
    let buckets: Vec<(String, f64)> = metrics
        .lines()
        .filter(|line| line.starts_with("permitd_round_duration_seconds_bucket"))
        .filter_map(|line| {
            let le = line.split("le=\"").nth(1)?.split('"').next()?.to_owned();
            let count = line.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    let total = buckets.last().map_or(0.0, |(_, count)| *count);
    buckets
        .iter()
        .find(|(_, count)| *count >= total * q)
        .map_or_else(|| "?".into(), |(le, _)| le.clone())
}
