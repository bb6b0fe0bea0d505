//! Prometheus metrics through the `metrics` facade.
//!
//! Names, in one place:
//! - `permitd_rounds_total`, `permitd_round_duration_seconds` (histogram): rounds
//!   this node ran as leader, from proposal to apply;
//! - `permitd_key_granted`, `permitd_key_leased`, `permitd_key_available`
//!   (gauges, label `key`): usage after the key's last applied entry, on every node;
//! - `permitd_blocked_total` (label `reason`): permits left queued, by reason;
//! - `permitd_leader_changes_total`: leaders this node has seen come and go;
//! - `permitd_pending_requests`: requests parked for a round on this node.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use permitd_core::Usage;

pub const ROUNDS: &str = "permitd_rounds_total";
pub const ROUND_DURATION: &str = "permitd_round_duration_seconds";
pub const KEY_GRANTED: &str = "permitd_key_granted";
pub const KEY_LEASED: &str = "permitd_key_leased";
pub const KEY_AVAILABLE: &str = "permitd_key_available";
pub const BLOCKED: &str = "permitd_blocked_total";
pub const LEADER_CHANGES: &str = "permitd_leader_changes_total";
pub const PENDING: &str = "permitd_pending_requests";

/// Round latency buckets, in seconds: 1 ms to 10 s.
const ROUND_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder once and returns the handle that renders it.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(ROUND_DURATION.into()), ROUND_BUCKETS_SECONDS)
                .expect("the bucket list is not empty");
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
    metrics::describe_counter!(BLOCKED, "Permits left queued by a round, by reason.");
    metrics::describe_counter!(LEADER_CHANGES, "Leader changes seen by this node.");
    metrics::describe_gauge!(PENDING, "Requests waiting for a round on this node.");
}

pub fn round_finished(elapsed: Duration) {
    metrics::counter!(ROUNDS).increment(1);
    metrics::histogram!(ROUND_DURATION).record(elapsed.as_secs_f64());
}

pub fn pending_changed(delta: i64) {
    metrics::gauge!(PENDING).increment(delta as f64);
}

pub fn leader_changed(leader: Option<u64>) {
    tracing::info!(?leader, "leader changed");
    metrics::counter!(LEADER_CHANGES).increment(1);
}

pub fn blocked(reason: &'static str, count: u64) {
    metrics::counter!(BLOCKED, "reason" => reason).increment(count);
}

pub fn key_usage(key: &str, usage: &Usage) {
    let key = key.to_owned();
    metrics::gauge!(KEY_GRANTED, "key" => key.clone()).set(usage.granted as f64);
    metrics::gauge!(KEY_LEASED, "key" => key.clone()).set(usage.leased as f64);
    metrics::gauge!(KEY_AVAILABLE, "key" => key).set(usage.available as f64);
}
