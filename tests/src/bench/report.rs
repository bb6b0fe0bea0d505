//! The bench's output: one markdown table (every section, each latency beside
//! the fsync floor, each target with how far it is met or missed, each
//! throughput row with its CPU, log entries and calls per cycle) and the same
//! rows as JSON.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::cpu::{finite, us, Cost};
use super::failover::FailoverResult;
use super::floor::FloorResult;
use super::grant::{GrantResult, GrantRun};
use super::lease::{LeaseResult, LeaseRun};
use super::scale::ScalePoint;
use super::shard_failover::{self, ShardFailoverResult};
use super::shards::{Load, ShardRow};

/// Permit cycles per second through leases, 16 runners, limit 1,000.
const TARGET_LEASE_PER_S: f64 = 105_000.0;
/// Contended strict leases, 64 runners, limit 32.
const TARGET_CONTENDED_PER_S: f64 = 10_500.0;
/// Grants without leases, 64 clients, limit 32.
const TARGET_GRANT_PER_S: f64 = 10_500.0;
/// Round overhead above roundWaitMs at one client.
const TARGET_OVERHEAD_MS_P50: f64 = 1.0;
const TARGET_OVERHEAD_MS_P99: f64 = 3.0;
/// SIGKILL of the leader to the first grant, median.
const TARGET_FAILOVER_MS_P50: f64 = 500.0;
/// Longest of the failover samples, in ms.
const TARGET_FAILOVER_MS_MAX: f64 = 800.0;
/// A node killed at S = 3: its shards serve again, median and longest.
const TARGET_SHARD_FAILOVER_MS_P50: f64 = 400.0;
const TARGET_SHARD_FAILOVER_MS_MAX: f64 = 800.0;
/// A freed permit's idle time before it is admitted again, contended run, p50.
const TARGET_REUSE_GAP_MS_P50: f64 = 3.0;
/// Resident memory per idle key.
const TARGET_RSS_BYTES_PER_KEY: f64 = 1_024.0;
/// Every node's CPU within this share of the nodes' mean, under load with shards.
const TARGET_NODE_CPU_SPREAD: f64 = 0.25;
/// Permits/s at [`TARGET_RATIO_SHARDS`] shards over one shard's.
const TARGET_SHARDS_RATIO: f64 = 1.3;
const TARGET_RATIO_SHARDS: u32 = 3;

/// One table row.
#[derive(Debug, Clone)]
struct Row {
    section: &'static str,
    scenario: String,
    throughput: String,
    p50: String,
    p99: String,
    notes: String,
    target: String,
    /// CPU µs per cycle by process (throughput rows).
    cpu: String,
    /// Entries/s, CPU per entry, calls per cycle (throughput rows).
    entries: String,
    /// The followers' leader contact gaps (throughput rows).
    gaps: String,
}

impl Row {
    /// The cost columns of a throughput row, and a note when the leader
    /// changed during its window.
    fn costing(mut self, cost: &Cost) -> Self {
        self.cpu = cost.per_cycle_cell();
        self.entries = cost.entries_cell();
        self.gaps = cost.gaps_cell();
        if cost.elections > 0 {
            // The split by leader and followers assumed one leader all along.
            let _ = write!(
                self.notes,
                "; **{} election(s) during the window**",
                cost.elections
            );
        }
        self
    }
}

/// No cost columns.
const NO_COST: &str = "—";

/// The rows so far, and their JSON.
#[derive(Debug)]
pub struct Report {
    profile: &'static str,
    floor_ms: Option<f64>,
    rows: Vec<Row>,
    json: Vec<Value>,
    elapsed: Duration,
    /// Elections outside the failover section (term increases).
    leader_changes: Option<u64>,
}

impl Report {
    pub fn new(profile: &'static str) -> Self {
        Self {
            profile,
            floor_ms: None,
            rows: Vec::new(),
            json: Vec::new(),
            elapsed: Duration::ZERO,
            leader_changes: None,
        }
    }

    /// `1.23 ms (2.1× fsync)`.
    fn latency(&self, ms: f64) -> String {
        match self.floor_ms {
            Some(floor) if floor > 0.0 && ms.is_finite() => {
                format!("{ms:.2} ms ({:.1}× fsync)", ms / floor)
            }
            _ => format!("{ms:.2} ms"),
        }
    }

    pub fn floor(&mut self, floor: &FloorResult) {
        self.floor_ms = Some(floor.fsync_ms_p50);
        self.rows.push(Row {
            section: "6 floor",
            scenario: "fdatasync of a 4 KiB append (as the log syncs), data disk".into(),
            throughput: format!("{:.0} fsyncs/s", 1e3 / floor.fsync_ms_p50),
            p50: format!("{:.3} ms", floor.fsync_ms_p50),
            p99: format!("{:.3} ms", floor.fsync_ms_p99),
            notes: format!("{} samples", floor.samples),
            target: "—".into(),
            cpu: NO_COST.into(),
            entries: NO_COST.into(),
            gaps: NO_COST.into(),
        });
        self.json
            .push(json!({"section": "floor", "fsyncMsP50": floor.fsync_ms_p50,
            "fsyncMsP99": floor.fsync_ms_p99, "samples": floor.samples}));
    }

    pub fn grant(&mut self, run: &GrantRun, result: &GrantResult) {
        let mut target = "—".to_string();
        if run.clients == 1 {
            target = format!(
                "overhead p50 ≤ {TARGET_OVERHEAD_MS_P50} ms: {}; p99 ≤ {TARGET_OVERHEAD_MS_P99} ms: {}",
                at_most(result.overhead_ms_p50, TARGET_OVERHEAD_MS_P50),
                at_most(result.overhead_ms_p99, TARGET_OVERHEAD_MS_P99)
            );
        } else if run.clients == 64 && run.keys == 1 {
            target = format!(
                "≥ {}/s: {}",
                thousands(TARGET_GRANT_PER_S),
                at_least(result.permits_per_s, TARGET_GRANT_PER_S)
            );
        }
        self.rows.push(
            Row {
                section: "1 grant",
                scenario: format!(
                    "{} client{}, {} key{}, wait {} ms, limit {}",
                    run.clients,
                    if run.clients == 1 { "" } else { "s" },
                    run.keys,
                    if run.keys == 1 { "" } else { "s" },
                    run.round_wait_ms,
                    run.limit
                ),
                throughput: format!("{} permits/s", thousands(result.permits_per_s)),
                p50: format!("+{}", self.latency(result.overhead_ms_p50)),
                p99: format!("+{}", self.latency(result.overhead_ms_p99)),
                notes: format!(
                    "{} req/s, {} entries/s{}",
                    thousands(result.requests_per_s),
                    thousands(result.entries_per_s),
                    errors(result.errors)
                ),
                target,
                cpu: NO_COST.into(),
                entries: NO_COST.into(),
                gaps: NO_COST.into(),
            }
            .costing(&result.cost),
        );
        self.json.push(
            json!({"section": "grant", "clients": run.clients, "keys": run.keys,
            "roundWaitMs": run.round_wait_ms, "limit": run.limit,
            "permitsPerS": result.permits_per_s, "requestsPerS": result.requests_per_s,
            "entriesPerS": result.entries_per_s, "latencyMsP50": result.latency_ms_p50,
            "latencyMsP99": result.latency_ms_p99, "overheadMsP50": result.overhead_ms_p50,
            "overheadMsP99": result.overhead_ms_p99, "errors": result.errors,
            "cost": result.cost.to_json()}),
        );
    }

    pub fn messages(&mut self, run: &GrantRun, result: &GrantResult) {
        self.rows.push(
            Row {
                section: "3 messages",
                scenario: format!(
                    "{} clients, {} keys, request + sync per grant, wait {} ms",
                    run.clients, run.keys, run.round_wait_ms
                ),
                throughput: format!("{} msgs/s", thousands(result.messages_per_s)),
                p50: format!("+{}", self.latency(result.overhead_ms_p50)),
                p99: format!("+{}", self.latency(result.overhead_ms_p99)),
                notes: format!(
                    "{} requests/s + {} syncs/s; {} log entries/s; {} permits/s{}",
                    thousands(result.requests_per_s),
                    thousands(result.syncs_per_s),
                    thousands(result.entries_per_s),
                    thousands(result.permits_per_s),
                    errors(result.errors)
                ),
                target: "—".into(),
                cpu: NO_COST.into(),
                entries: NO_COST.into(),
                gaps: NO_COST.into(),
            }
            .costing(&result.cost),
        );
        self.json.push(
            json!({"section": "messages", "clients": run.clients, "keys": run.keys,
            "messagesPerS": result.messages_per_s, "requestsPerS": result.requests_per_s,
            "syncsPerS": result.syncs_per_s, "entriesPerS": result.entries_per_s,
            "permitsPerS": result.permits_per_s, "errors": result.errors,
            "cost": result.cost.to_json()}),
        );
    }

    pub fn lease(&mut self, run: &LeaseRun, result: &LeaseResult) {
        let wanted = if run.limit >= 1_000 {
            TARGET_LEASE_PER_S
        } else {
            TARGET_CONTENDED_PER_S
        };
        self.rows.push(Row {
            section: "2 lease",
            scenario: match run.leases {
                true => format!(
                    "SemaphoreQueue, strict leases, {} runners, limit {}, {} permits/lease, backlog {}",
                    run.runners, run.limit, run.permits_per_lease, run.backlog
                ),
                false => format!(
                    "SemaphoreQueue, no leases, {} runners, limit {}, backlog {}",
                    run.runners, run.limit, run.backlog
                ),
            },
            throughput: format!("{} cycles/s", thousands(result.cycles_per_s)),
            p50: match result.reuse_gap_ms {
                Some((p50, _)) => format!("reuse gap {}", self.latency(p50)),
                None => "—".into(),
            },
            p99: match result.reuse_gap_ms {
                Some((_, p99)) => format!("reuse gap {}", self.latency(p99)),
                None => "—".into(),
            },
            notes: format!(
                "{} entries/s, {} cycles/s under leases",
                thousands(result.entries_per_s),
                thousands(result.lease_cycles_per_s)
            ),
            target: match result.reuse_gap_ms {
                Some((p50, _)) => format!(
                    "≥ {}/s: {}; reuse gap p50 ≤ {TARGET_REUSE_GAP_MS_P50} ms: {}",
                    thousands(wanted),
                    at_least(result.cycles_per_s, wanted),
                    at_most(p50, TARGET_REUSE_GAP_MS_P50)
                ),
                None => format!(
                    "≥ {}/s: {}",
                    thousands(wanted),
                    at_least(result.cycles_per_s, wanted)
                ),
            },
            cpu: NO_COST.into(),
            entries: NO_COST.into(),
            gaps: NO_COST.into(),
        }
        .costing(&result.cost));
        let (gap_p50, gap_p99) = result.reuse_gap_ms.unzip();
        self.json.push(
            json!({"section": "lease", "runners": run.runners, "limit": run.limit,
            "leases": run.leases, "backlog": run.backlog,
            "permitsPerLease": run.permits_per_lease, "cyclesPerS": result.cycles_per_s,
            "leaseCyclesPerS": result.lease_cycles_per_s,
            "entriesPerS": result.entries_per_s,
            "reuseGapMsP50": gap_p50, "reuseGapMsP99": gap_p99,
            "cost": result.cost.to_json()}),
        );
    }

    /// `terms`: elections during the section (each kill makes at least one).
    pub fn failover(&mut self, result: &FailoverResult, terms: u64) {
        self.rows.push(Row {
            section: "4 failover",
            scenario: format!(
                "SIGKILL leader → first grant, {} kills (election timeout {}–{} ms)",
                result.kills,
                crate::ELECTION_TIMEOUT_MIN_MS,
                crate::ELECTION_TIMEOUT_MAX_MS
            ),
            throughput: "—".into(),
            p50: format!("{:.0} ms", result.ms_p50),
            p99: format!("max {:.0} ms", result.ms_max),
            notes: format!(
                "{terms} elections; samples: {}",
                result
                    .samples_ms
                    .iter()
                    .map(|ms| format!("{ms:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            target: format!(
                "p50 ≤ {TARGET_FAILOVER_MS_P50:.0} ms: {}; max ≤ {TARGET_FAILOVER_MS_MAX:.0} ms: {}",
                at_most(result.ms_p50, TARGET_FAILOVER_MS_P50),
                at_most(result.ms_max, TARGET_FAILOVER_MS_MAX)
            ),
            cpu: NO_COST.into(),
            entries: NO_COST.into(),
            gaps: NO_COST.into(),
        });
        self.json
            .push(json!({"section": "failover", "kills": result.kills,
            "msP50": result.ms_p50, "msMax": result.ms_max, "samplesMs": result.samples_ms,
            "elections": terms}));
    }

    pub fn scale(&mut self, points: &[ScalePoint]) {
        let base = points.first().map(|point| point.overhead_ms_p50);
        for point in points {
            let per_key = point.rss_bytes_per_key;
            let target = match per_key {
                Some(bytes) => format!(
                    "≤ 1 KiB/key (median): {}; flat latency: p50 {:+.2} ms vs 1 key",
                    at_most(bytes, TARGET_RSS_BYTES_PER_KEY),
                    point.overhead_ms_p50 - base.unwrap_or(f64::NAN)
                ),
                None => "baseline".into(),
            };
            self.rows.push(Row {
                section: "5 scale",
                scenario: format!(
                    "{} key{} with a live grant",
                    thousands(point.keys as f64),
                    if point.keys == 1 { "" } else { "s" }
                ),
                throughput: format!("created {} keys/s", thousands(point.populate_keys_per_s)),
                p50: format!("+{}", self.latency(point.overhead_ms_p50)),
                p99: format!("+{}", self.latency(point.overhead_ms_p99)),
                notes: format!(
                    "leader RSS {:.1} MiB (median of {} samples; peak {:.1} MiB){}; \
                     snapshots every {} entries",
                    mib(point.rss_bytes),
                    point.rss_samples,
                    mib(point.rss_bytes_peak),
                    per_key.map_or(String::new(), |bytes| format!(
                        ", {bytes:.0} B/key (peak {:.0})",
                        point.rss_bytes_per_key_peak.unwrap_or(f64::NAN)
                    )),
                    thousands(super::scale::SCALE_SNAPSHOT_EVERY_LOGS as f64)
                ),
                target,
                cpu: NO_COST.into(),
                entries: NO_COST.into(),
                gaps: NO_COST.into(),
            });
            self.json
                .push(json!({"section": "scale", "keys": point.keys,
                "overheadMsP50": point.overhead_ms_p50, "overheadMsP99": point.overhead_ms_p99,
                "rssBytes": point.rss_bytes, "rssBytesPeak": point.rss_bytes_peak,
                "rssSamples": point.rss_samples, "rssBytesPerKey": point.rss_bytes_per_key,
                "rssBytesPerKeyPeak": point.rss_bytes_per_key_peak,
                "snapshotEveryLogs": super::scale::SCALE_SNAPSHOT_EVERY_LOGS,
                "populateKeysPerS": point.populate_keys_per_s}));
        }
    }

    /// The shards section: a row per window, then every S's permits/s over
    /// S = 1's beside the model's ratio.
    pub fn shards(&mut self, rows: &[ShardRow]) {
        for row in rows {
            let one = one_shard(rows, row);
            let table_row = self.shard_row(row, one);
            self.rows.push(table_row);
            self.json.push(shard_json(row, one));
        }
        if let Some(summary) = shard_ratios(rows) {
            self.rows.push(summary);
        }
    }

    fn shard_row(&self, row: &ShardRow, one: Option<&ShardRow>) -> Row {
        let (p50, p99) = match &row.load {
            Load::Grant(_, result) => (
                format!("+{}", self.latency(result.overhead_ms_p50)),
                format!("+{}", self.latency(result.overhead_ms_p99)),
            ),
            _ => ("—".into(), "—".into()),
        };
        Row {
            section: "7 shards",
            scenario: shard_scenario(row),
            throughput: match row.load {
                Load::Idle => "idle".into(),
                _ => format!("{} permits/s", thousands(row.permits_per_s())),
            },
            p50,
            p99,
            notes: shard_notes(row, one),
            target: shard_target(row, one),
            cpu: shard_cpu_cell(row),
            entries: shard_entries_cell(row),
            gaps: row.cost.gaps_cell(),
        }
    }

    /// The shard failover section: kill → serve of the killed node's shards,
    /// and the other shards' calls during those failovers.
    pub fn shard_failover(&mut self, result: &ShardFailoverResult) {
        let rounds = &result.rounds;
        let joined = |each: &dyn Fn(&shard_failover::Round) -> String| {
            rounds.iter().map(each).collect::<Vec<_>>().join(", ")
        };
        let kept = rounds.iter().filter(|round| round.others_kept).count();
        self.rows.push(Row {
            section: "4 shard failover",
            scenario: format!(
                "S = {}: SIGKILL the node leading shard k (k = round mod {}) → the first grant of \
                 a call to its shard sent after the kill, {} rounds; {} clients per shard, one \
                 call each per {} ms (election timeout {}–{} ms)",
                result.shards,
                result.shards,
                rounds.len(),
                result.clients_per_shard,
                shard_failover::CALL_PERIOD.as_millis(),
                crate::ELECTION_TIMEOUT_MIN_MS,
                crate::ELECTION_TIMEOUT_MAX_MS
            ),
            throughput: "—".into(),
            p50: format!("{:.0} ms", result.serve_ms_p50),
            p99: format!("max {:.0} ms", result.serve_ms_max),
            notes: format!(
                "samples: {}; killed nodes: {}; the other shards kept leader and term in {kept} \
                 of {} rounds",
                joined(&|round| format!("{:.0}", round.serve_ms)),
                joined(&|round| round.victim.to_string()),
                rounds.len()
            ),
            target: format!(
                "p50 ≤ {TARGET_SHARD_FAILOVER_MS_P50:.0} ms: {}; max ≤ \
                 {TARGET_SHARD_FAILOVER_MS_MAX:.0} ms: {}",
                at_most(result.serve_ms_p50, TARGET_SHARD_FAILOVER_MS_P50),
                at_most(result.serve_ms_max, TARGET_SHARD_FAILOVER_MS_MAX)
            ),
            cpu: NO_COST.into(),
            entries: NO_COST.into(),
            gaps: NO_COST.into(),
        });
        let (before, during) = (result.before_ms, result.during_ms);
        self.rows.push(Row {
            section: "4 shard failover",
            scenario: format!(
                "S = {}: the other shards' calls during those failovers (kill → the killed \
                 shard's first grant), latency before (steady window) → during",
                result.shards
            ),
            throughput: format!("{} calls/s steady", thousands(result.steady_calls_per_s)),
            p50: format!("{} → {}", self.latency(before.0), self.latency(during.0)),
            p99: format!("{} → {}", self.latency(before.1), self.latency(during.1)),
            notes: format!(
                "{} calls during, {} failed; per round (failed/calls, p99 before → during): {}",
                result.other_calls,
                result.other_failed,
                joined(&|round| format!(
                    "{}/{} {:.1} → {:.1} ms",
                    round.other_failed, round.other_calls, round.before_ms.1, round.during_ms.1
                ))
            ),
            target: match result.other_failed {
                0 if result.other_calls > 0 => "every call answered: met".into(),
                0 => "every call answered: **no calls measured**".into(),
                failed => format!("every call answered: **missed, {failed} failed**"),
            },
            cpu: NO_COST.into(),
            entries: NO_COST.into(),
            gaps: NO_COST.into(),
        });
        let per_round: Vec<Value> = rounds
            .iter()
            .map(|round| {
                json!({"victim": round.victim, "killedShards": round.killed_shards,
                "serveMs": round.serve_ms, "otherCalls": round.other_calls,
                "otherFailedCalls": round.other_failed,
                "otherMsP50Before": finite(round.before_ms.0),
                "otherMsP99Before": finite(round.before_ms.1),
                "otherMsP50During": finite(round.during_ms.0),
                "otherMsP99During": finite(round.during_ms.1),
                "othersKeptLeaderAndTerm": round.others_kept})
            })
            .collect();
        self.json
            .push(json!({"section": "shard-failover", "shards": result.shards,
            "clientsPerShard": result.clients_per_shard,
            "callPeriodMs": shard_failover::CALL_PERIOD.as_millis() as u64,
            "rounds": rounds.len(), "serveMsP50": finite(result.serve_ms_p50),
            "serveMsMax": finite(result.serve_ms_max),
            "serveSamplesMs": rounds.iter().map(|round| round.serve_ms).collect::<Vec<_>>(),
            "otherCalls": result.other_calls, "otherFailedCalls": result.other_failed,
            "otherMsP50Before": finite(before.0), "otherMsP99Before": finite(before.1),
            "otherMsP50During": finite(during.0), "otherMsP99During": finite(during.1),
            "steadyCallsPerS": finite(result.steady_calls_per_s), "perRound": per_round}));
    }

    /// Elections outside the failover section, as term increases (expected 0).
    pub fn leader_changes(&mut self, count: u64) {
        self.leader_changes = Some(count);
    }

    pub fn finish(&mut self, elapsed: Duration) {
        self.elapsed = elapsed;
    }

    /// The markdown table.
    pub fn markdown(&self) -> String {
        let mut text = format!(
            "permitd bench, profile `{}` ({:.0} s), {} worker thread(s) in each node and in \
             the clients' process. Latencies are above roundWaitMs (client-observed), × is \
             the ratio to the median fsync.\n\n\
             leader changes (outside failover): {} (term increases outside the failover \
             section; expected 0; a throughput row whose window saw one says so in its notes, \
             its leader/follower split then being unreliable).\n\n\
             CPU µs/cycle: utime+stime over the measured window per completed cycle (a \
             granted permit, or an admission) of L the leader, F each follower, C the \
             clients (the bench process), Σ all of them. µs/entry: the same CPU (Σ, and L \
             alone) per log entry the leader appended. msgs/cycle: HTTP calls of the \
             clients per cycle (grant and messages rows: counted by the clients; lease \
             rows: `/v1/semaphores` calls the nodes served). follower contact gap: time \
             between consecutive AppendEntries (heartbeats or appends) a follower received \
             from a leader over the window, every node's together (a node records none for \
             the group it leads), from the nodes' \
             `permitd_raft_leader_contact_gap_seconds` histogram, so p99.9 and max are \
             given as their bucket (heartbeats are due every 40 ms; openraft sends them \
             about every 60 ms).\n\n",
            self.profile,
            self.elapsed.as_secs_f64(),
            super::threads_per_process(),
            self.leader_changes
                .map_or_else(|| "not measured".to_owned(), |count| count.to_string())
        );
        let transport = super::transport::VARIABLES;
        for name in [
            "PERMITD_BENCH_TOML",
            "PERMITD_BENCH_RAFT_TIMINGS",
            "PERMITD_BENCH_LINK_DELAY_US",
        ]
        .into_iter()
        .chain(transport)
        {
            if let Ok(value) = std::env::var(name) {
                let _ = writeln!(text, "Overridden: {name}={value:?}.\n");
            }
        }
        text.push_str(
            "| section | scenario | throughput | p50 | p99 | notes | target \
             | CPU µs/cycle | entries, CPU µs/entry, msgs/cycle | follower contact gap |\n",
        );
        text.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
        for row in &self.rows {
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.section,
                row.scenario,
                row.throughput,
                row.p50,
                row.p99,
                row.notes,
                row.target,
                row.cpu,
                row.entries,
                row.gaps
            );
        }
        text
    }

    /// The rows as JSON.
    pub fn to_json(&self) -> Value {
        json!({"profile": self.profile, "elapsedS": self.elapsed.as_secs_f64(),
            "fsyncMsP50": self.floor_ms, "leaderChangesOutsideFailover": self.leader_changes,
            "rows": self.json, "table": self.markdown()})
    }

    /// Writes the JSON to `<target>/bench/bench-<profile>-<unix time>.json` and
    /// `bench-<profile>-latest.json`; returns the first path.
    pub fn save(&self, target_dir: &Path) -> std::io::Result<PathBuf> {
        let dir = target_dir.join("bench");
        std::fs::create_dir_all(&dir)?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let text = serde_json::to_string_pretty(&self.to_json()).expect("JSON");
        let path = dir.join(format!("bench-{}-{stamp}.json", self.profile));
        std::fs::write(&path, &text)?;
        std::fs::write(
            dir.join(format!("bench-{}-latest.json", self.profile)),
            &text,
        )?;
        Ok(path)
    }
}

/// The cargo target dir: `CARGO_TARGET_DIR`, else the nearest ancestor of the
/// running executable holding cargo's `CACHEDIR.TAG`, else `./target`.
pub fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .find(|dir| dir.join("CACHEDIR.TAG").exists())
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// The row of one shard with `row`'s load, unless `row` is one.
fn one_shard<'a>(rows: &'a [ShardRow], row: &ShardRow) -> Option<&'a ShardRow> {
    let same = |other: &&ShardRow| other.shards == 1 && other.kind() == row.kind();
    rows.iter().find(same).filter(|_| row.shards != 1)
}

/// `row`'s permits/s over `one`'s.
fn shard_ratio(row: &ShardRow, one: Option<&ShardRow>) -> Option<f64> {
    let ratio = row.permits_per_s() / one?.permits_per_s();
    ratio.is_finite().then_some(ratio)
}

fn shard_scenario(row: &ShardRow) -> String {
    let served = if row.served == row.shards as usize {
        String::new()
    } else {
        format!(" (**the nodes serve {} shard(s)**)", row.served)
    };
    let what =
        match &row.load {
            Load::Idle => format!("idle, {:.0} s", row.cost.cpu_window_s),
            Load::Grant(run, _) => format!(
                "grant path, {} clients, {} keys, wait {} ms, limit {}, each key's calls to its \
             shard's leader",
                run.clients, run.keys, run.round_wait_ms, run.limit
            ),
            Load::Lease(run, _) => format!(
            "SemaphoreQueue, {}, {} runners over {} keys, limit {}, {} permits/lease, backlog {}",
            if run.leases { "strict leases" } else { "no leases" },
            run.runners,
            run.keys,
            run.limit,
            run.permits_per_lease,
            run.backlog
        ),
        };
    format!("S = {}: {what}{served}", row.shards)
}

/// Each node's CPU, fsyncs and peer calls, the leader map, every shard's
/// entries, and for an idle row its cost over S = 1's.
fn shard_notes(row: &ShardRow, one: Option<&ShardRow>) -> String {
    let cost = &row.cost;
    let nodes: Vec<String> = cost
        .nodes
        .iter()
        .map(|node| {
            format!(
                "n{}: {:.2} cores, {} fsyncs/s, {} peer calls/s",
                node.id,
                cost.cores(node.cpu_s),
                thousands(cost.node_rate(node.syncs)),
                thousands(cost.node_rate(node.peer_calls))
            )
        })
        .collect();
    let leads: Vec<String> = row.leads.iter().map(|(_, led)| led.to_string()).collect();
    let mut notes = format!(
        "{}; leads {} of {} shard(s); Σ shards {} entries/s",
        nodes.join("; "),
        leads.join("/"),
        row.served,
        thousands(cost.shard_entries_per_s())
    );
    match &row.load {
        Load::Grant(_, result) => notes.push_str(&errors(result.errors)),
        Load::Lease(_, result) => {
            let under_leases = thousands(result.lease_cycles_per_s);
            let _ = write!(notes, "; {under_leases} permits/s under leases");
        }
        Load::Idle => {}
    }
    if let (Load::Idle, Some(one)) = (&row.load, one) {
        let peer = |row: &ShardRow| row.node_mean(|node| row.cost.node_rate(node.peer_calls));
        let cores = |row: &ShardRow| row.node_mean(|node| row.cost.cores(node.cpu_s));
        let _ = write!(
            notes,
            "; over S = 1 (node means): peer calls ×{:.1}, CPU ×{:.1}",
            peer(row) / peer(one),
            cores(row) / cores(one)
        );
    }
    match cost.shard_elections {
        Some(0) => {}
        Some(count) => {
            let _ = write!(notes, "; **{count} election(s) during the window**");
        }
        None => notes.push_str("; elections not read"),
    }
    notes
}

/// Loaded rows: the nodes' CPU spread against ±25 %, and S = 3 against 1.3× S = 1.
fn shard_target(row: &ShardRow, one: Option<&ShardRow>) -> String {
    if matches!(row.load, Load::Idle) {
        return "—".into();
    }
    let mut target = match row.cpu_spread() {
        Some((above, below)) => format!(
            "node CPU within ±{:.0}% of the mean: {:+.0}% / {:+.0}%: {}",
            TARGET_NODE_CPU_SPREAD * 100.0,
            above * 100.0,
            below * 100.0,
            if above <= TARGET_NODE_CPU_SPREAD && below >= -TARGET_NODE_CPU_SPREAD {
                "met"
            } else {
                "**missed**"
            }
        ),
        None => "node CPU spread: n/a".into(),
    };
    match shard_ratio(row, one) {
        Some(ratio) if row.shards == TARGET_RATIO_SHARDS => {
            let _ = write!(
                target,
                "; ≥ {TARGET_SHARDS_RATIO}× S = 1: {ratio:.2}×, {}",
                at_least(ratio, TARGET_SHARDS_RATIO)
            );
        }
        Some(ratio) => {
            let _ = write!(target, "; {ratio:.2}× S = 1");
        }
        None => {}
    }
    target
}

/// CPU µs per permit of each node, the clients and all (loaded), or each
/// node's share of a core (idle).
fn shard_cpu_cell(row: &ShardRow) -> String {
    let cost = &row.cost;
    let idle = matches!(row.load, Load::Idle);
    let nodes: Vec<String> = cost
        .nodes
        .iter()
        .map(|node| match idle {
            true => format!("n{} {:.1}%", node.id, cost.cores(node.cpu_s) * 100.0),
            false => format!("n{} {}", node.id, us(cost.us_per_cycle(node.cpu_s))),
        })
        .collect();
    match idle {
        true => format!("{} of a core", nodes.join(" · ")),
        false => format!(
            "{} · C {} · Σ {}",
            nodes.join(" · "),
            us(cost.us_per_cycle(cost.client_cpu_s)),
            us(cost.us_per_cycle(cost.total_s()))
        ),
    }
}

/// Every shard's log entries per second, the CPU of all processes per entry,
/// and the clients' calls per permit.
fn shard_entries_cell(row: &ShardRow) -> String {
    let cost = &row.cost;
    let mut cell = format!(
        "{} entries/s (Σ shards) · Σ {} µs/entry",
        thousands(cost.shard_entries_per_s()),
        us(cost.us_per_shard_entry(cost.total_s()))
    );
    if let Some(per_cycle) = cost.messages_per_cycle() {
        let _ = write!(cell, " · {per_cycle:.2} msgs/cycle");
    }
    cell
}

fn shard_json(row: &ShardRow, one: Option<&ShardRow>) -> Value {
    let cost = &row.cost;
    let (overhead_p50, overhead_p99, errors) = match &row.load {
        Load::Grant(_, result) => (
            Some(result.overhead_ms_p50),
            Some(result.overhead_ms_p99),
            Some(result.errors),
        ),
        _ => (None, None, None),
    };
    let leads: serde_json::Map<String, Value> = row
        .leads
        .iter()
        .map(|(id, led)| (id.to_string(), json!(led)))
        .collect();
    let spread = row
        .cpu_spread()
        .map(|(above, below)| json!({"maxOverMeanMinus1": above, "minOverMeanMinus1": below}));
    let model = row.model_ratio().map(|(leader, follower, ratio)| {
        json!({"leaderUsPerPermit": leader, "followerUsPerPermit": follower, "ratio": ratio})
    });
    json!({"section": "shards", "kind": row.kind(), "shards": row.shards,
        "shardsServed": row.served, "clients": row.clients(), "keys": row.keys(),
        "permitsPerS": row.permits_per_s(), "entriesPerS": finite(cost.shard_entries_per_s()),
        "overheadMsP50": overhead_p50, "overheadMsP99": overhead_p99, "errors": errors,
        "leads": leads, "nodeCpuSpread": spread,
        "ratioToOneShard": shard_ratio(row, one), "model": model, "cost": cost.to_json()})
}

/// The summary: every loaded S's permits/s over S = 1's, the model's ratio
/// from S = 1's grant row, and S = 3 against the target; `None` without
/// rows of one shard and more.
fn shard_ratios(rows: &[ShardRow]) -> Option<Row> {
    let loaded = |row: &&ShardRow| !matches!(row.load, Load::Idle);
    let ratios: Vec<(u32, &str, f64)> = rows
        .iter()
        .filter(loaded)
        .filter_map(|row| {
            Some((
                row.shards,
                row.kind(),
                shard_ratio(row, one_shard(rows, row))?,
            ))
        })
        .collect();
    if ratios.is_empty() {
        return None;
    }
    let measured: Vec<String> = ratios
        .iter()
        .map(|(shards, kind, ratio)| format!("S = {shards} {kind} {ratio:.2}×"))
        .collect();
    let at_target: Vec<String> = ratios
        .iter()
        .filter(|(shards, _, _)| *shards == TARGET_RATIO_SHARDS)
        .map(|(_, kind, ratio)| format!("{kind} {}", at_least(*ratio, TARGET_SHARDS_RATIO)))
        .collect();
    let model = rows.iter().find_map(ShardRow::model_ratio).map_or_else(
        || "model: n/a".to_owned(),
        |(leader, follower, ratio)| {
            format!(
                "model (S ≥ N, leaders spread): N·l / (l + (N − 1)·f) = {ratio:.2}× with S = 1's \
                 l {} and f {} µs/permit (grant row); on a machine whose cores all nodes share, \
                 the machine bounds it first (docs/scaling.md)",
                us(leader),
                us(follower)
            )
        },
    );
    Some(Row {
        section: "7 shards",
        scenario: "permits/s over S = 1, same run".into(),
        throughput: measured.join(", "),
        p50: "—".into(),
        p99: "—".into(),
        notes: model,
        target: format!(
            "≥ {TARGET_SHARDS_RATIO}× at S = {TARGET_RATIO_SHARDS}: {}",
            at_target.join("; ")
        ),
        cpu: NO_COST.into(),
        entries: NO_COST.into(),
        gaps: NO_COST.into(),
    })
}

fn at_least(value: f64, wanted: f64) -> String {
    if value >= wanted {
        format!("met ({:+.0}%)", (value / wanted - 1.0) * 100.0)
    } else {
        format!("**missed by {:.0}%**", (1.0 - value / wanted) * 100.0)
    }
}

fn at_most(value: f64, wanted: f64) -> String {
    if value <= wanted {
        "met".into()
    } else {
        format!("**missed by {:.0}%**", (value / wanted - 1.0) * 100.0)
    }
}

fn errors(count: u64) -> String {
    if count == 0 {
        String::new()
    } else {
        format!(", {count} errors")
    }
}

/// Bytes in MiB.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// `12,345` from `12345.4`.
pub(super) fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "n/a".into();
    }
    let digits = format!("{:.0}", value.abs());
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    if value < 0.0 {
        grouped.insert(0, '-');
    }
    grouped
}
