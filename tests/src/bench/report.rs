//! The bench's output: one markdown table (every section, each latency beside
//! the fsync floor, each target with how far it is met or missed, each
//! throughput row with its CPU, log entries and calls per cycle) and the same
//! rows as JSON.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::cpu::Cost;
use super::failover::FailoverResult;
use super::floor::FloorResult;
use super::grant::{GrantResult, GrantRun};
use super::lease::{LeaseResult, LeaseRun};
use super::scale::ScalePoint;

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
/// A freed permit's idle time before it is admitted again, contended run, p50.
const TARGET_REUSE_GAP_MS_P50: f64 = 3.0;
/// Resident memory per idle key.
const TARGET_RSS_BYTES_PER_KEY: f64 = 1_024.0;

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
             from the leader over the window, both followers together, from the nodes' \
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
        for name in ["PERMITD_BENCH_TOML", "PERMITD_BENCH_RAFT_TIMINGS"]
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
