//! Bugs this project has had, put back on demand, so that the simulator can
//! show it finds them (`sim/tests/bugs.rs`, docs/simulation.md).
//!
//! Only with the `reintroduced-bugs` feature, which only the simulator's
//! tests enable; without it every switch is a constant `false` and compiles
//! away. The switches are process-wide: a bug hunt runs in its own test
//! process. They live here, in the lowest crate, so that one list names every
//! bug; the node crate reads its switches through `permitd_storage::bugs`.

/// Declares each switch: a setter (with the feature only) and a getter that is
/// a constant `false` without it.
macro_rules! switches {
    ($($(#[$doc:meta])* $flag:ident: $set:ident, $get:ident;)*) => {
        #[cfg(feature = "reintroduced-bugs")]
        mod flags {
            $(pub(super) static $flag: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);)*
        }
        $(
            $(#[$doc])*
            #[cfg(feature = "reintroduced-bugs")]
            pub fn $set(on: bool) {
                flags::$flag.store(on, std::sync::atomic::Ordering::Relaxed);
            }

            #[cfg(feature = "reintroduced-bugs")]
            pub fn $get() -> bool {
                flags::$flag.load(std::sync::atomic::Ordering::Relaxed)
            }

            #[cfg(not(feature = "reintroduced-bugs"))]
            pub const fn $get() -> bool {
                false
            }
        )*
    };
}

switches! {
    /// The data dir's own entry in its parent is not made durable when the
    /// store creates it (the bug of a relative data dir, whose parent `.` was
    /// skipped: a power cut after the first start lost the whole store).
    DATA_DIR_PARENT_NOT_SYNCED: set_data_dir_parent_not_synced, data_dir_parent_not_synced;
    /// The election guard as it was before commit 53cdbb8: a pre-vote is
    /// granted whatever term the voter is already in, a vote cast (or
    /// asked) for another node does not restart the wait, and an asker behind
    /// a voter's term stands anyway (no `catch_up_on_term`). A follower that
    /// stood a few ms after another, having voted for it, deposed the new
    /// leader.
    PREVOTE_WITHOUT_TERM_RULE: set_prevote_without_term_rule, prevote_without_term_rule;
    /// The rounds driver proposes each entry from a task of its own, so a
    /// later entry may reach the log first (the bug of commit 4f2643c: a held
    /// request woken by a release met its round before that release, was held
    /// again and waited out its `waitMs`), and a key's rounds pipelined, as
    /// the schedule was then (since, a key has one round in flight at most,
    /// and the hunt with only the proposals spawned found nothing in 172
    /// seeds).
    ENTRIES_OUT_OF_ORDER: set_entries_out_of_order, entries_out_of_order;
    /// A request whose caller went away (its connection closed while it was
    /// parked or held) still takes part in its round (the bug fixed by commit
    /// 59116ff: a timed-out `permitctl run`'s last request took the next free
    /// permit, unclaimed, for the whole claim deadline). Read by the node's
    /// rounds (`node/src/leader/round_plan.rs`).
    GONE_CALLER_GRANTED: set_gone_caller_granted, gone_caller_granted;
}
