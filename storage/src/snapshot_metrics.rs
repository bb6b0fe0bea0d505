//! Metrics of snapshot builds, through the `metrics` facade (a no-op until the
//! node installs its Prometheus recorder):
//! - `permitd_snapshot_bytes`: size of the last snapshot this node built;
//! - `permitd_snapshot_build_seconds`: how long building one took (encode,
//!   store and flush), as a histogram.

use std::time::Duration;

pub const SNAPSHOT_BYTES: &str = "permitd_snapshot_bytes";
pub const SNAPSHOT_DURATION: &str = "permitd_snapshot_build_seconds";

/// Records one finished build.
pub fn snapshot_built(bytes: usize, elapsed: Duration) {
    metrics::gauge!(SNAPSHOT_BYTES).set(bytes as f64);
    metrics::histogram!(SNAPSHOT_DURATION).record(elapsed.as_secs_f64());
}

/// Registers the descriptions shown in `/metrics`.
pub fn describe_snapshot_metrics() {
    metrics::describe_gauge!(
        SNAPSHOT_BYTES,
        metrics::Unit::Bytes,
        "Size of the last snapshot this node built."
    );
    metrics::describe_histogram!(
        SNAPSHOT_DURATION,
        metrics::Unit::Seconds,
        "Time to build, store and flush one snapshot."
    );
}
