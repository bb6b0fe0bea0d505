//! What a node takes from the world around it, gathered in one place so that
//! the simulator (`sim/`) can hand a node simulated ones and production code
//! has one obvious default: [`Seams::production`].
//!
//! Each seam is the narrowest point at which the world enters:
//! - the network: every outgoing call (Raft RPC, pre-votes, forwarding to the
//!   leader, its readiness probe) through a `permitd_transport::Transport`:
//!   the production HTTP clients and peer streams `app.rs` builds, or the
//!   simulated network (Raft calls may have a transport of their own);
//! - the wall clock ([`Clock`]): entries' `now`, lease expiry in usage reads;
//! - the round timer: a Linux timerfd in production (sub-millisecond), tokio's
//!   timer in the simulator, whose paused clock a timerfd cannot see;
//! - randomness: the election guard's timeout draws, from the OS's entropy or
//!   from the simulation's seed;
//! - the disk under the store (`permitd_storage::disk`): the real file
//!   system, or the simulator's in-memory one with its power cuts;
//! - blocking work (the WAL's group commit, opening the store, snapshots,
//!   parsing or decoding a large body): on threads in production, inline in
//!   the simulator, where another thread would finish in real time, not in
//!   the simulation's (`permitd_storage::Exec`).
//!
//! - when spawned tasks start ([`spawn`]): at once in production; in the
//!   simulator, whose one-threaded runtime would otherwise always run tasks in
//!   the order they were spawned, some start a few yields or milliseconds late,
//!   as on a busy multi-threaded runtime ([`jitter_spawns`]).
//!
//! Durations and deadlines use `tokio::time::Instant` throughout the node, so
//! the simulator's paused runtime clock drives them without a seam.

use std::cell::RefCell;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use permitd_storage::disk::{Disk, OsDisk};
use permitd_storage::Exec;
use permitd_transport::Transport;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::clock::Clock;

/// A node's seams.
#[derive(Debug, Clone)]
pub struct Seams {
    pub clock: Clock,
    /// Round deadlines on a timerfd (production) or on tokio's timer.
    pub precise_timer: bool,
    /// Seeds the node's random draws; `None`: the OS's entropy.
    pub seed: Option<u64>,
    /// Where blocking work runs: threads, or inline on the calling task
    /// ([`Seams::blocking`], and the store's).
    pub exec: Exec,
    /// The store's file system; `None`: the real one.
    pub disk: Option<Arc<dyn Disk>>,
    /// What every outgoing call is sent through; `None`: the production
    /// HTTP clients built from the node's settings (TLS, timeouts).
    pub transport: Option<Transport>,
    /// What Raft calls to peers are sent through; `None`: `transport` where
    /// one is given, else the production peer streams (`app.rs`).
    pub peer_transport: Option<Transport>,
}

impl Seams {
    /// Where the store in `dir` lives and runs its blocking work.
    pub fn storage(&self, dir: std::path::PathBuf) -> permitd_storage::Options {
        match &self.disk {
            Some(disk) => permitd_storage::Options::with_disk(dir, disk.clone(), self.exec),
            None => permitd_storage::Options::with_disk(dir, Arc::new(OsDisk), self.exec),
        }
    }

    /// The real world: system clock, timerfd, OS entropy.
    pub fn production() -> Self {
        Self {
            clock: Clock::System,
            precise_timer: true,
            seed: None,
            exec: Exec::Threads,
            disk: None,
            transport: None,
            peer_transport: None,
        }
    }

    /// A random source for one of the node's parts: seeded (`seed` mixed with
    /// `stream`, so that two parts draw different numbers) or from the OS.
    pub fn rng(&self, stream: u64) -> Mutex<StdRng> {
        Mutex::new(match self.seed {
            Some(seed) => StdRng::seed_from_u64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            None => StdRng::from_os_rng(),
        })
    }
}

impl Seams {
    /// Runs `work` off the async workers (production) or inline (the
    /// simulator). A panic in `work` is an error either way, as a blocking
    /// task's is.
    pub async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, BlockingFailed> {
        if self.exec == Exec::Inline {
            return std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .map_err(|_| BlockingFailed("the work panicked".into()));
        }
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|error| BlockingFailed(error.to_string()))
    }
}

thread_local! {
    /// The draws of [`spawn`]'s start delays: set by the simulator, for the
    /// one thread a simulated cluster runs on; `None` (no delay) otherwise.
    static SPAWN_JITTER: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Makes tasks that the node spawns on this thread start late at random, drawn
/// from `seed` (the simulator), or at once again (`None`).
///
/// Why: tokio's current-thread runtime runs tasks in the order they were
/// woken, so a simulated node never sees two tasks race the way they do on a
/// production runtime's several workers, where a task spawned later often runs
/// first. Code that only works in spawn order (the rounds driver once proposed
/// each entry from a task of its own, and entries reached the log out of
/// order) would pass every seed. With jitter, 1 task in 5 yields 1–3 times
/// before its first poll, and 1 in 10 starts 1–25 ms late (a loaded
/// runtime; the out-of-order bug showed under load).
pub fn jitter_spawns(seed: Option<u64>) {
    SPAWN_JITTER.with(|jitter| *jitter.borrow_mut() = seed.map(StdRng::seed_from_u64));
}

/// How late a task starts.
enum StartDelay {
    Yields(u32),
    Sleep(Duration),
}

impl StartDelay {
    fn draw() -> Option<Self> {
        SPAWN_JITTER.with(|jitter| {
            let mut jitter = jitter.borrow_mut();
            let rng = jitter.as_mut()?;
            match rng.random_range(0..10) {
                0 | 1 => Some(Self::Yields(rng.random_range(1..=3))),
                2 => Some(Self::Sleep(Duration::from_millis(rng.random_range(1..=25)))),
                _ => None,
            }
        })
    }

    async fn wait(self) {
        match self {
            Self::Yields(times) => {
                for _ in 0..times {
                    tokio::task::yield_now().await;
                }
            }
            Self::Sleep(delay) => tokio::time::sleep(delay).await,
        }
    }
}

/// `tokio::spawn`, through the start-delay seam ([`jitter_spawns`]); in
/// production one thread-local read more.
pub fn spawn<F>(task: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match StartDelay::draw() {
        None => tokio::spawn(task),
        Some(delay) => tokio::spawn(async move {
            delay.wait().await;
            task.await
        }),
    }
}

/// Blocking work that panicked (or was cancelled at shutdown).
#[derive(Debug, thiserror::Error)]
#[error("blocking work failed: {0}")]
pub struct BlockingFailed(String);

impl Default for Seams {
    fn default() -> Self {
        Self::production()
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::*;

    #[test]
    fn a_seeded_node_draws_the_same_numbers_every_time() {
        let seams = Seams {
            seed: Some(7),
            ..Seams::production()
        };
        let draw = |stream| seams.rng(stream).lock().unwrap().random::<u64>();
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2), "two parts draw different numbers");
    }
}
