//! Crash safety: a child process appends and applies entries and prints each
//! index once openraft's flush callback fired; it is SIGKILLed at random moments.
//! The child also builds a snapshot now and then. After every kill the store
//! must hold every acknowledged entry, and the state it restarts with (its
//! snapshot plus the committed entries after it, as openraft replays them) must
//! be exactly what replaying its whole log up to the committed id builds.
//!
//! The test re-runs its own binary as the child (selected by [`CHILD_DIR_ENV`]).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{normal, open_dir, restart, state_bytes, Rng, Workload};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{EntryPayload, RaftLogReader, RaftSnapshotBuilder};

/// Set in the child's environment: the data dir to write to.
const CHILD_DIR_ENV: &str = "PERMITD_STORAGE_CRASH_CHILD_DIR";
const TEST_NAME: &str = "acknowledged_entries_survive_sigkill";
const KILLS: usize = 8;
/// The child stops by itself after this many entries per run (it is killed first).
const MAX_ENTRIES_PER_RUN: u64 = 20_000;
/// The child builds a snapshot each time its log passes a multiple of this.
const SNAPSHOT_EVERY: u64 = 300;
/// How long the parent waits for the child to get going before aiming a kill.
const CHILD_START_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn acknowledged_entries_survive_sigkill() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        return child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let start = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("crash test random start {start}");
    let mut rng = Rng::new(start);
    let mut acknowledged = 0;
    for _ in 0..KILLS {
        let acked = run_and_kill(dir.path(), 20 + rng.below(300));
        acknowledged = acknowledged.max(acked.unwrap_or(0));
        check_store(dir.path(), acknowledged);
    }
    assert!(acknowledged > 0, "the child never acknowledged an entry");
}

/// Runs the child, kills it `kill_after_ms` after its first acknowledgement and
/// returns the highest index it acknowledged.
fn run_and_kill(dir: &Path, kill_after_ms: u64) -> Option<u64> {
    let mut child = Process::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines, acks) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(index) = line.strip_prefix("ACK ") {
                let _ = lines.send(index.parse::<u64>().expect("ACK index"));
            }
        }
    });
    let mut highest = acks.recv_timeout(CHILD_START_TIMEOUT).ok();
    let deadline = Instant::now() + Duration::from_millis(kill_after_ms);
    while let Some(wait) = deadline.checked_duration_since(Instant::now()) {
        match acks.recv_timeout(wait) {
            Ok(index) => highest = highest.max(Some(index)),
            Err(mpsc::RecvTimeoutError::Timeout) => break,
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the child exited early"),
        }
    }
    child.kill().unwrap(); // SIGKILL on Unix.
    child.wait().unwrap();
    reader.join().unwrap();
    // Acknowledgements printed just before the kill are still in the pipe.
    highest.max(acks.try_iter().max())
}

/// Restarts the store: every acknowledged entry is there, the log has no hole
/// and the restarted state equals a fresh replay of the log up to the applied id.
fn check_store(dir: &Path, acknowledged: u64) {
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut store = restart(dir).await;
        let log = store.log.try_get_log_entries(..).await.unwrap();
        let indexes: Vec<u64> = log.iter().map(|entry| entry.log_id.index).collect();
        assert_eq!(
            indexes,
            (1..=indexes.len() as u64).collect::<Vec<_>>(),
            "log has a hole"
        );
        assert!(
            indexes.len() as u64 >= acknowledged,
            "entry {acknowledged} was acknowledged, the log ends at {}",
            indexes.len()
        );
        let applied = store.state.last_applied().map_or(0, |log_id| log_id.index);
        assert!(
            applied <= indexes.len() as u64,
            "applied {applied} beyond the log"
        );

        let replay_dir = tempfile::tempdir().unwrap();
        let mut replay = open_dir(replay_dir.path()).await;
        replay
            .state_machine
            .apply(log[..applied as usize].to_vec())
            .await
            .unwrap();
        assert_eq!(
            state_bytes(&replay),
            state_bytes(&store),
            "applied state after a crash"
        );
        assert_eq!(
            replay.state_machine.applied_state().await.unwrap(),
            store.state_machine.applied_state().await.unwrap()
        );
    });
}

/// The child: restarts the store (openraft applies the committed entries again),
/// applies what was logged but not committed, then appends, applies and
/// commits new ones, printing each index once it is durable, with a snapshot
/// every [`SNAPSHOT_EVERY`] entries.
fn child(dir: &Path) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut store = restart(dir).await;
        let last_log = store.log.get_log_state().await.unwrap().last_log_id;
        let applied = store.state.last_applied().map_or(0, |id| id.index);
        let pending = store.log.try_get_log_entries(applied + 1..).await.unwrap();
        store.state_machine.apply(pending).await.unwrap();
        store.log.save_committed(last_log).await.unwrap();
        let last_log = last_log.map_or(0, |id| id.index);

        let mut workload = Workload::new(last_log + 1);
        let mut rng = Rng::new(last_log + 7);
        let mut index = last_log + 1;
        while index <= last_log + MAX_ENTRIES_PER_RUN {
            let batch_len = 1 + rng.below(3);
            let batch: Vec<_> = (index..index + batch_len)
                .map(|index| normal(index, workload.next_command()))
                .collect();
            store.log.blocking_append(batch.clone()).await.unwrap();
            println!("ACK {}", index + batch_len - 1);
            let results = store.state_machine.apply(batch.clone()).await.unwrap();
            for (entry, result) in batch.iter().zip(&results) {
                let EntryPayload::Normal(command) = &entry.payload else {
                    unreachable!()
                };
                workload.observe(command, result);
            }
            store
                .log
                .save_committed(batch.last().map(|entry| entry.log_id))
                .await
                .unwrap();
            if index / SNAPSHOT_EVERY != (index + batch_len) / SNAPSHOT_EVERY {
                let mut builder = store.state_machine.get_snapshot_builder().await;
                builder.build_snapshot().await.unwrap();
            }
            index += batch_len;
        }
    });
}
