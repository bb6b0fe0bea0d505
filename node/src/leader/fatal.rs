//! A Raft core that stopped on its own is fatal to the node.
//!
//! openraft stops its core on a storage error or a panic and reports it through
//! `RaftMetrics::running_state` (or by dropping the metrics sender). Such a node
//! still answers HTTP but can never apply or elect again, so it must not look
//! healthy: `/healthz` answers 503 while [`stopped`] says so, and `serve` exits
//! non-zero on [`wait`] so a supervisor restarts the process.

use crate::raft::Raft;

/// Why the Raft core stopped, if it did.
pub fn stopped(raft: &Raft) -> Option<String> {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    metrics
        .running_state
        .as_ref()
        .err()
        .map(ToString::to_string)
}

/// Resolves when the Raft core stops, with the reason.
pub async fn wait(raft: &Raft) -> String {
    let mut metrics = raft.metrics();
    loop {
        if let Err(fatal) = &metrics.borrow_and_update().running_state {
            return fatal.to_string();
        }
        if metrics.changed().await.is_err() {
            return "the Raft core ended without a report".into();
        }
    }
}
