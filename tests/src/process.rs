//! Processes: finding the `permitd` and `permitctl` binaries, free loopback
//! ports, and one node's `permitd serve` process ([`Node`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The `permitd` binary to run (see the module docs).
pub fn permitd_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| locate_or_build("permitd", "permitd", "PERMITD_BIN"))
        .clone()
}

/// The `permitctl` binary, found like [`permitd_bin`] (`PERMITCTL_BIN` first).
pub fn permitctl_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| locate_or_build("permitctl", "permitd-client", "PERMITCTL_BIN"))
        .clone()
}

fn locate_or_build(name: &str, package: &str, variable: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(variable) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test knows its own path");
    // target/debug/deps/<test> → target/debug/<name>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from target/<profile>/deps");
    let bin = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", package, "--bin", name])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build -p {package} failed");
    }
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p {package}` or set {variable}",
        bin.display()
    );
    bin
}

/// A free loopback port for a test node, never handed out twice in one process.
pub fn free_port() -> u16 {
    // Below the kernel's ephemeral range (32768 and up on Linux): a port picked
    // from bind(0) can be taken by any outgoing connection (ours are many) before
    // the node binds it, which made a node fail to start now and then. Each test
    // process starts elsewhere in the span and never hands out a port twice.
    const FIRST_PORT: u32 = 20_000;
    const PORT_SPAN: u32 = 12_000;
    static HANDED_OUT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(97) % PORT_SPAN;
    loop {
        let count = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        assert!(count < PORT_SPAN, "no free test port left");
        let port = (FIRST_PORT + (start + count) % PORT_SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// One node of a test cluster.
#[derive(Debug)]
pub struct Node {
    pub id: u64,
    pub api_addr: String,
    pub raft_addr: String,
    /// The Raft address peers are told to use, if not `raft_addr` (a proxy).
    pub advertise_raft_addr: Option<String>,
    /// `http` or `https`.
    pub scheme: &'static str,
    /// The cluster file this node is started with (relative to `working_dir`
    /// when that is set).
    pub(crate) config: PathBuf,
    /// The node's working directory, when not the test's: a node on a
    /// power-loss disk runs in its mount with relative paths, as a user does.
    pub(crate) working_dir: Option<PathBuf>,
    /// `--worker-threads` of its process (`None`: permitd's default).
    pub(crate) worker_threads: Option<u16>,
    /// The network namespace it runs in ([`crate::netns`]), if any.
    pub(crate) namespace: Option<String>,
    pub(crate) child: Option<Child>,
}

impl Node {
    pub(crate) fn spawn(&mut self, dir: &Path) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("node-{}.log", self.id)))
            .expect("log file");
        let mut command = match &self.namespace {
            Some(namespace) => crate::netns::command_in(namespace, &permitd_bin()),
            None => Command::new(permitd_bin()),
        };
        if let Some(threads) = self.worker_threads {
            command.args(["--worker-threads", &threads.to_string()]);
        }
        if let Some(working_dir) = &self.working_dir {
            command.current_dir(working_dir);
        }
        let child = command
            .args(["serve", "--config"])
            .arg(&self.config)
            .args(["--id", &self.id.to_string()])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("permitd starts");
        self.child = Some(child);
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id of the running node.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `http(s)://api_addr`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.api_addr)
    }
}

pub(crate) fn clone_node(node: &Node) -> Node {
    Node {
        id: node.id,
        api_addr: node.api_addr.clone(),
        raft_addr: node.raft_addr.clone(),
        advertise_raft_addr: node.advertise_raft_addr.clone(),
        scheme: node.scheme,
        config: node.config.clone(),
        working_dir: node.working_dir.clone(),
        worker_threads: node.worker_threads,
        namespace: node.namespace.clone(),
        child: None,
    }
}

/// The command names (`comm`) of the running children of process `pid`, from
/// `/proc`: e.g. to see that a wrapper has started its command.
pub fn child_commands(pid: u32) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let stat = std::fs::read_to_string(entry.ok()?.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`; comm may itself hold spaces or ')'.
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1;
            let parent: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (parent == pid).then(|| comm.to_owned())
        })
        .collect()
}
