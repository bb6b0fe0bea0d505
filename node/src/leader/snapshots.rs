//! Snapshots on a time budget, beside openraft's entry budget.
//!
//! openraft builds a snapshot every `snapshot_every_logs` entries (staggered per
//! node, see `app::raft_config`). A cluster that writes slowly would then keep
//! an old snapshot and a long log for hours, and a restart would replay all of
//! it. So each node also asks for a snapshot once `snapshot_every_ms` has passed
//! since its last one, if anything was applied since; the interval is staggered
//! per node id like the entry budget, so the nodes of a cluster do not build at
//! the same moment.

use std::time::Duration;

use openraft::LogId;
use permitd_storage::NodeId;
use tokio::time::Instant;

use crate::raft::Raft;

/// Node `id`'s share of a budget: `every` stretched by a quarter per node id
/// (ids 1, 2, 3 wait 1, 1.25, 1.5 × `every`).
pub fn staggered(id: NodeId, every: u64) -> u64 {
    every + every * (id.saturating_sub(1) % 4) / 4
}

/// Starts the task; it ends when Raft shuts down.
pub fn start(raft: Raft, id: NodeId, every_ms: u64) {
    let interval = Duration::from_millis(staggered(id, every_ms));
    crate::seams::spawn(run(raft, interval));
}

/// How often the task looks whether a snapshot was built meanwhile (by the
/// entry budget, or installed from the leader), so the time budget counts from
/// it. It looks instead of waiting on the metrics: openraft sends those after
/// every turn of its loop, several times per entry, and each send would wake
/// this task.
fn look_every(interval: Duration) -> Duration {
    (interval / 8).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

async fn run(raft: Raft, interval: Duration) {
    let metrics = raft.data_metrics();
    let mut last = Taken {
        log_id: metrics.borrow().snapshot,
        at: Instant::now(),
    };
    loop {
        let due = last.at + interval;
        tokio::time::sleep_until(due.min(Instant::now() + look_every(interval))).await;
        if metrics.has_changed().is_err() {
            return; // Raft shut down.
        }
        let (applied, snapshot) = {
            let metrics = metrics.borrow();
            (metrics.last_applied, metrics.snapshot)
        };
        if snapshot != last.log_id {
            // Built by either budget, or installed from the leader.
            last = Taken {
                log_id: snapshot,
                at: Instant::now(),
            };
        } else if Instant::now() >= due {
            if applied.map(|log_id| log_id.index) > snapshot.map(|log_id| log_id.index) {
                if let Err(error) = raft.trigger().snapshot().await {
                    tracing::warn!(%error, "cannot ask for a snapshot");
                    return;
                }
            }
            // Counted from the request: a build in progress is not asked for again.
            last.at = Instant::now();
        }
    }
}

/// The last snapshot seen and when.
struct Taken {
    log_id: Option<LogId<NodeId>>,
    at: Instant,
}
