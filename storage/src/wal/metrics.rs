//! Metrics of the write-ahead log's group commit, through the `metrics` facade
//! (a no-op until the node installs its Prometheus recorder):
//! - `permitd_wal_syncs_total`: group-commit batches (each one `fdatasync` per written
//!   segment, usually one);
//! - `permitd_wal_sync_seconds`: how long a round's fsyncs took, as a histogram;
//! - `permitd_wal_sync_batch_entries`: log entries one round made durable, as a
//!   histogram (the group-commit batch size; 0 for a vote or truncate alone).

use std::time::Duration;

pub const WAL_SYNCS: &str = "permitd_wal_syncs_total";
pub const WAL_SYNC_DURATION: &str = "permitd_wal_sync_seconds";
pub const WAL_SYNC_BATCH_ENTRIES: &str = "permitd_wal_sync_batch_entries";

/// Records one finished group-commit batch.
pub(crate) fn synced(entries: u64, elapsed: Duration) {
    metrics::counter!(WAL_SYNCS).increment(1);
    metrics::histogram!(WAL_SYNC_DURATION).record(elapsed.as_secs_f64());
    metrics::histogram!(WAL_SYNC_BATCH_ENTRIES).record(entries as f64);
}

/// Registers the descriptions shown in `/metrics`.
pub fn describe_wal_metrics() {
    metrics::describe_counter!(
        WAL_SYNCS,
        metrics::Unit::Count,
        "Write-ahead log group-commit batches ( one fdatasync covers every append since the last)."
    );
    metrics::describe_histogram!(
        WAL_SYNC_DURATION,
        metrics::Unit::Seconds,
        "Time one write-ahead log group-commit batch took (its fdatasyncs)."
    );
    metrics::describe_histogram!(
        WAL_SYNC_BATCH_ENTRIES,
        metrics::Unit::Count,
        "Log entries one write-ahead log group-commit batch made durable."
    );
}
