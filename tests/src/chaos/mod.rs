//! Chaos testing: a three-node cluster of real `permitd` processes behind Raft
//! proxies ([`proxy`]), job runners on `SemaphoreQueue` over four keys
//! ([`workload`]), a seeded nemesis that kills, pauses, restarts and cuts off
//! nodes ([`nemesis`]), and an independent checker of what actually ran
//! ([`checker`]), which writes a report ([`report`]).
//!
//! [`Profile::from_env`]: without `CHAOS_SECONDS` the bounded CI profile (about
//! two minutes of faults, at least 10 leader kills, 5 pauses, 1 full restart,
//! 2 partitions, 2 follower kills); with it, a soak of that many seconds of
//! faults. `CHAOS_SEED` replays a schedule; the seed is printed at the start as
//! `CHAOS_SEED=<n>` and named in every failure.

pub mod checker;
pub mod nemesis;
pub mod proxy;
pub mod report;
pub mod workload;

use std::sync::Arc;
use std::time::{Duration, Instant};

use checker::{Drained, Findings, Sampler, Violation};
use nemesis::{FaultKind, Nemesis, Schedule};
use proxy::Network;
use report::{KeyReport, Report};
use workload::{JobLog, RunnerHandle, GRANT_TIMEOUT_MS, LEASE_TTL_MS};

use crate::{Cluster, Node, Settings, SECRET};

/// Job runners, each with its own queue and client.
const RUNNERS: usize = 3;
/// Seconds of faults in the CI profile (more if the required faults take longer).
const CI_SECONDS: u64 = 75;
/// The fault phase ends by then whatever is left, in the CI profile.
const CI_FAULT_CAP: Duration = Duration::from_secs(140);
/// How long every enqueued job may take to run once the faults stop.
const JOBS_DRAIN_TIMEOUT: Duration = Duration::from_secs(90);

/// How long and with which seed to run.
#[derive(Debug, Clone)]
pub struct Profile {
    pub seed: u64,
    /// Seconds of faults, at least.
    pub seconds: u64,
    /// `ci` or `soak`.
    pub name: &'static str,
    /// The fault phase ends by then (after the start of the faults).
    pub fault_cap: Duration,
}

impl Profile {
    /// `CHAOS_SEED` (else from the clock) and `CHAOS_SECONDS` (else the CI profile).
    pub fn from_env() -> Self {
        let seed = std::env::var("CHAOS_SEED")
            .ok()
            .map(|text| {
                text.trim()
                    .parse()
                    .expect("CHAOS_SEED is an unsigned integer")
            })
            .unwrap_or_else(|| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                now.as_nanos() as u64 ^ u64::from(std::process::id())
            });
        match std::env::var("CHAOS_SECONDS") {
            Ok(text) => {
                let seconds: u64 = text.trim().parse().expect("CHAOS_SECONDS is a number");
                Self {
                    seed,
                    seconds,
                    name: "soak",
                    fault_cap: Duration::from_secs(seconds + 120),
                }
            }
            Err(_) => Self {
                seed,
                seconds: CI_SECONDS,
                name: "ci",
                fault_cap: CI_FAULT_CAP,
            },
        }
    }
}

/// Runs one chaos test and returns its report (also written to disk). Never
/// panics on a violation: the caller decides.
pub async fn run(profile: Profile) -> Report {
    let seed = profile.seed;
    let origin = Instant::now();
    eprintln!(
        "CHAOS_SEED={seed} (profile {}, {} s of faults)",
        profile.name, profile.seconds
    );
    let specs = workload::key_specs();
    let network = Network::new();
    let cluster = Cluster::start_advertising(Settings::default(), |id, raft_addr| {
        Some(network.front(id, raft_addr))
    })
    .await;
    let endpoints: Vec<String> = cluster.nodes.iter().map(Node::url).collect();
    let admin = workload::chaos_client(endpoints.clone(), SECRET);
    workload::configure(&admin, &specs).await;

    let log = Arc::new(JobLog::new());
    let findings = Arc::new(Findings::default());
    let mut runners: Vec<RunnerHandle> = (0..RUNNERS)
        .map(|index| {
            let client = workload::chaos_client(endpoints.clone(), SECRET);
            RunnerHandle::start(index, client, &specs, log.clone(), seed)
        })
        .collect();
    let sampler = Sampler::start(admin.clone(), specs.clone(), log.clone(), findings.clone());
    // Let the workload reach a steady state before the first fault.
    let warm = Instant::now() + Duration::from_secs(30);
    while log.progress().1 < 50 && Instant::now() < warm {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut nemesis = Nemesis {
        cluster,
        network,
        client: admin.clone(),
        probe_key: specs[0].key.to_string(),
        origin: log.origin,
        records: Vec::new(),
    };
    let mut schedule = Schedule::new(seed);
    let hard_stop = Instant::now() + profile.fault_cap;
    nemesis
        .run(
            &mut schedule,
            Duration::from_secs(profile.seconds),
            hard_stop,
        )
        .await;
    let at_ms = || log.origin.elapsed().as_millis() as u64;
    if nemesis.heal_all().await.is_none() {
        findings.add(Violation {
            kind: "no_recovery",
            key: None,
            at_ms: at_ms(),
            detail: format!(
                "no agreed leader serving reads within {:?} of healing everything",
                nemesis::RECOVERY_TIMEOUT
            ),
        });
    }
    let counts = nemesis.counts();
    for kind in FaultKind::ALL {
        let injected = counts.get(&kind).copied().unwrap_or(0);
        if injected < nemesis::required(kind) {
            findings.add(Violation {
                kind: "profile_incomplete",
                key: None,
                at_ms: at_ms(),
                detail: format!(
                    "{} injected {injected} times, the profile needs {}",
                    kind.name(),
                    nemesis::required(kind)
                ),
            });
        }
    }

    // Drain: no new work; every enqueued job must run and end.
    for runner in &mut runners {
        runner.stop_producing().await;
    }
    let drain_deadline = Instant::now() + JOBS_DRAIN_TIMEOUT;
    loop {
        let (enqueued, ended) = log.progress();
        if ended == enqueued || Instant::now() >= drain_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Then every permit must come back.
    let drain_bound = Duration::from_millis(2 * GRANT_TIMEOUT_MS + LEASE_TTL_MS);
    let drained = checker::wait_drained(&admin, &specs, drain_bound).await;
    let samples = sampler.stop().await;
    for runner in &runners {
        eprintln!(
            "chaos: runner {} after the drain: {:?}",
            runner.index,
            runner.queue.counts()
        );
    }
    for runner in &runners {
        if let Err(error) = runner.queue.shutdown().await {
            eprintln!("chaos: runner {} shutdown: {error}", runner.index);
        }
    }

    let jobs = log.snapshot();
    let concurrency = checker::max_concurrency(log.origin, &jobs);
    let never_run: Vec<&String> = jobs
        .iter()
        .filter(|(_, job)| job.start.is_none() || job.end.is_none())
        .map(|(id, _)| id)
        .collect();
    if !never_run.is_empty() {
        findings.add(Violation {
            kind: "never_ran",
            key: None,
            at_ms: at_ms(),
            detail: format!(
                "{} jobs never ran (or never ended) within {JOBS_DRAIN_TIMEOUT:?} of the \
                 drain, e.g. {:?}",
                never_run.len(),
                never_run.iter().take(5).collect::<Vec<_>>()
            ),
        });
    }
    let mut keys = Vec::new();
    for spec in &specs {
        let seen = concurrency.get(spec.key).copied().unwrap_or_default();
        if seen.max > spec.bound {
            findings.add(Violation {
                kind: "over_limit",
                key: Some(spec.key.to_string()),
                at_ms: seen.at_ms,
                detail: format!(
                    "{} jobs ran at once ({} mode), bound {}",
                    seen.max, spec.mode, spec.bound
                ),
            });
        }
        let drained = drained
            .get(spec.key)
            .cloned()
            .unwrap_or_else(|| Drained::Leak("not checked".into()));
        if let Drained::Leak(left) = &drained {
            findings.add(Violation {
                kind: "leak",
                key: Some(spec.key.to_string()),
                at_ms: at_ms(),
                detail: format!("usage not back to 0 within {drain_bound:?}: {left}"),
            });
        }
        let of_key = jobs
            .iter()
            .filter(|(_, job)| job.key == spec.key && job.start.is_some());
        let by = |kind| {
            of_key
                .clone()
                .filter(|(_, job)| job.permit == Some(kind))
                .count()
        };
        keys.push(KeyReport {
            spec: spec.clone(),
            jobs_run: of_key.clone().count(),
            by_grant: by("grant"),
            by_lease: by("lease"),
            concurrency: seen,
            samples: samples.get(spec.key).cloned().unwrap_or_default(),
            drained,
        });
    }
    let report = Report {
        seed,
        profile: profile.name,
        requested_seconds: profile.seconds,
        elapsed_ms: origin.elapsed().as_millis() as u64,
        faults: nemesis.records.clone(),
        fault_counts: counts,
        keys,
        jobs_enqueued: jobs.len(),
        jobs_run: jobs.iter().filter(|(_, job)| job.start.is_some()).count(),
        jobs_never_run: never_run.len(),
        repeated_admits: jobs
            .iter()
            .map(|(_, job)| u64::from(job.admits.saturating_sub(1)))
            .sum(),
        violations_by_kind: findings.by_kind(),
        violations: findings.kept(),
    };
    match report.write() {
        Ok(path) => eprintln!("chaos: report written to {}", path.display()),
        Err(error) => eprintln!("chaos: cannot write the report: {error}"),
    }
    eprintln!("{}", report.to_markdown());
    report
}
