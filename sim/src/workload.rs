//! The simulated job runners: the real Rust client (`permitd-client`) over
//! the simulated network, each acquiring a permit for a job, holding it for a
//! drawn time, and releasing it. Every job is logged for the checker as the
//! client saw it; every call and answer goes into the trace.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use permitd_client::{AcquireOptions, ClientConfig, SemaphoreClient};
use permitd_core::KeyConfigUpdate;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checker::Job;
use crate::net::SimTransport;
use crate::trace::Trace;

/// What the runners of one run do.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    /// Keys and their limits.
    pub keys: Vec<(String, u64)>,
    pub clients: usize,
    pub jobs_per_client: usize,
    /// Every node's API, `host:port`.
    pub endpoints: Vec<String>,
}

/// The jobs every runner logged, shared with the checker.
pub type JobLog = Arc<Mutex<Vec<Job>>>;

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The real client, over the simulated network, with the simulation's clock
/// and random draws seeded from `seed`.
pub fn client(
    spec: &WorkloadSpec,
    seed: u64,
) -> Result<SemaphoreClient, permitd_client::ClientError> {
    let endpoints: Vec<String> = spec
        .endpoints
        .iter()
        .map(|e| format!("http://{e}"))
        .collect();
    let mut config = ClientConfig::new([endpoints.join(",")]);
    config.transport = Some(Arc::new(SimTransport));
    config.seed = Some(seed);
    config.wall_clock = Some(Arc::new(|| {
        turmoil::since_epoch().unwrap_or_default().as_millis() as u64
    }));
    SemaphoreClient::new(config)
}

/// The operator's part: configures every key's limit, retrying until the
/// cluster has a leader that accepts it.
pub async fn configure(spec: WorkloadSpec, seed: u64, trace: Trace) -> turmoil::Result {
    let client = client(&spec, seed)?;
    for (key, limit) in &spec.keys {
        let update = KeyConfigUpdate {
            limit: Some(*limit),
            ..Default::default()
        };
        loop {
            match client.set_key_config(key, &update).await {
                Ok(_) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        trace.event(
            now(),
            "operator",
            format_args!("configured {key} limit {limit}"),
        );
    }
    Ok(())
}

/// One runner: `jobs_per_client` attempts, each on a key drawn from `seed`.
pub async fn run_client(
    name: String,
    seed: u64,
    spec: WorkloadSpec,
    log: JobLog,
    trace: Trace,
) -> turmoil::Result {
    let client = client(&spec, seed)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    // Give the operator's configuration a head start.
    tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
    for attempt in 0..spec.jobs_per_client {
        let (key, _) = &spec.keys[rng.random_range(0..spec.keys.len())];
        let hold = Duration::from_millis(rng.random_range(1..120));
        let options = AcquireOptions {
            // Fixed ids: a random one would order the state machine's maps
            // differently from run to run.
            client_id: Some(format!("{name}-{attempt}")),
            timeout: Some(Duration::from_secs(10)),
        };
        let asked = now();
        let permit = match client.acquire_with(key, "jobs", 1, options).await {
            Ok(permit) => permit,
            Err(error) => {
                trace.event(
                    now(),
                    &name,
                    format_args!("acquire {key} failed: {}", kind_of(&error)),
                );
                tokio::time::sleep(Duration::from_millis(rng.random_range(10..200))).await;
                continue;
            }
        };
        let start = now();
        let fence = permit.fence();
        trace.event(start, &name, format_args!("holds {key} fence {fence}"));
        let index = {
            let mut log = log
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            log.push(Job {
                key: key.clone(),
                client: name.clone(),
                asked,
                start,
                end: None,
                fence,
            });
            log.len() - 1
        };
        tokio::time::sleep(hold).await;
        let end = now();
        log.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[index]
            .end = Some(end);
        match permit.release().await {
            Ok(()) => trace.event(now(), &name, format_args!("released {key}")),
            Err(_) => trace.event(now(), &name, format_args!("release of {key} failed")),
        }
    }
    Ok(())
}

/// A short, stable name for an acquire's failure (messages may carry
/// addresses or ids; the trace must not).
fn kind_of(error: &permitd_client::AcquireError) -> &'static str {
    use permitd_client::AcquireError;
    match error {
        AcquireError::Timeout { .. } => "timeout",
        AcquireError::Cancelled { .. } => "cancelled",
        AcquireError::Client(_) => "client",
        _ => "other",
    }
}
