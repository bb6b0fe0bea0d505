//! The simulator finds bugs this project has had, put back behind test-only
//! switches (`permitd_storage::bugs`): each hunt runs seeds one after another
//! until one fails, and prints the seed and the time it took
//! (docs/simulation.md).
//!
//! A hunt starts at the seed that last found its bug, as a fuzzer replays its
//! corpus first: in CI it is a regression check of seconds, and if a change
//! reshuffles the draws it scans on from there like any other start.
//! `SIM_HUNT_FROM=1` hunts from scratch (how the table in docs/simulation.md
//! is measured). `SIM_HUNT_SECONDS` bounds each hunt (default 300);
//! `SIM_BUG=<words>` hunts only the bugs whose name holds them.

use std::time::{Duration, Instant};

use permitd_sim::nemesis::FaultMix;
use permitd_sim::run::{run, RunOptions};

fn hunt_budget() -> Duration {
    let seconds = std::env::var("SIM_HUNT_SECONDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(seconds)
}

/// Where a hunt starts: `SIM_HUNT_FROM`, else the seed that last found it.
fn hunt_from(last_found_by: u64) -> u64 {
    std::env::var("SIM_HUNT_FROM")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(last_found_by)
}

/// Runs seeds from `first` until one fails, printing what it took; returns
/// the seed that failed.
fn hunt(bug: &str, faults: FaultMix, first: u64) -> Option<u64> {
    let started = Instant::now();
    let mut seed = first;
    while started.elapsed() < hunt_budget() {
        let outcome = run(&RunOptions {
            faults,
            ..RunOptions::ci(seed)
        });
        if !outcome.passed() {
            let took = started.elapsed();
            let tried = seed - first + 1;
            println!("{bug}: found by seed {seed} after {tried} seeds from {first}, {took:.1?}");
            println!("{}", outcome.report());
            return Some(seed);
        }
        seed += 1;
    }
    println!(
        "{bug}: not found in {} seeds from {first}, {:?}",
        seed - first,
        started.elapsed()
    );
    None
}

/// A bug's switch (`permitd_storage::bugs`).
type Switch = fn(bool);

/// Crashes and disk faults only: more leader failovers, some on slow disks,
/// where a broken election guard shows.
const FAILOVERS: FaultMix = FaultMix {
    crashes: true,
    disk: true,
    ..FaultMix::NONE
};

/// Each bug put back: its name, its switch, the faults its hunt draws, and
/// the seed that last found it (docs/simulation.md, "Finding bugs").
const BUGS: [(&str, Switch, FaultMix, u64); 4] = [
    (
        "a data-dir parent not synced",
        permitd_storage::bugs::set_data_dir_parent_not_synced,
        FaultMix::ALL,
        7,
    ),
    (
        "a pre-vote without the term rule",
        permitd_storage::bugs::set_prevote_without_term_rule,
        FAILOVERS,
        2660,
    ),
    (
        "entries proposed out of order",
        permitd_storage::bugs::set_entries_out_of_order,
        FaultMix::ALL,
        3773,
    ),
    (
        "a request whose caller went away still granted",
        permitd_storage::bugs::set_gone_caller_granted,
        FaultMix::ALL,
        3,
    ),
];

// One test, so the process-wide switches never overlap. `SIM_BUG=<part of a
// name>` hunts only the bugs whose name contains it.
#[test]
fn the_simulator_finds_the_bugs_we_had() {
    let only = std::env::var("SIM_BUG").unwrap_or_default();
    let mut missed = Vec::new();
    for (bug, switch, faults, last_found_by) in BUGS {
        if !bug.contains(only.as_str()) {
            continue;
        }
        switch(true);
        let found = hunt(bug, faults, hunt_from(last_found_by));
        switch(false);
        if found.is_none() {
            missed.push(bug);
        }
    }
    assert!(missed.is_empty(), "the simulator missed: {missed:?}");
}
