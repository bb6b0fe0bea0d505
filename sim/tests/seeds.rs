//! The simulator's seeds, as CI and a developer run them.
//!
//! - `cargo test -p permitd-sim --release --test seeds`: 1,000 seeds
//!   (`SIM_SEEDS`; 20 in a debug build; `test.sh` runs 1–500, at most 200 s),
//!   every tenth seed run twice to prove that it replays to the same trace.
//! - `SIM_SEED=n`: replays seed n alone, twice, printing its full report
//!   (its last 200 events; `SIM_EVENTS=n` shows n)
//!   (`SIM_LOG=<filter>`, such as `SIM_LOG=permitd_storage=debug`, adds the
//!   nodes' own logs).
//! - `SIM_THREADS=n`: seeds run on n threads at once (default: one per core).
//! - `SIM_SECONDS=s`: runs seeds until s seconds of wall time have passed (a
//!   soak); with `SIM_SEEDS` set too, until either runs out (how `test.sh`
//!   bounds CI's share on a slow machine).
//! - `SIM_SHARDS=n`: every simulated cluster runs n shards (default 1).
//!
//! Each seed prints `seed <n> trace <hash>`; a failed seed prints the
//! violations, the last events and the command that replays it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use permitd_sim::run::{run, Outcome, RunOptions};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
}

/// `SIM_SHARDS`: the simulated cluster's shard count (default 1).
fn shards() -> u32 {
    env_u64("SIM_SHARDS").map_or(1, |shards| shards.clamp(1, 64) as u32)
}

/// Log lines stamped with simulated time, so that two replays line up.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match turmoil::sim_elapsed() {
            Some(at) => write!(w, "{:>9.3}s", at.as_secs_f64()),
            None => write!(w, "        -"),
        }
    }
}

/// Prints where two runs' events first differ.
fn print_parting(first: &[String], second: &[String]) {
    if let Some((at, (a, b))) = first
        .iter()
        .zip(second)
        .enumerate()
        .find(|(_, (a, b))| a != b)
    {
        let before = at.saturating_sub(3);
        println!("the runs part at event {at}:");
        for line in &first[before..at] {
            println!("  both:   {line}");
        }
        println!("  first:  {a}\n  second: {b}");
    }
}

/// Seeds run twice, to check that they replay: one in this many.
const REPLAY_EVERY: u64 = 10;

#[test]
fn seeds() {
    if let Some(seed) = env_u64("SIM_SEED") {
        // SIM_LOG=<filter> prints the nodes' own logs (tracing) of the replay.
        if let Ok(filter) = std::env::var("SIM_LOG") {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_ansi(false)
                .with_timer(SimTime)
                .with_test_writer()
                .init();
        }
        let options = RunOptions {
            kept_events: usize::MAX,
            shards: shards(),
            ..RunOptions::ci(seed)
        };
        let first = run(&options);
        tracing::info!("=== the same seed again");
        let second = run(&options);
        print_parting(&first.last_events, &second.last_events);
        let mut first = first;
        let shown = env_u64("SIM_EVENTS").unwrap_or(200) as usize;
        first.last_events = first
            .last_events
            .split_off(first.last_events.len().saturating_sub(shown));
        println!("{}", first.report());
        println!(
            "{} jobs, {} faults, {:?} simulated; again: {}",
            first.jobs,
            first.faults,
            first.simulated,
            second.summary()
        );
        assert_eq!(
            first.trace_hash, second.trace_hash,
            "seed {seed} did not replay"
        );
        assert!(first.passed(), "seed {seed} failed");
        return;
    }
    // A debug build simulates several times slower: its default is a smoke run.
    let default_seeds = if cfg!(debug_assertions) { 20 } else { 1_000 };
    let counted = env_u64("SIM_SEEDS");
    let seeds = counted.unwrap_or(default_seeds);
    let first_seed = env_u64("SIM_FIRST_SEED").unwrap_or(1);
    let budget = env_u64("SIM_SECONDS").map(Duration::from_secs);
    // A time budget alone is a soak; with a count too, whichever runs out first.
    let counting = budget.is_none() || counted.is_some();
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(first_seed));
    let failed: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let diverged: Arc<Mutex<Vec<u64>>> = Arc::default();
    let simulated_ms = Arc::new(AtomicU64::new(0));
    let threads = env_u64("SIM_THREADS").map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |n| n.max(1) as usize,
    );
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (next, failed, diverged, simulated_ms) = (
                next.clone(),
                failed.clone(),
                diverged.clone(),
                simulated_ms.clone(),
            );
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                let out_of_seeds = counting && seed >= first_seed + seeds;
                let out_of_time = budget.is_some_and(|budget| started.elapsed() >= budget);
                if out_of_seeds || out_of_time {
                    return;
                }
                let replayed = seed % REPLAY_EVERY == 0;
                let options = RunOptions {
                    // A replayed seed keeps every event, to show where two runs part.
                    kept_events: if replayed { usize::MAX } else { 200 },
                    shards: shards(),
                    ..RunOptions::ci(seed)
                };
                let outcome = run(&options);
                println!("{}", outcome.summary());
                simulated_ms.fetch_add(outcome.simulated.as_millis() as u64, Ordering::Relaxed);
                if replayed {
                    let again = run(&options);
                    if again.trace_hash != outcome.trace_hash {
                        println!("seed {seed} replayed to {}", again.summary());
                        print_parting(&outcome.last_events, &again.last_events);
                        diverged.lock().unwrap().push(seed);
                    }
                }
                if !outcome.passed() {
                    println!("{}", outcome.report());
                    failed.lock().unwrap().push(outcome);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a simulation thread panicked");
    }
    let ran = next
        .load(Ordering::Relaxed)
        .saturating_sub(first_seed + threads as u64);
    let wall = started.elapsed().as_secs_f64();
    let simulated = simulated_ms.load(Ordering::Relaxed) as f64 / 1_000.0;
    println!(
        "{ran} seeds in {wall:.1} s: {:.1} seeds/s, {:.1} simulated cluster-seconds per wall second",
        ran as f64 / wall,
        simulated / wall
    );
    let failed = failed.lock().unwrap();
    let diverged = diverged.lock().unwrap();
    let replayed = ran / REPLAY_EVERY;
    println!(
        "{} of {replayed} replayed seeds gave the same trace",
        replayed.saturating_sub(diverged.len() as u64)
    );
    assert!(
        failed.is_empty(),
        "failed seeds: {:?}",
        failed.iter().map(|o| o.seed).collect::<Vec<_>>()
    );
    assert!(
        diverged.is_empty(),
        "seeds that did not replay: {diverged:?}"
    );
}
