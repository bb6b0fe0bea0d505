//! Metrics of the write-ahead log's group commit, through the `metrics` facade
//! (a no-op until the node installs its Prometheus recorder):
//! - `permitd_wal_syncs_total`: group-commit batches (each one `fdatasync` per written
//!   segment, usually one);
//! - `permitd_wal_sync_seconds`: how long a round's fsyncs took, as a histogram;
//! - `permitd_wal_sync_batch_entries`: log entries one round made durable, as a
//!   histogram (the group-commit batch size; 0 for a vote or truncate alone);
//! - `permitd_wal_sync_moves_total{to="task"|"thread"}`: the group commit
//!   moved between the task on the Raft runtime and the sync thread (a sync
//!   slower than 2 ms moves it to the thread; `wal/group_commit.rs`);
//! - `permitd_wal_read_entries_total{from="cache"|"disk"}`: entries read back
//!   (for replication and apply), from the cache of recent entries or from
//!   the segment files.

use std::time::Duration;

pub const WAL_SYNCS: &str = "permitd_wal_syncs_total";
pub const WAL_SYNC_DURATION: &str = "permitd_wal_sync_seconds";
pub const WAL_SYNC_BATCH_ENTRIES: &str = "permitd_wal_sync_batch_entries";
pub const WAL_READ_ENTRIES: &str = "permitd_wal_read_entries_total";
pub const WAL_SYNC_MOVES: &str = "permitd_wal_sync_moves_total";

/// Records one finished group-commit batch.
pub(crate) fn synced(entries: u64, elapsed: Duration) {
    metrics::counter!(WAL_SYNCS).increment(1);
    metrics::histogram!(WAL_SYNC_DURATION).record(elapsed.as_secs_f64());
    metrics::histogram!(WAL_SYNC_BATCH_ENTRIES).record(entries as f64);
}

/// Records that the group commit moved to the task (`to_task`) or the thread.
pub(crate) fn moved(to_task: bool) {
    let to = if to_task { "task" } else { "thread" };
    metrics::counter!(WAL_SYNC_MOVES, "to" => to).increment(1);
}

/// Records one read: entries from the segment files and from the cache.
pub(crate) fn read(on_disk: usize, cached: usize) {
    if on_disk > 0 {
        metrics::counter!(WAL_READ_ENTRIES, "from" => "disk").increment(on_disk as u64);
    }
    if cached > 0 {
        metrics::counter!(WAL_READ_ENTRIES, "from" => "cache").increment(cached as u64);
    }
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
    metrics::describe_counter!(
        WAL_SYNC_MOVES,
        metrics::Unit::Count,
        "Moves of the write-ahead log's group commit between a task on the Raft runtime (fast disk) and its own thread (a sync slower than 2 ms)."
    );
    metrics::describe_counter!(
        WAL_READ_ENTRIES,
        metrics::Unit::Count,
        "Log entries read back for replication and apply, by where they came from: the cache of recent entries, or the segment files."
    );
}
