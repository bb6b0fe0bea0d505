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
///
/// Waits on the server metrics, which change only with the vote, the role or
/// the membership, and whose sender the core drops when it ends: openraft
/// sends the full metrics after every turn of its loop, several times per log
/// entry, and a waiter on those was woken (a futex and a context switch on
/// this thread) for each of them.
pub async fn wait(raft: &Raft) -> String {
    let mut server = raft.server_metrics();
    loop {
        if let Some(fatal) = stopped(raft) {
            return fatal;
        }
        if server.changed().await.is_err() {
            return stopped(raft).unwrap_or_else(|| "the Raft core ended without a report".into());
        }
    }
}
