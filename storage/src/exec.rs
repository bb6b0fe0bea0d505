//! Where the store's blocking work runs: on threads (production) or inline in
//! the calling task (a deterministic simulator, one thread for everything).
//!
//! Blocking work is the write-ahead log's group commit (an `fdatasync` loop),
//! opening the store (reading the log and the snapshot), building and
//! installing a snapshot (encoding and writing its file) and deleting purged
//! segments. With threads, none of it stalls a runtime worker; inline, nothing
//! runs on a thread the simulator does not schedule, so a run is the same
//! every time for the same seed.

use std::fmt;

/// How the store runs its blocking work; chosen in [`crate::Options`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Exec {
    /// Production: the group commit on a thread of its own
    /// (`permitd-wal-sync`), the rest on tokio's blocking pool
    /// (`spawn_blocking`).
    #[default]
    Threads,
    /// No thread is created and `spawn_blocking` is never called: the group
    /// commit is a task on the current tokio runtime (`tokio::spawn`, so the
    /// store must be opened inside one), and the rest runs in the task that
    /// asked for it, blocking it for the duration. On a current-thread
    /// runtime everything then runs on its one thread. For a simulated disk,
    /// whose operations return at once. A panic in that work is the caller's
    /// panic, not an error.
    Inline,
}

/// Blocking work that did not finish: its thread panicked or the runtime is
/// shutting down.
#[derive(Debug)]
pub(crate) struct TaskFailed(String);

impl fmt::Display for TaskFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Exec {
    /// Runs blocking `work` on tokio's blocking pool, or right here.
    pub(crate) async fn blocking<T, W>(self, work: W) -> Result<T, TaskFailed>
    where
        T: Send + 'static,
        W: FnOnce() -> T + Send + 'static,
    {
        match self {
            Exec::Threads => tokio::task::spawn_blocking(work)
                .await
                .map_err(|error| TaskFailed(error.to_string())),
            Exec::Inline => Ok(work()),
        }
    }
}
