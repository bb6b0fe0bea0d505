//! Storage throughput on this machine: `cargo bench -p permitd-storage`.
//!
//! Prints one table row per case: log appends (each flushed to disk before the
//! callback, as Raft needs; one at a time, and pipelined as openraft does) and applies of round entries (10 requests of 5
//! clients each), with one or many entries per call, and applies against a state
//! already holding many keys (to show apply cost follows the entry, not the state).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{blank, normal, open_dir, Workload};
use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
use openraft::{Entry, EntryPayload};
use permitd_storage::{Command, KeyRound, Opened, TypeConfig};

/// Each case runs at least this long.
const CASE_DURATION: Duration = Duration::from_secs(3);
const REQUESTS_PER_ROUND: usize = 10;

struct Row {
    case: String,
    entries: u64,
    elapsed: Duration,
}

impl Row {
    fn print(&self) {
        let per_second = self.entries as f64 / self.elapsed.as_secs_f64();
        let micros = self.elapsed.as_secs_f64() * 1e6 / self.entries as f64;
        println!(
            "| {:<72} | {:>8} | {:>12.0} | {:>10.1} |",
            self.case, self.entries, per_second, micros
        );
    }
}

async fn append_case(batch_len: u64) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open_dir(dir.path()).await;
    let mut workload = Workload::new(1);
    let mut index = 1;
    let started = Instant::now();
    while started.elapsed() < CASE_DURATION {
        let batch: Vec<Entry<TypeConfig>> = (index..index + batch_len)
            .map(|index| normal(index, workload.round(1, REQUESTS_PER_ROUND)))
            .collect();
        store.log.blocking_append(batch).await.unwrap();
        index += batch_len;
    }
    Row {
        case: format!("append round entries, {batch_len} per flush"),
        entries: index - 1,
        elapsed: started.elapsed(),
    }
}

/// Appends one round entry per call with `in_flight` calls outstanding, the
/// way openraft pipelines appends (it calls `append` again before the previous
/// callback fired): group commit covers each wave with few fdatasyncs.
async fn pipelined_append_case(in_flight: u64) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let store = open_dir(dir.path()).await;
    let mut workload = Workload::new(1);
    let mut index = 1;
    let (_, fdatasyncs_before) = store.log.wal_sync_counts();
    let started = Instant::now();
    while started.elapsed() < CASE_DURATION {
        let wave: Vec<_> = (index..index + in_flight)
            .map(|index| {
                let mut log = store.log.clone();
                let entry = normal(index, workload.round(1, REQUESTS_PER_ROUND));
                Box::pin(async move { log.blocking_append([entry]).await.unwrap() })
            })
            .collect();
        join_in_order(wave).await;
        index += in_flight;
    }
    let elapsed = started.elapsed();
    let (_, fdatasyncs) = store.log.wal_sync_counts();
    Row {
        case: format!(
            "append round entries, 1 per call, {in_flight} in flight ({:.2} fdatasyncs/entry)",
            (fdatasyncs - fdatasyncs_before) as f64 / (index - 1) as f64
        ),
        entries: index - 1,
        elapsed,
    }
}

/// Polls every future, first polls in order (so the appends happen in index
/// order), until all are done.
async fn join_in_order<F: std::future::Future<Output = ()> + Unpin>(mut futures: Vec<F>) {
    let mut done = vec![false; futures.len()];
    std::future::poll_fn(|context| {
        for (future, done) in futures.iter_mut().zip(done.iter_mut()) {
            if !*done {
                *done = std::future::Future::poll(std::pin::Pin::new(future), context).is_ready();
            }
        }
        if done.iter().all(|done| *done) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// Applies `batch_len` round entries per call for `CASE_DURATION`, after
/// `preloaded_keys` keys were given state. Times the apply calls only.
async fn apply_case(batch_len: u64, preloaded_keys: usize) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open_dir(dir.path()).await;
    let mut index = preload(&mut store, preloaded_keys).await;
    let mut workload = Workload::new(2);
    let mut applied = 0;
    let mut elapsed = Duration::ZERO;
    while elapsed < CASE_DURATION {
        let batch: Vec<Entry<TypeConfig>> = (index..index + batch_len)
            .map(|index| normal(index, workload.round(1, REQUESTS_PER_ROUND)))
            .collect();
        let started = Instant::now();
        let results = store.state_machine.apply(batch.clone()).await.unwrap();
        elapsed += started.elapsed();
        for (entry, result) in batch.iter().zip(&results) {
            let EntryPayload::Normal(command) = &entry.payload else {
                unreachable!()
            };
            workload.observe(command, result);
        }
        applied += batch_len;
        index += batch_len;
    }
    Row {
        case: format!(
            "apply rounds of {REQUESTS_PER_ROUND} requests, {batch_len} per call, {preloaded_keys} keys held"
        ),
        entries: applied,
        elapsed,
    }
}

/// Gives `keys` other keys a grant each, 1,000 keys per entry. Returns the next index.
async fn preload(store: &mut Opened, keys: usize) -> u64 {
    let mut workload = Workload::new(3);
    let mut index = 1;
    store.state_machine.apply([blank(index)]).await.unwrap();
    for chunk in (0..keys).collect::<Vec<_>>().chunks(1_000) {
        index += 1;
        let Command::Round {
            now_ms,
            keys: mut rounds,
            ..
        } = workload.round(1, 1)
        else {
            unreachable!()
        };
        let template = rounds.pop().unwrap();
        let rounds = chunk
            .iter()
            .map(|key| KeyRound {
                key: format!("preloaded-{key}"),
                requests: template.requests.clone(),
            })
            .collect();
        store
            .state_machine
            .apply([normal(
                index,
                Command::Round {
                    now_ms,
                    syncs: Vec::new(),
                    keys: rounds,
                },
            )])
            .await
            .unwrap();
    }
    index + 1
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        println!(
            "| {:<72} | {:>8} | {:>12} | {:>10} |",
            "case", "entries", "entries/s", "µs/entry"
        );
        println!("|{:-<74}|{:->10}|{:->14}|{:->12}|", "", "", "", "");
        for batch_len in [1, 16, 128] {
            append_case(batch_len).await.print();
        }
        pipelined_append_case(64).await.print();
        for batch_len in [1, 16] {
            apply_case(batch_len, 0).await.print();
        }
        apply_case(1, 100_000).await.print();
    });
}
