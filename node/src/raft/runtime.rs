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
//! One worker. Every log entry passes through openraft's core, both
//! replication tasks, the state machine and the peers' HTTP, task to task;
//! with two workers those hand-offs went from thread to thread, each a futex
//! wake and a context switch, ~60 of them per entry on every node. One worker
//! cut the CPU of a contended permit cycle by ~30 % (docs/operations.md,
//! "The Raft runtime's one worker"). What could hold that worker for long is
//! kept short or sent apart: snapshots are encoded and installed on blocking
//! threads, appends of more than two entries are encoded there, large appends
//! are decoded there, and reads and applies of many entries yield to the
//! runtime every slice, so heartbeats and append answers go out between two.
//!
//! A runtime of its own is not enough when the cores are saturated: three
//! nodes and their clients on two cores left Raft's threads waiting in the
//! run queue behind request parsing for longer than an election timeout. So
//! the API runtime's threads run at a lower CPU priority ([`API_NICENESS`]
//! above the process's): the kernel then gives Raft's threads the core first,
//! and the API side takes what is left. Raising one's own niceness needs no
//! privilege; lowering it does, so Raft's threads must never be created by an
//! API thread (they would inherit its niceness for good). `permitd serve`
//! therefore builds this runtime on the main thread before the API runtime,
//! and opens storage (whose WAL sync thread is Raft's too) on it.

use std::io;

use tokio::runtime::{Builder, Handle, Runtime};

/// Worker threads of the Raft runtime.
pub const RAFT_WORKER_THREADS: usize = 1;

/// How much nicer than the process the API runtime's threads run by default
/// (CFS gives a nice-0 thread about 3× the CPU of a nice-5 one when both are
/// runnable); `PERMITD_API_NICENESS` (0–19) overrides it, 0 turns it off.
pub const API_NICENESS: i32 = 5;
/// The variable that overrides [`API_NICENESS`].
pub const API_NICENESS_ENV: &str = "PERMITD_API_NICENESS";

/// [`API_NICENESS`], or the valid value of [`API_NICENESS_ENV`].
fn api_niceness() -> i32 {
    static NICENESS: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *NICENESS.get_or_init(|| {
        std::env::var(API_NICENESS_ENV)
            .ok()
            .and_then(|value| value.trim().parse::<i32>().ok())
            .filter(|value| (0..=MAX_NICENESS).contains(value))
            .unwrap_or(API_NICENESS)
    })
}
/// The niceness ceiling on Linux.
const MAX_NICENESS: i32 = 19;

/// Lowers the calling thread's CPU priority by [`api_niceness`]; the API
/// runtime calls it as each of its threads starts. A failure is logged and
/// ignored: the node still works, only without the priority split.
pub fn lower_this_threads_priority() {
    let thread = Some(rustix::thread::gettid());
    let lowered = rustix::process::getpriority_process(thread).and_then(|now| {
        rustix::process::setpriority_process(thread, (now + api_niceness()).min(MAX_NICENESS))
    });
    if let Err(error) = lowered {
        tracing::warn!(%error, "cannot lower an API thread's CPU priority");
    }
}

/// The calling thread's niceness (for tests and the startup log).
pub fn this_threads_niceness() -> io::Result<i32> {
    Ok(rustix::process::getpriority_process(Some(
        rustix::thread::gettid(),
    ))?)
}

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

    #[test]
    fn a_lowered_thread_is_nicer_and_threads_it_starts_inherit_it() {
        let base = this_threads_niceness().expect("niceness");
        let (lowered, inherited) = std::thread::spawn(move || {
            lower_this_threads_priority();
            let lowered = this_threads_niceness().expect("niceness");
            let inherited = std::thread::spawn(|| this_threads_niceness().expect("niceness"))
                .join()
                .expect("thread");
            (lowered, inherited)
        })
        .join()
        .expect("thread");
        assert_eq!(lowered, (base + api_niceness()).min(MAX_NICENESS));
        assert_eq!(
            inherited, lowered,
            "why Raft's threads must not start from API ones"
        );
        assert_eq!(
            this_threads_niceness().expect("niceness"),
            base,
            "per thread"
        );
    }
}
