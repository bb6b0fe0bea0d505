//! Bugs this project has had, put back on demand, so that the simulator can
//! show it finds them (`sim/tests/bugs.rs`, docs/simulation.md).
//!
//! Only with the `reintroduced-bugs` feature, which only the simulator's
//! tests enable; without it every switch is a constant `false` and compiles
//! away. The switches are process-wide: a bug hunt runs in its own test
//! process.

#[cfg(feature = "reintroduced-bugs")]
mod switches {
    use std::sync::atomic::{AtomicBool, Ordering};

    static DATA_DIR_PARENT_NOT_SYNCED: AtomicBool = AtomicBool::new(false);

    /// The data dir's own entry in its parent is not made durable when the
    /// store creates it (the bug of a relative data dir, whose parent `.` was
    /// skipped: a power cut after the first start lost the whole store).
    pub fn set_data_dir_parent_not_synced(on: bool) {
        DATA_DIR_PARENT_NOT_SYNCED.store(on, Ordering::Relaxed);
    }

    pub(crate) fn data_dir_parent_not_synced() -> bool {
        DATA_DIR_PARENT_NOT_SYNCED.load(Ordering::Relaxed)
    }

    static GONE_CALLER_GRANTED: AtomicBool = AtomicBool::new(false);

    /// A request whose caller went away (its connection closed while it was
    /// parked or held) still takes part in its round (the bug fixed by
    /// commit 59116ff: a timed-out `permitctl run`'s last request took the next
    /// free permit, unclaimed, for the whole claim deadline). Read by the
    /// node's rounds (`node/src/leader/round_plan.rs`).
    pub fn set_gone_caller_granted(on: bool) {
        GONE_CALLER_GRANTED.store(on, Ordering::Relaxed);
    }

    pub fn gone_caller_granted() -> bool {
        GONE_CALLER_GRANTED.load(Ordering::Relaxed)
    }
}

#[cfg(feature = "reintroduced-bugs")]
pub use switches::*;

#[cfg(not(feature = "reintroduced-bugs"))]
pub(crate) const fn data_dir_parent_not_synced() -> bool {
    false
}

#[cfg(not(feature = "reintroduced-bugs"))]
pub const fn gone_caller_granted() -> bool {
    false
}
