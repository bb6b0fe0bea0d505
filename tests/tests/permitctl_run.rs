//! `permitctl run` against a real three-node cluster.
//!
//! Twenty `permitctl run` processes wrap a shell command under a limit of 3.
//! Each command appends `start <ns> <id>` and `end <ns> <id>` lines to one file
//! (its own marks, taken from the system clock at the command's start and end);
//! from those the test replays the timeline and checks that never more than 3
//! commands ran at once, that all 20 ran, that each saw a `PERMITD_FENCE`, and
//! that usage returns to zero. Then: the command's status is passed through,
//! a signal sent to `permitctl` is forwarded and still releases, and a timeout
//! ends the wait without running the command.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use permitd_tests::{child_commands, eventually, permitctl_bin, Cluster, Settings};

const RUNNERS: usize = 20;
const LIMIT: u64 = 3;

fn permitctl(cluster: &Cluster) -> Command {
    let urls: Vec<String> = cluster.nodes.iter().map(|node| node.url()).collect();
    let mut command = Command::new(permitctl_bin());
    command.arg("--endpoints").arg(urls.join(","));
    command.env("PERMITD_TOKEN", permitd_tests::ADMIN_TOKEN);
    command
}

/// The most marks open at once, replaying `start`/`end` lines in time order
/// (an end and a start at the same instant: the end first).
fn most_at_once(marks: &str) -> (usize, usize) {
    let mut events: Vec<(u128, i32)> = marks
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let kind = parts.next()?;
            let at: u128 = parts.next()?.parse().ok()?;
            Some((at, if kind == "start" { 1 } else { -1 }))
        })
        .collect();
    events.sort();
    let (mut open, mut most, mut starts) = (0i32, 0i32, 0usize);
    for (_, step) in events {
        open += step;
        most = most.max(open);
        starts += usize::from(step == 1);
    }
    (most as usize, starts)
}

async fn drained(cluster: &Cluster, key: &str) -> bool {
    eventually(Duration::from_secs(30), || async {
        cluster.usage(1, key).await["granted"] == 0
    })
    .await
}

fn set_limit(cluster: &Cluster, key: &str, limit: u64) {
    let status = permitctl(cluster)
        .args(["config", "set", key, "--limit", &limit.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("permitctl config");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_runs_under_limit_three_never_overlap_more_than_three() {
    let cluster = Cluster::start(Settings::default()).await;
    set_limit(&cluster, "batch", LIMIT);
    let marks = cluster.dir.path().join("marks.txt");
    let script = "echo \"start $(date +%s%N) $1 $PERMITD_FENCE\" >> \"$2\"; sleep 0.2; \
                  echo \"end $(date +%s%N) $1\" >> \"$2\"";
    let runners: Vec<_> = (0..RUNNERS)
        .map(|id| {
            permitctl(&cluster)
                .args(["run", "batch", "--group", "nightly", "--"])
                .args(["sh", "-c", script, "sh", &id.to_string()])
                .arg(&marks)
                .spawn()
                .expect("permitctl run starts")
        })
        .collect();
    for mut runner in runners {
        let status = runner.wait().expect("permitctl run ends");
        assert!(status.success(), "{status}");
    }
    let text = std::fs::read_to_string(&marks).expect("marks");
    let (most, starts) = most_at_once(&text);
    assert_eq!(starts, RUNNERS, "every command ran once:\n{text}");
    assert!(most <= LIMIT as usize, "{most} ran at once:\n{text}");
    assert!(most >= 2, "the runs overlapped at all (saw {most})");
    for line in text.lines().filter(|line| line.starts_with("start")) {
        let fence = line.split_whitespace().nth(3);
        assert!(
            fence.is_some_and(|fence| fence.parse::<u64>().is_ok()),
            "PERMITD_FENCE is set: {line}"
        );
    }
    assert!(drained(&cluster, "batch").await, "usage returns to zero");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_pass_through_signals_are_forwarded_and_timeouts_skip_the_command() {
    let cluster = Cluster::start(Settings::default()).await;
    set_limit(&cluster, "job", 1);
    let status = permitctl(&cluster)
        .args(["run", "job", "--", "sh", "-c", "exit 7"])
        .status()
        .expect("runs");
    assert_eq!(status.code(), Some(7), "the command's own status");

    // SIGTERM to permitctl reaches the command, which dies of it: 128 + 15.
    let mut held = permitctl(&cluster)
        .args(["run", "job", "--", "sleep", "30"])
        .spawn()
        .expect("runs");
    let granted = eventually(Duration::from_secs(10), || async {
        cluster.usage(1, "job").await["granted"] == 1
    })
    .await;
    assert!(granted, "the first run holds the permit");
    // The limit is used up: a second run times out without running its command.
    let witness = cluster.dir.path().join("never");
    let started = Instant::now();
    let waited = permitctl(&cluster)
        .args(["run", "job", "--timeout", "500ms", "--", "touch"])
        .arg(&witness)
        .status()
        .expect("runs");
    assert_eq!(waited.code(), Some(75), "EX_TEMPFAIL on timeout");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!Path::new(&witness).exists(), "the command never ran");
    // `sleep` has been started (exec'd) under the claimed grant.
    let started = eventually(Duration::from_secs(10), || async {
        child_commands(held.id()).iter().any(|name| name == "sleep")
    })
    .await;
    assert!(started, "permitctl started its command");
    let pid = nix::unistd::Pid::from_raw(held.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal");
    let status = held.wait().expect("ends");
    assert_eq!(status.code(), Some(128 + 15), "{status}");
    assert!(drained(&cluster, "job").await, "released after the signal");
}

#[test]
fn marks_replay_counts_overlaps() {
    let marks = "start 1 a\nstart 2 b\nend 3 a\nstart 3 c\nend 4 b\nend 5 c\n";
    assert_eq!(most_at_once(marks), (2, 3));
}
