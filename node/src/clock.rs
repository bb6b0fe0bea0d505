//! The node's wall clock, as a seam.
//!
//! A leader stamps every entry it proposes with its wall-clock time (leases and
//! claim deadlines count from it), and usage reads count lease expiry from the
//! reading node's. Production reads the system clock; the simulator (`sim/`)
//! gives each node a simulated clock that it can skew and jump. Durations and
//! deadlines inside a node use `tokio::time::Instant`, which the simulator's
//! runtime pauses and advances, so they need no seam of their own.

use std::sync::Arc;

/// Milliseconds since the Unix epoch, by the clock a node was given.
#[derive(Clone, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    System,
    /// A clock the simulator drives.
    Simulated(Arc<dyn Fn() -> u64 + Send + Sync>),
}

impl Clock {
    /// Milliseconds since the Unix epoch now.
    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::System => system_now_ms(),
            Clock::Simulated(now) => now(),
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Clock::System => f.write_str("Clock::System"),
            Clock::Simulated(_) => f.write_str("Clock::Simulated"),
        }
    }
}

/// Milliseconds since the Unix epoch by the system clock.
fn system_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_clock_reads_what_the_simulator_says() {
        let clock = Clock::Simulated(Arc::new(|| 42));
        assert_eq!(clock.now_ms(), 42);
        assert!(Clock::System.now_ms() > 1_700_000_000_000);
    }
}
