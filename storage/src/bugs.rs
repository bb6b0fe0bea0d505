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
}

#[cfg(feature = "reintroduced-bugs")]
pub use switches::*;

#[cfg(not(feature = "reintroduced-bugs"))]
pub(crate) const fn data_dir_parent_not_synced() -> bool {
    false
}
