//! sled 0.34 inside powerfs: does `Db::flush()` survive power loss?
//!
//! The writer runs in a child process (this test binary run again, as the ignored
//! `sled_child` test) so that it can be SIGKILLed like a crashed node. sled's
//! background flusher is off (`flush_every_ms(None)`) so that only the explicit
//! `flush()` counts. The test fsyncs every directory itself before the insert, so the
//! namespace (sled's files) is durable and only sled's own data syncs are judged.
//!
//! Observed and asserted: the flushed insert is **lost**. sled 0.34's `flush()` writes
//! its log with `pwrite` + `sync_file_range` (pagecache/iobuf.rs), which never reaches
//! the filesystem as an fsync (FUSE has no such request), so nothing it wrote after
//! opening is durable. On a real disk `sync_file_range` does not flush the drive's
//! cache nor the file's metadata either: this is the bug powerfs demonstrates.
//!
//! Kept as the record of why permitd left sled: the node's state (storage format 4)
//! and the runner's queue (`client/src/queue/journal.rs`, docs/architecture.md "The
//! runner's queue store"); sled is now only this test's dev-dependency.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{mount, sync_dir};

const CHILD_ENV: &str = "POWERFS_SLED_CHILD_DB";

fn open(db: &Path) -> sled::Db {
    sled::Config::new()
        .path(db)
        .flush_every_ms(None)
        .open()
        .expect("open sled")
}

/// The writer: open, say "opened", wait for "go", insert + flush, say "flushed", wait
/// to be killed.
#[test]
#[ignore = "run by sled_flush_inside_powerfs as its child process"]
fn sled_child() {
    let Ok(db_path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let db = open(Path::new(&db_path));
    db.insert(b"before", b"opened").unwrap();
    println!("opened");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    db.insert(b"key", b"value").unwrap();
    let n = db.flush().unwrap();
    println!("flushed {n}");
    // wait for SIGKILL (stdin stays open until then)
    std::io::stdin().read_line(&mut line).unwrap();
    std::mem::forget(db);
}

fn sync_all_dirs(p: &Path) {
    sync_dir(p).unwrap();
    for e in fs::read_dir(p).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            sync_all_dirs(&e.path());
        }
    }
}

/// Runs the sled child on `db_path`: waits until it opened the db, runs
/// `before_go` (sled's files exist then), lets it insert and flush, and SIGKILLs
/// it once it says `flushed`. Returns the child's `flushed` line.
fn run_child_until_flushed(db_path: &Path, before_go: impl FnOnce()) -> String {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "sled_child", "--include-ignored", "--nocapture"])
        .env(CHILD_ENV, db_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut wait_for = |word: &str| -> String {
        loop {
            let mut line = String::new();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "child ended before {word}"
            );
            if line.starts_with(word) {
                return line;
            }
        }
    };
    wait_for("opened");
    before_go();
    stdin.write_all(b"go\n").unwrap();
    let flushed = wait_for("flushed");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    flushed
}

#[test]
fn sled_flush_inside_powerfs() {
    let Some(m) = mount() else { return };
    let db_path = m.p("db");
    let flushed = run_child_until_flushed(&db_path, || {
        // sled's files exist (and sled holds its lock on `db/db`: file locks work here)
        assert!(db_path.join("db").exists());
        sync_all_dirs(&m.mnt);
    });
    eprintln!("child: {}", flushed.trim());

    let report = m.fs.power_loss(None).unwrap();
    eprintln!("{report}");
    assert!(
        report.writes_dropped > 0,
        "sled's flushed writes were unsynced"
    );
    assert_eq!(report.namespace_ops_dropped, 0);

    let db = open(&db_path);
    let got = db.get(b"key").unwrap();
    eprintln!(
        "after power loss: key = {got:?}, before = {:?}",
        db.get(b"before").unwrap()
    );
    assert_eq!(
        got, None,
        "sled 0.34's flush() (sync_file_range) is not durable"
    );
    drop(db);
}

/// Control: the same without power loss (only the kill): sled finds the key, so the
/// loss above is powerfs's power loss, not the kill.
#[test]
fn sled_flush_survives_a_kill_without_power_loss() {
    let Some(m) = mount() else { return };
    let db_path = m.p("db");
    run_child_until_flushed(&db_path, || {});
    let db = open(&db_path);
    assert_eq!(db.get(b"key").unwrap().as_deref(), Some(&b"value"[..]));
    drop(db);
}
