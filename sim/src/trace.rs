//! A run's trace: every event the harness sees (a client's call and answer, a
//! fault, a leader observed), stamped with simulated time, folded into one
//! hash and kept in a ring of the last few for the report of a failed run.
//!
//! The same seed must give the same trace, hence the same hash
//! (`seed <n> trace <hash>`): a replay is only worth something if it is the
//! same history. The hash is FNV-1a over the events' text, which depends on no
//! process state (no `HashMap` order, no pointer, no real time).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Events kept for the report of a failed run.
const KEPT: usize = 200;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

#[derive(Debug)]
struct Inner {
    hash: u64,
    events: u64,
    last: VecDeque<String>,
    /// How many events `last` keeps.
    kept: usize,
}

/// The trace of one run; cheap to clone, shared by every simulated host (they
/// all run on the simulator's one thread).
#[derive(Debug, Clone)]
pub struct Trace(Arc<Mutex<Inner>>);

impl Default for Trace {
    fn default() -> Self {
        Self::keeping(KEPT)
    }
}

impl Trace {
    /// A trace that keeps its last `kept` events (a replay keeps them all, to
    /// show where two runs part).
    pub fn keeping(kept: usize) -> Self {
        Self(Arc::new(Mutex::new(Inner {
            hash: FNV_OFFSET,
            events: 0,
            last: VecDeque::with_capacity(kept.min(KEPT)),
            kept,
        })))
    }

    /// Records `what` happening at simulated time `at` on `host`.
    pub fn event(&self, at: Duration, host: &str, what: impl std::fmt::Display) {
        let mut line = String::new();
        let _ = write!(line, "{:>9.3}s {host:<8} {what}", at.as_secs_f64());
        let mut inner = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for byte in line.bytes().chain(std::iter::once(b'\n')) {
            inner.hash = (inner.hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
        }
        inner.events += 1;
        if inner.last.len() == inner.kept {
            inner.last.pop_front();
        }
        inner.last.push_back(line);
    }

    /// The hash of every event so far.
    pub fn hash(&self) -> u64 {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .hash
    }

    pub fn events(&self) -> u64 {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .events
    }

    /// The last events, oldest first.
    pub fn last(&self) -> Vec<String> {
        let inner = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.last.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_events_hash_the_same_and_any_change_shows() {
        let record = |text: &str| {
            let trace = Trace::default();
            trace.event(Duration::from_millis(1500), "node1", "leader term 1");
            trace.event(Duration::from_millis(1600), "client1", text);
            trace.hash()
        };
        assert_eq!(record("granted k 1"), record("granted k 1"));
        assert_ne!(record("granted k 1"), record("granted k 2"));
    }

    #[test]
    fn only_the_last_events_are_kept() {
        let trace = Trace::default();
        for i in 0..(KEPT + 5) {
            trace.event(Duration::ZERO, "h", i);
        }
        let last = trace.last();
        assert_eq!(last.len(), KEPT);
        assert!(last[0].ends_with(" 5"), "{}", last[0]);
        assert_eq!(trace.events(), (KEPT + 5) as u64);
    }
}
