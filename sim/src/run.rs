//! One run: a seed in, a verdict and a trace hash out.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use permitd_core::KeyConfig;
use permitd_storage::NodeId;

use crate::checker::usage::UsageHistory;
use crate::checker::{self, Turbulence, Violation};
use crate::elections;
use crate::history::{History, Write, Written};
use crate::liveness;
use crate::nemesis::{FaultMix, Nemesis};
use crate::node_host::{self, host_name, ClusterSpec, NodeWorld, API_PORT};
use crate::trace::Trace;
use crate::waiters::{self, WaitLog, WAITER_KEYS};
use crate::workload::{self, Shared, WorkloadSpec};

/// How long after the nemesis heals everything faults may still show: a
/// node it restarted rejoins, a leader may be elected (the checkers treat
/// this time as part of the faults' window).
const SETTLING: Duration = Duration::from_secs(1);

/// What one run simulates.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub seed: u64,
    pub nodes: u64,
    pub keys: usize,
    pub clients: usize,
    pub jobs_per_client: usize,
    /// Runners whose requests the leader holds (`waiters.rs`).
    pub waiters: usize,
    /// How long the waiters go on after the faults heal: quiet time, in
    /// which `liveness.rs` judges them.
    pub quiet_after: Duration,
    pub faults: FaultMix,
    /// Membership changes in the workload (`workload/members.rs`), in one
    /// run in five.
    pub members: bool,
    /// Faults begin and end within this window of simulated time.
    pub fault_window: (Duration, Duration),
    /// A run not finished by then fails (`no_progress`).
    pub limit: Duration,
    /// Events the outcome keeps (the last ones).
    pub kept_events: usize,
    /// `[cluster] shards` of the simulated cluster.
    pub shards: u32,
}

impl RunOptions {
    /// The CI profile: 3 nodes, 4 keys, 4 runners, every fault.
    pub fn ci(seed: u64) -> Self {
        Self {
            seed,
            nodes: 3,
            keys: 4,
            clients: 4,
            jobs_per_client: 12,
            waiters: 3,
            quiet_after: Duration::from_secs(3),
            faults: FaultMix::ALL,
            members: true,
            fault_window: (Duration::from_secs(1), Duration::from_secs(6)),
            limit: Duration::from_secs(90),
            kept_events: 200,
            shards: 1,
        }
    }
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub seed: u64,
    pub trace_hash: u64,
    /// `[limits] entries_in_flight` of the run's nodes ([`entries_in_flight`]).
    pub entries_in_flight: usize,
    pub events: u64,
    pub violations: Vec<Violation>,
    /// Simulated time the run took.
    pub simulated: Duration,
    pub jobs: usize,
    pub faults: u64,
    /// The trace's last events (for a failed run's report).
    pub last_events: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The line every seed prints.
    pub fn summary(&self) -> String {
        format!(
            "seed {} trace {:016x}, {} entries in flight",
            self.seed, self.trace_hash, self.entries_in_flight
        )
    }

    /// A failed run's report: what broke, the last events, how to replay it.
    pub fn report(&self) -> String {
        let mut text = format!("{}\n", self.summary());
        for violation in &self.violations {
            text += &format!("VIOLATION {violation}\n");
        }
        text += "last events:\n";
        for event in &self.last_events {
            text += &format!("  {event}\n");
        }
        text += &format!(
            "replay: SIM_SEED={} cargo test -p permitd-sim --release --test seeds -- --nocapture\n",
            self.seed
        );
        text
    }
}

/// The simulated world of a run from `seed`, for at most `limit` of simulated
/// time: 1 ms steps, 1–4 ms of link latency (which reorders the segments of
/// different connections), every host's tokio runtime seeded. A caller may
/// change it before `build()` (a scenario fixes the latency).
pub fn simulation(seed: u64, limit: Duration) -> turmoil::Builder {
    let mut builder = turmoil::Builder::new();
    builder
        .rng_seed(seed)
        .epoch(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        .simulation_duration(limit)
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(4))
        .tcp_capacity(4096);
    builder
}

/// The leader's `[limits] entries_in_flight` in a run from `seed`.
/// Operators may set 1 to 64, and each end has its own hazards: with one
/// entry in flight no proposal ever has another beside it, with many the
/// rounds of different keys commit while others wait. So each seed draws
/// one of 1 (the default), 2, 4 and 8, from its own bits of the seed.
pub fn entries_in_flight(seed: u64) -> usize {
    const CHOICES: [usize; 4] = [1, 2, 4, 8];
    let mixed = (seed ^ 0x696e_666c_6967_6874).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    CHOICES[(mixed >> 62) as usize]
}

/// Runs one seed to the end.
pub fn run(options: &RunOptions) -> Outcome {
    // Spawned tasks of the nodes start late at random, as on a busy runtime
    // (`permitd_node::seams::jitter_spawns`), drawn from the seed.
    permitd_node::seams::jitter_spawns(Some(options.seed ^ 0x6a69_7474_6572));
    crate::net::seed_losses(Some(options.seed ^ 0x6c6f_7373));
    let outcome = run_seeded(options);
    crate::net::seed_losses(None);
    permitd_node::seams::jitter_spawns(None);
    outcome
}

fn run_seeded(options: &RunOptions) -> Outcome {
    let trace = Trace::keeping(options.kept_events);
    let mut spec = ClusterSpec::new(options.seed, options.nodes, trace.clone());
    spec.shards = options.shards;
    spec.rounds.entries_in_flight = entries_in_flight(options.seed);
    let worlds: BTreeMap<NodeId, NodeWorld> = (1..=options.nodes)
        .map(|id| (id, NodeWorld::default()))
        .collect();
    let mut sim = simulation(options.seed, options.limit).build();
    node_host::add_nodes(&mut sim, &spec, &worlds);
    let endpoints = (1..=options.nodes)
        .map(|id| format!("{}:{API_PORT}", host_name(id)))
        .collect();
    let workload = WorkloadSpec::draw(
        options.seed,
        options.keys,
        options.clients,
        options.jobs_per_client,
        endpoints,
    );
    let history = History::default();
    let shared = Shared::new(workload.clone(), history.clone(), trace.clone());
    sim.client("operator", workload::operate(options.seed, shared.clone()));
    if options.members {
        let members_seed = options.seed.wrapping_mul(1_000).wrapping_add(998);
        sim.client(
            "members",
            workload::change_members(
                members_seed,
                options.nodes,
                shared.clone(),
                spec.disturbances.clone(),
            ),
        );
    }
    let sampler_seed = options.seed.wrapping_mul(1_000).wrapping_add(999);
    sim.client("sampler", workload::sample(sampler_seed, shared.clone()));
    for n in 0..options.clients {
        let name = format!("client{n}");
        let seed = options.seed.wrapping_mul(1_000).wrapping_add(n as u64);
        sim.client(name, workload::run_client(n, seed, shared.clone()));
    }
    let waits = WaitLog::default();
    let until = options.fault_window.1 + options.quiet_after;
    for n in 0..options.waiters {
        let name = format!("waiter{n}");
        let seed = options
            .seed
            .wrapping_mul(1_000)
            .wrapping_add(500 + n as u64);
        let runner = waiters::run_waiter(name.clone(), seed, shared.clone(), until, waits.clone());
        sim.client(name, runner);
    }
    let hosts: Vec<String> = (1..=options.nodes)
        .map(host_name)
        .chain(["operator".to_owned(), "sampler".to_owned()])
        .chain(options.members.then(|| "members".to_owned()))
        .chain((0..options.clients).map(|n| format!("client{n}")))
        .chain((0..options.waiters).map(|n| format!("waiter{n}")))
        .collect();
    let mut nemesis = Nemesis::new(
        options.seed,
        worlds.clone(),
        options.faults,
        options.fault_window,
        hosts,
        trace.clone(),
        spec.disturbances.clone(),
    );
    let mut violations = Vec::new();
    loop {
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => {
                violations.push(Violation {
                    kind: "host_failed",
                    detail: error.to_string(),
                });
                break;
            }
        }
        nemesis.tick(&mut sim);
        nemesis.restart_stopped(&mut sim);
    }
    let simulated = sim.elapsed();
    violations.extend(spec.replicas.check());
    let records = history.snapshot();
    violations.extend(check_history(options, &workload, &records, simulated));
    for (shard, terms) in spec.terms.snapshot() {
        let explains = spec.disturbances.for_shard(shard);
        for mut violation in elections::check_leaders_per_term(&terms)
            .into_iter()
            .chain(elections::check_explained(&terms, &explains))
        {
            if spec.shards > 1 {
                violation.detail = format!("shard {shard}: {}", violation.detail);
            }
            violations.push(violation);
        }
    }
    let disturbances = spec.disturbances.snapshot();
    let waits = waits
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let claim_deadline = Duration::from_millis(KeyConfig::default().grant_timeout_ms);
    let limits = WAITER_KEYS
        .iter()
        .map(|(key, limit)| (key.to_string(), *limit))
        .collect();
    violations.extend(liveness::check_no_overtaking(&waits, &disturbances));
    violations.extend(liveness::check_held_while_free(
        &waits,
        &limits,
        &disturbances,
        claim_deadline,
        simulated,
    ));
    let start_failures = spec
        .start_failures
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    violations.extend(start_failures.into_iter().map(|detail| Violation {
        kind: "node_cannot_start",
        detail,
    }));
    Outcome {
        seed: options.seed,
        trace_hash: trace.hash(),
        entries_in_flight: spec.rounds.entries_in_flight,
        events: trace.events(),
        violations,
        simulated,
        jobs: records.asks.len() + records.leases.len(),
        faults: nemesis.injected,
        last_events: trace.last(),
    }
}

/// Every property of the history the clients saw.
fn check_history(
    options: &RunOptions,
    workload: &WorkloadSpec,
    records: &crate::history::Records,
    simulated: Duration,
) -> Vec<Violation> {
    let faulty = options.faults != FaultMix::NONE;
    let turbulence = faulty.then(|| Turbulence {
        from: options.fault_window.0,
        until: options.fault_window.1 + SETTLING,
    });
    let grant_timeouts = workload
        .every_key()
        .map(|key| (key.name.clone(), key.grant_timeout))
        .collect();
    let jobs = checker::jobs(records);
    let defaults = permitd_core::KeyConfig::default();
    let mut violations = Vec::new();
    // The waiters' keys keep the limits they set before any request.
    let waiter_limits = WAITER_KEYS.iter().map(|(key, limit)| Write {
        key: key.to_string(),
        what: Written::Key(KeyConfig {
            limit: *limit,
            ..KeyConfig::default()
        }),
        // Written before any of their requests (a write is newer than another
        // if sent after it was acknowledged: these replace the default).
        sent: Duration::from_nanos(1),
        acked: Some(Duration::from_nanos(2)),
    });
    let writes: Vec<Write> = records
        .writes
        .iter()
        .cloned()
        .chain(waiter_limits)
        .collect();
    violations.extend(checker::check_budget(
        &jobs,
        &writes,
        &records.force_releases,
        &defaults,
        simulated,
    ));
    violations.extend(checker::check_fences(&jobs));
    violations.extend(checker::check_every_job_ended(&jobs));
    violations.extend(checker::usage::check_usage(&UsageHistory {
        records,
        grant_timeouts: &grant_timeouts,
        turbulence,
    }));
    violations.extend(checker::writes::check_writes(
        &records.writes,
        records.read_back.as_ref(),
    ));
    violations.extend(checker::writes::check_replays(
        &records.replays,
        &grant_timeouts,
        turbulence,
    ));
    violations
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::entries_in_flight;

    /// Every setting comes up, each for about a quarter of CI's seeds.
    #[test]
    fn seeds_draw_every_entries_in_flight_setting_evenly() {
        let mut counts = BTreeMap::new();
        for seed in 1..=500 {
            *counts.entry(entries_in_flight(seed)).or_insert(0) += 1;
        }
        assert_eq!(counts.keys().copied().collect::<Vec<_>>(), [1, 2, 4, 8]);
        assert!(counts.values().all(|&count| (100..=150).contains(&count)));
    }
}
