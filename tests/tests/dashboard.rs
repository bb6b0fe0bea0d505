//! The dashboard (`/ui`) in a real browser: Debian's Chromium, headless, driven
//! by `tests/ui/dashboard.mjs` (playwright-core, pinned in its package-lock)
//! against a real three-node cluster with auth on. The page asks for a token,
//! shows a key's usage and holders after permits are taken, updates without a
//! reload when more are taken, streams their round events (and the earlier
//! ones the node keeps), fetches nothing from
//! another origin, and leaves a screenshot at
//! `<target dir>/dashboard/dashboard.png`.
//!
//! Needs `/usr/bin/chromium` (or `PERMITD_CHROMIUM`; `.ci/run` installs Debian's
//! package). The driver's one dependency is installed from its lockfile
//! (`npm ci` in `tests/ui`) when missing.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use permitd_tests::{Cluster, Settings, ADMIN_TOKEN};

fn ui_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ui")
}

fn chromium() -> PathBuf {
    std::env::var_os("PERMITD_CHROMIUM").map_or_else(|| "/usr/bin/chromium".into(), PathBuf::from)
}

/// Runs `npm ci` in `tests/ui` unless playwright-core is there already.
fn install_driver() {
    if ui_dir().join("node_modules/playwright-core").exists() {
        return;
    }
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(ui_dir())
        .status()
        .expect("npm runs");
    assert!(status.success(), "npm ci in tests/ui failed: {status}");
}

/// `<target dir>/dashboard/`: the test binary lives in `<target>/debug/deps/`.
fn screenshot_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("dashboard")
}

/// The browser driver: one command per line, one `ok`/`fail` line back.
struct Driver {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Driver {
    fn start(page_url: &str) -> Self {
        assert!(
            chromium().exists(),
            "{} is missing: apt-get install chromium (see .ci/run)",
            chromium().display()
        );
        install_driver();
        let mut child = Command::new("node")
            .arg(ui_dir().join("dashboard.mjs"))
            .env("PERMITD_UI_URL", page_url)
            .env("PERMITD_TOKEN", ADMIN_TOKEN)
            .env("PERMITD_CHROMIUM", chromium())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("node runs the driver");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends `command` and panics unless the driver answers `ok`.
    fn run(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("driver takes commands");
        let mut answer = String::new();
        self.stdout.read_line(&mut answer).expect("driver answers");
        assert!(
            answer.starts_with("ok "),
            "dashboard: {command:?} answered {answer:?}"
        );
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs blocking driver commands off the async workers.
async fn drive(driver: &mut Option<Driver>, commands: &[String]) {
    let mut taken = driver.take().expect("driver");
    let commands = commands.to_vec();
    let back = tokio::task::spawn_blocking(move || {
        for command in &commands {
            taken.run(command);
        }
        taken
    })
    .await
    .expect("driver commands");
    *driver = Some(back);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_usage_holders_and_events_and_updates() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    cluster.take(leader, "ui-acct", "runner-a", 3).await;
    cluster.take(leader, "ui-other", "runner-c", 1).await;

    let page = format!("{}/ui", cluster.node(follower).url());
    let mut driver = Some(Driver::start(&page));
    let shot: PathBuf = screenshot_dir().join("dashboard.png");
    std::fs::create_dir_all(shot.parent().expect("dir")).expect("screenshot dir");
    drive(
        &mut driver,
        &[
            "sign-in".into(),
            "granted ui-acct 3".into(),
            "holders ui-acct 1".into(),
            "granted ui-other 1".into(),
            // Taken before the page opened: the stream starts from the node's
            // oldest kept event.
            "event round ui-other".into(),
        ],
    )
    .await;

    // More permits, by another runner: the open page follows without a reload.
    cluster.take(leader, "ui-acct", "runner-b", 4).await;
    drive(
        &mut driver,
        &[
            "granted ui-acct 7".into(),
            "holders ui-acct 2".into(),
            "event round ui-acct".into(),
            "open ui-acct runner-b".into(),
            format!("screenshot {}", shot.display()),
            "quit".into(),
        ],
    )
    .await;
    assert_png(&shot);
    eprintln!("dashboard screenshot: {}", shot.display());

    // The leader's page also shows each follower's replication lag.
    let leader_shot = screenshot_dir().join("dashboard-leader.png");
    let mut on_leader = Some(Driver::start(&format!("{}/ui", cluster.node(leader).url())));
    drive(
        &mut on_leader,
        &[
            "sign-in".into(),
            format!("lag {follower}"),
            format!("shard-leader 0 {leader}"),
            "granted ui-acct 7".into(),
            format!("screenshot {}", leader_shot.display()),
            "quit".into(),
        ],
    )
    .await;
    assert_png(&leader_shot);
}

/// A page whose first refresh fails (here: the leader alone cannot confirm it
/// leads, so its key list answers 503 after the read timeout) goes on
/// refreshing and shows the board once the cluster answers, without a reload.
/// Before, the page refreshed only while its board showed, and the board
/// showed only after a refresh succeeded: a 503 on the first one (a busy
/// cluster right after start, in 1 of 3-10 runs of the test above) left it
/// stale for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_whose_first_refresh_failed_recovers_without_a_reload() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    cluster.take(leader, "ui-late", "runner-a", 2).await;
    cluster.wait_applied_everywhere(leader).await;
    let mut driver = Some(Driver::start(&format!("{}/ui", cluster.node(leader).url())));
    let followers = cluster.followers_of(leader);
    for &follower in &followers {
        cluster.pause(follower, true);
    }
    drive(
        &mut driver,
        &["submit-token".into(), "refresh-failed".into()],
    )
    .await;
    for &follower in &followers {
        cluster.pause(follower, false);
    }
    drive(
        &mut driver,
        &["board".into(), "granted ui-late 2".into(), "quit".into()],
    )
    .await;
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).expect("screenshot written");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "{} is a real PNG",
        path.display()
    );
}
