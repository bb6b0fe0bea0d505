//! Chaos: kill, pause, restart and cut off nodes of a real three-node cluster
//! under a `SemaphoreQueue` workload, and prove from the jobs that actually ran
//! that no budget was exceeded, no acknowledged permit was lost, nothing leaked
//! and every job ran. See `permitd_tests::chaos`.
//!
//! The CI profile runs by default (under 4 minutes). A longer soak, or a replay:
//!
//! ```sh
//! CHAOS_SECONDS=600 cargo test -p permitd-tests --test chaos -- --nocapture
//! CHAOS_RANDOM_STATE=1234 cargo test -p permitd-tests --test chaos -- --nocapture
//! ```
//!
//! Each run writes `$CARGO_TARGET_DIR/chaos/<random state>.json` and `.md`.

use permitd_tests::chaos::{self, Profile, REPLAY_VARIABLE};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_never_exceeds_a_budget_loses_a_grant_or_leaks() {
    let profile = Profile::from_env();
    let replay = format!("{REPLAY_VARIABLE}={}", profile.random_state);
    // In a task, so that a panic anywhere still names the random state; the
    // cluster's processes are killed when the task's values drop.
    let report = match tokio::spawn(chaos::run(profile)).await {
        Ok(report) => report,
        Err(error) => panic!("{replay}: the chaos run failed: {error}"),
    };
    assert_eq!(
        report.violation_total(),
        0,
        "{replay}: {} violations ({:?}); replay with {replay}\n{}",
        report.violation_total(),
        report.violations_by_kind,
        report.to_markdown()
    );
}
