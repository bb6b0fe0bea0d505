//! Prometheus metrics through the `metrics` facade.
//!
//! Names, in one place:
//! - `permitd_rounds_total`, `permitd_round_duration_seconds` (histogram): rounds
//!   this node ran as leader, from proposal to apply;
//! - `permitd_keys_held`, `permitd_keys_granted`, `permitd_keys_leased`,
//!   `permitd_keys_available` (gauges, no label): the number of keys the state
//!   holds and the sums of their usage, added up from the state at each scrape
//!   ([`publish_totals`]; nothing is kept per key for them), on every node;
//! - `permitd_key_granted`, `permitd_key_leased`, `permitd_key_available`,
//!   `permitd_key_limit` (gauges, label `key`): usage after the key's last applied entry, on every
//!   node, for the first [`MAX_KEYS_WITH_GAUGES`] keys this process sees only;
//! - `permitd_blocked_total` (label `reason`): permits left queued, by reason;
//! - `permitd_leader_changes_total`: leaders this node has seen come and go;
//! - `permitd_pending_requests`: requests parked for a round on this node;
//! - `permitd_early_reports_total`: grant reports of requests this node, as
//!   leader, applied with the next entry instead of the round;
//! - consensus health (`permitd_has_leader`, `permitd_is_leader`, term, indexes,
//!   follower lag): see `raft_metrics.rs`;
//! - HTTP calls by route and status, with latency: see `http_metrics.rs`;
//! - `permitd_snapshot_bytes` (gauge) and `permitd_snapshot_build_seconds`
//!   (histogram): the last snapshot this node built, from the storage crate;
//! - `permitd_wal_syncs_total`, `permitd_wal_sync_seconds` (histogram) and
//!   `permitd_wal_sync_batch_entries`: the write-ahead log's group commits,
//!   `permitd_wal_sync_moves_total{to}`: their moves between the Raft worker
//!   and the sync thread, and `permitd_wal_read_entries_total{from}`: its
//!   reads, from cache or disk, from the storage crate;
//! - stalls (`permitd_raft_leader_contact_gap_seconds` on followers,
//!   `permitd_runtime_tick_lateness_seconds`): see `raft/stall_probe.rs`.
//!
//! # Cardinality
//!
//! A Prometheus series costs memory in the exporter, in every scrape and in the
//! server that stores it, so a series per key does not scale to 100,000 keys.
//! Per-key gauges are kept for at most [`MAX_KEYS_WITH_GAUGES`] keys, first come:
//! a key gets its series the first time an entry touching it applies, and keeps
//! them for the life of the process (a removed key reads as empty), so slots are
//! never recycled and the series stay bounded whatever the churn. Every key
//! counts in the `permitd_keys_*` totals; the usage of any one key is in the
//! `/v1/semaphores` listing.

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use permitd_core::Usage;

pub const ROUNDS: &str = "permitd_rounds_total";
pub const ROUND_DURATION: &str = "permitd_round_duration_seconds";
pub const KEY_GRANTED: &str = "permitd_key_granted";
pub const KEY_LEASED: &str = "permitd_key_leased";
pub const KEY_AVAILABLE: &str = "permitd_key_available";
pub const KEY_LIMIT: &str = "permitd_key_limit";
pub const KEYS_HELD: &str = "permitd_keys_held";
pub const KEYS_GRANTED: &str = "permitd_keys_granted";
pub const KEYS_LEASED: &str = "permitd_keys_leased";
pub const KEYS_AVAILABLE: &str = "permitd_keys_available";
pub const BLOCKED: &str = "permitd_blocked_total";
pub const LEADER_CHANGES: &str = "permitd_leader_changes_total";
/// Handovers of a shard this node started (`leader/handover.rs`), by shard
/// and outcome (`handed_over`, or `kept` when the preferred node did not
/// take the shard in time).
pub const HANDOVERS: &str = "permitd_handovers_total";

pub const PENDING: &str = "permitd_pending_requests";
pub const ABANDONED: &str = "permitd_requests_abandoned_total";
pub const EARLY_REPORTS: &str = "permitd_early_reports_total";
/// Requests held on arrival because a round of their key would have served
/// nobody (`leader/rounds.rs`, `park_or_hold`).
pub const HELD_ON_ARRIVAL: &str = "permitd_requests_held_on_arrival_total";
pub const READS_CONFIRMED_AGAIN: &str = "permitd_read_confirmations_retried_total";

/// Most keys with per-key gauges (four series each) in one process.
pub const MAX_KEYS_WITH_GAUGES: usize = 1_000;

/// Round latency buckets, in seconds: 1 ms to 10 s.
const ROUND_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Snapshot build buckets, in seconds: 1 ms to 2 min.
const SNAPSHOT_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// WAL group-commit batch buckets, in seconds: 100 µs to 2.5 s.
const WAL_SYNC_BUCKETS_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder once and returns the handle that renders it.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(ROUND_DURATION.into()), ROUND_BUCKETS_SECONDS)
                .and_then(|builder| {
                    builder.set_buckets_for_metric(
                        Matcher::Full(crate::observe::http_metrics::HTTP_DURATION.into()),
                        crate::observe::http_metrics::HTTP_BUCKETS_SECONDS,
                    )
                })
                .and_then(|builder| {
                    builder.set_buckets_for_metric(
                        Matcher::Full(permitd_storage::SNAPSHOT_DURATION.into()),
                        SNAPSHOT_BUCKETS_SECONDS,
                    )
                })
                .and_then(|builder| {
                    builder.set_buckets_for_metric(
                        Matcher::Full(permitd_storage::WAL_SYNC_DURATION.into()),
                        WAL_SYNC_BUCKETS_SECONDS,
                    )
                })
                .and_then(|builder| {
                    builder.set_buckets_for_metric(
                        Matcher::Full(crate::raft::stall_probe::LEADER_CONTACT_GAP.into()),
                        crate::raft::stall_probe::LEADER_CONTACT_GAP_BUCKETS_SECONDS,
                    )
                })
                .and_then(|builder| {
                    builder.set_buckets_for_metric(
                        Matcher::Full(crate::raft::stall_probe::TICK_LATENESS.into()),
                        crate::raft::stall_probe::TICK_LATENESS_BUCKETS_SECONDS,
                    )
                })
                .expect("the bucket lists are not empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder (a test harness) may already be installed; rendering
            // our own handle then shows nothing, which beats failing to start.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed");
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    metrics::describe_counter!(ROUNDS, "Rounds run by this node as leader.");
    metrics::describe_histogram!(
        ROUND_DURATION,
        metrics::Unit::Seconds,
        "Round latency, from proposal to apply."
    );
    metrics::describe_gauge!(KEY_GRANTED, "Permits granted and not released, per key.");
    metrics::describe_gauge!(KEY_LEASED, "Live lease footprint, per key.");
    metrics::describe_gauge!(KEY_AVAILABLE, "Permits grants may still receive, per key.");
    metrics::describe_gauge!(KEY_LIMIT, "The limit each key runs with, per key.");
    metrics::describe_gauge!(KEYS_HELD, "Keys the replicated state holds.");
    metrics::describe_gauge!(KEYS_GRANTED, "Permits granted and not released, all keys.");
    metrics::describe_gauge!(KEYS_LEASED, "Live lease footprint, all keys.");
    metrics::describe_gauge!(
        KEYS_AVAILABLE,
        "Permits grants may still receive, all keys."
    );
    metrics::describe_counter!(BLOCKED, "Permits left queued by a round, by reason.");
    metrics::describe_counter!(
        LEADER_CHANGES,
        "Leader changes seen by this node, by shard."
    );
    metrics::describe_counter!(
        HANDOVERS,
        "Handovers of a shard to its preferred leader this node started, by shard and outcome."
    );
    metrics::describe_gauge!(PENDING, "Requests waiting for a round on this node.");
    metrics::describe_counter!(
        ABANDONED,
        "Requests left out of their round because their caller went away."
    );
    metrics::describe_counter!(
        EARLY_REPORTS,
        "Grant reports of requests applied with the next entry, ahead of the round."
    );
    metrics::describe_counter!(
        HELD_ON_ARRIVAL,
        "Requests held on arrival, without a round, because a round of their key would have served nobody."
    );
    metrics::describe_counter!(
        READS_CONFIRMED_AGAIN,
        "Leadership confirmations for a linearizable read asked again because a quorum did not answer within a heartbeat interval."
    );
    crate::observe::raft_metrics::describe();
    crate::observe::http_metrics::describe();
    crate::raft::stall_probe::describe();
    crate::raft::stall_clock::describe();
    crate::raft::peer_logs::describe();
    crate::raft::commit_ride::describe();
    crate::raft::early_appends::describe();
    crate::raft::election_guard::describe();
    crate::raft::heartbeats::describe();
    crate::raft::liveness::describe();
    crate::raft::quiescence::describe();
    permitd_storage::describe_snapshot_metrics();
    permitd_storage::describe_wal_metrics();
}

pub fn round_finished(elapsed: Duration) {
    metrics::counter!(ROUNDS).increment(1);
    metrics::histogram!(ROUND_DURATION).record(elapsed.as_secs_f64());
}

/// Requests left out of an entry because their caller went away.
pub fn requests_abandoned(count: usize) {
    if count > 0 {
        metrics::counter!(ABANDONED).increment(count as u64);
    }
}

pub fn pending_changed(delta: i64) {
    metrics::gauge!(PENDING).increment(delta as f64);
}

pub fn early_reports(reports: usize) {
    metrics::counter!(EARLY_REPORTS).increment(reports as u64);
}

pub fn held_on_arrival() {
    metrics::counter!(HELD_ON_ARRIVAL).increment(1);
}

pub fn leader_changed(shard: u32, leader: Option<u64>) {
    tracing::info!(?leader, shard, "leader changed");
    metrics::counter!(LEADER_CHANGES, "shard" => shard.to_string()).increment(1);
}

pub fn blocked(reason: &'static str, count: u64) {
    metrics::counter!(BLOCKED, "reason" => reason).increment(count);
}

/// Keys added up per hold of the state's read lock by [`publish_totals`]: an
/// apply waits at most one slice (well under a millisecond).
const KEYS_PER_READ: usize = 4_096;

/// Totals younger than this are served again: a burst of scrapes walks the keys
/// at most once per interval, whatever their number.
const TOTALS_REUSED_FOR: Duration = Duration::from_secs(1);

/// Exports the all-keys gauges, added up from the state now (the node's clock):
/// one walk over every key at each scrape, a slice at a time, rather than a copy
/// of every key's last usage kept between scrapes (80 B per key). Blocking: at
/// 100,000 keys it takes a few milliseconds of CPU, at most once per
/// [`TOTALS_REUSED_FOR`].
pub fn publish_totals(states: &[permitd_storage::SharedState], clock: &crate::clock::Clock) {
    static LAST_WALK: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
    // Held for the whole walk: concurrent scrapes wait for it and then reuse it.
    let mut last_walk = LAST_WALK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if last_walk.is_some_and(|at| at.elapsed() < TOTALS_REUSED_FOR) {
        return;
    }
    let now_ms = clock.now_ms();
    let mut totals = permitd_core::engine::usage::UsageCounts::default();
    let mut held = 0;
    for state in states {
        let mut after: Option<std::sync::Arc<str>> = None;
        loop {
            let (slice, next) = state.read(|semaphores| {
                semaphores.add_up_usage(after.as_deref(), KEYS_PER_READ, now_ms)
            });
            totals += slice;
            match next {
                Some(key) => after = Some(key),
                None => break,
            }
        }
        held += state.read(|semaphores| semaphores.keys().len());
    }
    metrics::gauge!(KEYS_HELD).set(held as f64);
    metrics::gauge!(KEYS_GRANTED).set(totals.granted as f64);
    metrics::gauge!(KEYS_LEASED).set(totals.leased as f64);
    metrics::gauge!(KEYS_AVAILABLE).set(totals.available as f64);
    *last_walk = Some(std::time::Instant::now());
}

/// The bounded per-key series.
///
/// Invariant: `labelled` never exceeds [`MAX_KEYS_WITH_GAUGES`] and never shrinks.
#[derive(Debug, Default)]
pub struct UsageGauges {
    /// Keys given per-key series, first come.
    labelled: HashSet<String>,
}

impl UsageGauges {
    /// Whether `key` has (or may still get) per-key series.
    pub fn wants(&self, key: &str) -> bool {
        self.labelled.contains(key) || self.labelled.len() < MAX_KEYS_WITH_GAUGES
    }

    /// Exports `key`'s usage after an applied entry (empty once the state no
    /// longer holds the key), if the key has or may still get series.
    pub fn update(&mut self, key: &str, usage: &Usage) {
        if self.wants(key) {
            self.labelled.insert(key.to_owned());
            key_usage(key, usage);
        }
    }
}

fn key_usage(key: &str, usage: &Usage) {
    let key = key.to_owned();
    metrics::gauge!(KEY_GRANTED, "key" => key.clone()).set(usage.granted as f64);
    metrics::gauge!(KEY_LEASED, "key" => key.clone()).set(usage.leased as f64);
    metrics::gauge!(KEY_AVAILABLE, "key" => key.clone()).set(usage.available as f64);
    metrics::gauge!(KEY_LIMIT, "key" => key).set(usage.limit as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(granted: u64, leased: u64, available: u64) -> Usage {
        Usage {
            granted,
            leased,
            available,
            ..Usage::default()
        }
    }

    #[test]
    fn per_key_series_are_capped_first_come() {
        let mut gauges = UsageGauges::default();
        for index in 0..MAX_KEYS_WITH_GAUGES + 10 {
            gauges.update(&format!("key-{index}"), &usage(1, 0, 0));
        }
        assert_eq!(gauges.labelled.len(), MAX_KEYS_WITH_GAUGES);
        assert!(
            gauges.labelled.contains("key-0"),
            "the first keys keep their series"
        );
        assert!(!gauges.wants("key-late"), "no slot left for a new key");
    }
}
