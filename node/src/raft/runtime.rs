//! The Raft runtime: openraft's core, its replication and state-machine tasks,
//! the election guard and the `/raft/*` listener run on threads of their own.
//!
//! Why: everything else a node does — parsing and answering client calls, the
//! rounds driver, metrics scrapes, the event stream — runs on the API runtime,
//! which `permitd up` gives a single worker thread. On one shared runtime a
//! burst of large requests or a long scrape kept the leader's heartbeats from
//! leaving for longer than an election timeout, and the followers elected a new
//! leader (issue 25; `tests/tests/shipped_timings.rs`). On a runtime of its
//! own, Raft work waits only for the OS scheduler, which shares the cores
//! between runnable threads within milliseconds.
//!
//! Two workers: one can send heartbeats and answer appends while the other
//! applies a large entry or encodes a snapshot.

use std::io;

use tokio::runtime::{Builder, Handle, Runtime};

/// Worker threads of the Raft runtime.
pub const RAFT_WORKER_THREADS: usize = 2;

/// Owns the Raft runtime's threads; stops them without waiting when dropped,
/// which is allowed inside async code (dropping a `Runtime` there panics).
#[derive(Debug)]
pub struct RaftRuntime(Option<Runtime>);

impl RaftRuntime {
    /// Starts the runtime's threads (named `permitd-raft`).
    pub fn start() -> io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(RAFT_WORKER_THREADS)
            .thread_name("permitd-raft")
            .enable_all()
            .build()?;
        Ok(Self(Some(runtime)))
    }

    /// Where Raft's tasks are spawned.
    pub fn handle(&self) -> Handle {
        self.0
            .as_ref()
            .expect("the runtime lives until dropped")
            .handle()
            .clone()
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn its_tasks_run_on_its_own_threads_and_it_drops_inside_async_code() {
        let runtime = RaftRuntime::start().expect("runtime");
        let name = runtime
            .handle()
            .spawn(async { std::thread::current().name().map(str::to_owned) })
            .await
            .expect("task");
        assert_eq!(name.as_deref(), Some("permitd-raft"));
        drop(runtime);
    }
}
