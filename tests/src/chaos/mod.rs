//! Chaos testing: a three-node cluster of real `permitd` processes behind Raft
//! proxies ([`proxy`]), job runners on `SemaphoreQueue` over four keys
//! ([`workload`]), a nemesis that kills, pauses, restarts and cuts off nodes
//! on a drawn schedule ([`nemesis`]), and an independent checker of what
//! actually ran ([`checker`]), which writes a report ([`report`]).
//!
//! [`Profile::from_env`]: without `CHAOS_SECONDS` the bounded CI profile (about
//! two minutes of faults, at least 10 leader kills, 5 pauses, 1 full restart,
//! 2 partitions, 2 follower kills, 3 power losses); with it, a soak of that
//! many seconds of faults. Every node's data dir is on a `powerfs` disk
//! ([`crate::disks`]), so a power loss drops whatever a node had not synced. Every random choice comes from one number, the run's random state
//! ([`random`]): `CHAOS_RANDOM_STATE=<n>` replays a run; the number is printed at
//! the start and named in every failure.
//!
//! A run goes through named phases: [`start_workload`], [`warm_up`],
//! [`inject_faults`], [`drain`], then [`judge`] builds the report.

pub mod checker;
pub mod nemesis;
pub mod proxy;
pub mod random;
pub mod report;
pub mod workload;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use checker::{Concurrency, Drained, Findings, SampleStats, Sampler, Violation};
use nemesis::{FaultKind, Nemesis, Schedule};
use permitd_client::SemaphoreClient;
use proxy::Network;
use random::RandomState;
use report::{KeyReport, Report};
use workload::{JobLog, JobRecord, KeySpec, RunnerHandle, GRANT_TIMEOUT_MS, LEASE_TTL_MS};

use crate::{Cluster, Node, Settings, ADMIN_TOKEN};

/// The environment variable that replays a run.
pub const REPLAY_VARIABLE: &str = "CHAOS_RANDOM_STATE";
/// Job runners, each with its own queue and client.
const RUNNERS: usize = 3;
/// Seconds of faults in the CI profile (more if the required faults take longer).
const CI_SECONDS: u64 = 75;
/// The fault phase ends by then whatever is left, in the CI profile.
const CI_FAULT_CAP: Duration = Duration::from_secs(140);
/// How long every enqueued job may take to run once the faults stop.
const JOBS_DRAIN_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest wait for the workload to reach a steady state before the first fault.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// Jobs that must have ended before the first fault.
const WARM_UP_JOBS: usize = 50;

/// How long and with which random state to run.
#[derive(Debug, Clone)]
pub struct Profile {
    pub random_state: RandomState,
    /// Seconds of faults, at least.
    pub seconds: u64,
    /// `ci` or `soak`.
    pub name: &'static str,
    /// The fault phase ends by then (after the start of the faults).
    pub fault_cap: Duration,
    /// HTTPS everywhere and mTLS between peers (`CHAOS_TLS=0` turns it off).
    /// Auth is always on: runners use runner tokens, the nemesis the admin token.
    pub tls: bool,
}

impl Profile {
    /// [`REPLAY_VARIABLE`] (else a number from the clock) and `CHAOS_SECONDS`
    /// (else the CI profile).
    pub fn from_env() -> Self {
        let random_state = std::env::var(REPLAY_VARIABLE)
            .ok()
            .map(|text| {
                text.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{REPLAY_VARIABLE} is an unsigned integer"))
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
                    random_state,
                    seconds,
                    name: "soak",
                    fault_cap: Duration::from_secs(seconds + 120),
                    tls: tls_from_env(),
                }
            }
            Err(_) => Self {
                random_state,
                seconds: CI_SECONDS,
                name: "ci",
                fault_cap: CI_FAULT_CAP,
                tls: tls_from_env(),
            },
        }
    }
}

fn tls_from_env() -> bool {
    std::env::var("CHAOS_TLS").map_or(true, |text| text.trim() != "0")
}

/// The cluster and the workload running on it.
#[derive(Debug)]
pub struct Workload {
    cluster: Cluster,
    network: Network,
    specs: Vec<KeySpec>,
    /// Configures keys and reads usage; carries the admin token.
    admin: SemaphoreClient,
    log: Arc<JobLog>,
    findings: Arc<Findings>,
    runners: Vec<RunnerHandle>,
    sampler: Sampler,
}

/// Runs one chaos test and returns its report (also written to disk). Never
/// panics on a violation: the caller decides.
pub async fn run(profile: Profile) -> Report {
    let origin = Instant::now();
    eprintln!(
        "{REPLAY_VARIABLE}={} (profile {}, {} s of faults, tls {})",
        profile.random_state, profile.name, profile.seconds, profile.tls
    );
    let workload = start_workload(&profile).await;
    warm_up(&workload.log).await;
    let (nemesis, survivors) = inject_faults(&profile, workload).await;
    let ended = drain(survivors).await;
    let report = judge(&profile, origin, &nemesis, &ended);
    match report.write() {
        Ok(path) => eprintln!("chaos: report written to {}", path.display()),
        Err(error) => eprintln!("chaos: cannot write the report: {error}"),
    }
    eprintln!("{}", report.to_markdown());
    report
}

/// Starts the cluster behind its proxies, configures the keys and starts the
/// runners and the usage sampler.
pub async fn start_workload(profile: &Profile) -> Workload {
    let specs = workload::key_specs();
    let network = Network::new();
    let settings = Settings {
        tls: profile.tls,
        distinct_source_ips: true,
        power_loss_disks: true,
        ..Settings::default()
    };
    let cluster =
        Cluster::start_advertising(settings, |id, raft_addr| Some(network.front(id, raft_addr)))
            .await;
    let endpoints: Vec<String> = cluster.nodes.iter().map(Node::url).collect();
    let ca_file = cluster.certs.as_ref().map(|certs| certs.ca_file.clone());
    let admin = workload::chaos_client(endpoints.clone(), ADMIN_TOKEN, ca_file.clone());
    workload::configure(&admin, &specs).await;
    let runner_token = workload::runner_token(&admin, &specs).await;

    let log = Arc::new(JobLog::new());
    let findings = Arc::new(Findings::default());
    let runners = (0..RUNNERS)
        .map(|index| {
            let client = workload::chaos_client(endpoints.clone(), &runner_token, ca_file.clone());
            RunnerHandle::start(index, client, &specs, log.clone(), profile.random_state)
        })
        .collect();
    let sampler = Sampler::start(admin.clone(), specs.clone(), log.clone(), findings.clone());
    Workload {
        cluster,
        network,
        specs,
        admin,
        log,
        findings,
        runners,
        sampler,
    }
}

/// Lets the workload reach a steady state before the first fault.
pub async fn warm_up(log: &JobLog) {
    let until = Instant::now() + WARM_UP_TIMEOUT;
    while log.progress().1 < WARM_UP_JOBS && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What stays of the workload once the nemesis holds the cluster.
#[derive(Debug)]
pub struct Survivors {
    specs: Vec<KeySpec>,
    admin: SemaphoreClient,
    log: Arc<JobLog>,
    findings: Arc<Findings>,
    runners: Vec<RunnerHandle>,
    sampler: Sampler,
}

/// What the drain leaves to judge.
#[derive(Debug)]
pub struct Ended {
    specs: Vec<KeySpec>,
    log: Arc<JobLog>,
    findings: Arc<Findings>,
    samples: BTreeMap<String, SampleStats>,
    /// Per key, whether usage returned to zero.
    drained: BTreeMap<String, Drained>,
}

/// Runs the fault schedule, heals everything and records a cluster that did not
/// recover or a profile whose required faults did not all run.
pub async fn inject_faults(profile: &Profile, workload: Workload) -> (Nemesis, Survivors) {
    let Workload {
        cluster,
        network,
        specs,
        admin,
        log,
        findings,
        runners,
        sampler,
    } = workload;
    let mut nemesis = Nemesis {
        cluster,
        network,
        client: admin.clone(),
        probe_key: specs[0].key.to_string(),
        origin: log.origin,
        records: Vec::new(),
    };
    let mut schedule = Schedule::new(profile.random_state);
    let hard_stop = Instant::now() + profile.fault_cap;
    let duration = Duration::from_secs(profile.seconds);
    nemesis.run(&mut schedule, duration, hard_stop).await;
    let at_ms = log.origin.elapsed().as_millis() as u64;
    if nemesis.heal_all().await.is_none() {
        findings.add(Violation {
            kind: "no_recovery",
            key: None,
            at_ms,
            detail: format!(
                "no agreed leader serving reads within {:?} of healing everything",
                nemesis::RECOVERY_TIMEOUT
            ),
        });
    }
    check_profile_complete(&nemesis, &findings, at_ms);
    let survivors = Survivors {
        specs,
        admin,
        log,
        findings,
        runners,
        sampler,
    };
    (nemesis, survivors)
}

fn check_profile_complete(nemesis: &Nemesis, findings: &Findings, at_ms: u64) {
    let counts = nemesis.counts();
    for kind in FaultKind::ALL {
        let injected = counts.get(&kind).copied().unwrap_or(0);
        if injected < nemesis::required(kind) {
            findings.add(Violation {
                kind: "profile_incomplete",
                key: None,
                at_ms,
                detail: format!(
                    "{} injected {injected} times, the profile needs {}",
                    kind.name(),
                    nemesis::required(kind)
                ),
            });
        }
    }
}

/// No new work: every enqueued job must run and end, then every permit must
/// come back. Stops the sampler and the runners' queues.
pub async fn drain(mut survivors: Survivors) -> Ended {
    for runner in &mut survivors.runners {
        runner.stop_producing().await;
    }
    let jobs_deadline = Instant::now() + JOBS_DRAIN_TIMEOUT;
    loop {
        let (enqueued, ended) = survivors.log.progress();
        if ended == enqueued || Instant::now() >= jobs_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = checker::wait_drained(&survivors.admin, &survivors.specs, drain_bound()).await;
    let samples = survivors.sampler.stop().await;
    for runner in &survivors.runners {
        eprintln!(
            "chaos: runner {} after the drain: {:?}",
            runner.index,
            runner.queue.counts()
        );
    }
    for runner in &survivors.runners {
        if let Err(error) = runner.queue.shutdown().await {
            eprintln!("chaos: runner {} shutdown: {error}", runner.index);
        }
    }
    Ended {
        specs: survivors.specs,
        log: survivors.log,
        findings: survivors.findings,
        samples,
        drained,
    }
}

/// How long usage may take to return to zero once every job ended.
fn drain_bound() -> Duration {
    Duration::from_millis(2 * GRANT_TIMEOUT_MS + LEASE_TTL_MS)
}

/// Checks what ran against the keys' bounds and builds the report.
pub fn judge(profile: &Profile, origin: Instant, nemesis: &Nemesis, ended: &Ended) -> Report {
    let findings = &ended.findings;
    let at_ms = ended.log.origin.elapsed().as_millis() as u64;
    let jobs = ended.log.snapshot();
    let never_run = check_every_job_ran(&jobs, findings, at_ms);
    let concurrency = checker::max_concurrency(ended.log.origin, &jobs);
    let keys = ended
        .specs
        .iter()
        .map(|spec| judge_key(spec, ended, &jobs, &concurrency, at_ms))
        .collect();
    Report {
        random_state: profile.random_state,
        profile: profile.name,
        requested_seconds: profile.seconds,
        elapsed_ms: origin.elapsed().as_millis() as u64,
        faults: nemesis.records.clone(),
        fault_counts: nemesis.counts(),
        keys,
        jobs_enqueued: jobs.len(),
        jobs_run: jobs.iter().filter(|(_, job)| job.start.is_some()).count(),
        jobs_never_run: never_run,
        repeated_admits: jobs
            .iter()
            .map(|(_, job)| u64::from(job.admits.saturating_sub(1)))
            .sum(),
        violations_by_kind: findings.by_kind(),
        violations: findings.kept(),
    }
}

/// Records jobs that never ran or never ended; returns how many.
fn check_every_job_ran(jobs: &[(String, JobRecord)], findings: &Findings, at_ms: u64) -> usize {
    let never_run: Vec<&String> = jobs
        .iter()
        .filter(|(_, job)| job.start.is_none() || job.end.is_none())
        .map(|(id, _)| id)
        .collect();
    if !never_run.is_empty() {
        findings.add(Violation {
            kind: "never_ran",
            key: None,
            at_ms,
            detail: format!(
                "{} jobs never ran (or never ended) within {JOBS_DRAIN_TIMEOUT:?} of the \
                 drain, e.g. {:?}",
                never_run.len(),
                never_run.iter().take(5).collect::<Vec<_>>()
            ),
        });
    }
    never_run.len()
}

/// One key's verdict: jobs at once against its bound, and whether usage drained.
fn judge_key(
    spec: &KeySpec,
    ended: &Ended,
    jobs: &[(String, JobRecord)],
    concurrency: &BTreeMap<String, Concurrency>,
    at_ms: u64,
) -> KeyReport {
    let findings = &ended.findings;
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
    let drained = ended
        .drained
        .get(spec.key)
        .cloned()
        .unwrap_or_else(|| Drained::Leak("not checked".into()));
    if let Drained::Leak(left) = &drained {
        findings.add(Violation {
            kind: "leak",
            key: Some(spec.key.to_string()),
            at_ms,
            detail: format!("usage not back to 0 within {:?}: {left}", drain_bound()),
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
    KeyReport {
        spec: spec.clone(),
        jobs_run: of_key.clone().count(),
        by_grant: by("grant"),
        by_lease: by("lease"),
        concurrency: seen,
        samples: ended.samples.get(spec.key).cloned().unwrap_or_default(),
        drained,
    }
}
