//! End-to-end tests that start real `permitd` processes.
//!
//! [`Cluster`] writes a `cluster.toml` with ephemeral loopback ports, short Raft
//! timings and small round timings into a temporary directory, starts one
//! `permitd serve --config … --id N` process per node, initialises the cluster
//! and kills every process on `Drop`. Tests talk to it over real HTTP.
//!
//! # Which binary runs
//!
//! [`permitd_bin`] looks, in order, for:
//! 1. `PERMITD_BIN`, if set;
//! 2. `permitd` next to the test executable's `deps/` folder, i.e.
//!    `$CARGO_TARGET_DIR/debug/permitd` (or `target/debug/permitd`).
//!
//! `cargo test --workspace` builds that binary (the `permitd` package has an
//! integration test, so cargo builds its binary first). With `cargo test -p
//! permitd-tests` alone, run `cargo build -p permitd` first; if the binary is
//! missing the harness runs that build itself.
//!
//! Set `PERMITD_KEEP_DIRS=1` to keep the temporary directories (node logs are in
//! `node-N.log` there).
//!
//! # Auth and TLS
//!
//! Every cluster runs with auth on: the cluster file carries [`ADMIN_TOKEN`] and
//! [`Cluster::call`] sends it (use [`Cluster::call_as`] to call with another
//! token or none). [`Settings::tls`] generates a CA and node certificates
//! ([`certs`]) and turns on `[tls]` with mTLS on the Raft port; node URLs are
//! then `https://` and the harness's HTTP client trusts only that CA.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use permitd_core::contract::headers;
use serde_json::{json, Value};

pub mod bench;
pub mod certs;
pub mod chaos;
pub mod ctl;
pub mod disks;
pub mod power_loss;

/// The peer secret every test cluster uses (opens `/raft/*` only).
pub const SECRET: &str = "permitd-test-secret-0123456789";
/// The admin token every test cluster uses.
pub const ADMIN_TOKEN: &str = "permitd-test-admin-token-0123456789";
/// How long a node may take to answer `/healthz`, or a cluster to elect.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

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
    /// The cluster file this node is started with.
    config: PathBuf,
    /// `--worker-threads` of its process (`None`: permitd's default).
    worker_threads: Option<u16>,
    child: Option<Child>,
}

impl Node {
    fn spawn(&mut self, dir: &Path) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("node-{}.log", self.id)))
            .expect("log file");
        let mut command = Command::new(permitd_bin());
        if let Some(threads) = self.worker_threads {
            command.args(["--worker-threads", &threads.to_string()]);
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

/// Cluster-wide settings of a test cluster.
#[derive(Debug, Clone)]
pub struct Settings {
    pub nodes: usize,
    /// The `[defaults]` table, in TOML.
    pub defaults: String,
    /// More tables for the cluster file (e.g. `[limits]`), in TOML.
    pub extra_toml: String,
    /// `[auth] enabled`; the admin token is [`ADMIN_TOKEN`] either way.
    pub auth: bool,
    /// Serve HTTPS with generated certificates, mTLS between peers.
    pub tls: bool,
    /// Node `i` sends its Raft RPCs from `127.0.0.(i+1)` ([`peer_source_ip`]),
    /// so a proxy can tell senders apart without reading the (TLS) traffic.
    pub distinct_source_ips: bool,
    /// More lines of the `[raft]` table, in TOML.
    pub raft_toml: String,
    /// `[raft] snapshot_every_logs`: [`SNAPSHOT_EVERY_LOGS`] by default, ten
    /// times more often than the shipped `cluster.toml`, so that tests cross
    /// snapshots within seconds.
    pub snapshot_every_logs: u64,
    /// `(heartbeat_interval_ms, election_timeout_min_ms, election_timeout_max_ms)`
    /// instead of the harness's fast [`HEARTBEAT_INTERVAL_MS`],
    /// [`ELECTION_TIMEOUT_MIN_MS`] and [`ELECTION_TIMEOUT_MAX_MS`].
    pub raft_timings_ms: Option<(u64, u64, u64)>,
    /// `--worker-threads` of every node; `None` leaves permitd's default.
    pub worker_threads: Option<u16>,
    /// Each node's data dir on a `powerfs` mount that can lose power
    /// ([`disks`]; [`Cluster::power_loss`]).
    pub power_loss_disks: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            nodes: 3,
            defaults: "limit = 100\nroundWaitMs = 20\nroundPeriodMs = 20\ngrantTimeoutMs = 60000\n"
                .into(),
            extra_toml: String::new(),
            auth: true,
            tls: false,
            distinct_source_ips: false,
            raft_toml: String::new(),
            snapshot_every_logs: SNAPSHOT_EVERY_LOGS,
            raft_timings_ms: None,
            worker_threads: None,
            power_loss_disks: false,
        }
    }
}

/// A cluster of real `permitd` processes in a temporary directory.
#[derive(Debug)]
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<Node>,
    /// Sends the admin token unless a request names its own `Authorization`.
    pub http: reqwest::Client,
    /// Sends no token at all.
    pub bare_http: reqwest::Client,
    /// The generated certificates of a TLS cluster.
    pub certs: Option<certs::TestCerts>,
    settings: Settings,
    /// The nodes' `powerfs` mounts, with [`Settings::power_loss_disks`].
    disks: Option<disks::Disks>,
}

impl Cluster {
    /// Starts `settings.nodes` nodes, initialises them and waits for a leader.
    pub async fn start(settings: Settings) -> Self {
        let cluster = Self::spawn(settings);
        cluster.wait_healthy().await;
        let init = cluster.post_admin(1, "/cluster/init", &json!({})).await;
        assert_eq!(init.0, 200, "init failed: {}", init.1);
        cluster.wait_for_leader().await;
        cluster
    }

    /// Like [`Cluster::start`], but node `id` advertises `advertise(id, raft_addr)`
    /// (when `Some`) as its Raft address in the membership, e.g. a proxy in front
    /// of its real Raft listener at `raft_addr`.
    pub async fn start_advertising(
        settings: Settings,
        advertise: impl FnMut(u64, &str) -> Option<String>,
    ) -> Self {
        let cluster = Self::spawn_advertising(settings, advertise);
        cluster.wait_healthy().await;
        let init = cluster.post_admin(1, "/cluster/init", &json!({})).await;
        assert_eq!(init.0, 200, "init failed: {}", init.1);
        cluster.wait_for_leader().await;
        cluster
    }

    /// Writes the cluster file and starts every node, uninitialised.
    pub fn spawn(settings: Settings) -> Self {
        Self::spawn_advertising(settings, |_, _| None)
    }

    /// [`Cluster::spawn`] with advertised Raft addresses (see
    /// [`Cluster::start_advertising`]).
    pub fn spawn_advertising(
        settings: Settings,
        mut advertise: impl FnMut(u64, &str) -> Option<String>,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("permitd-e2e-")
            .disable_cleanup(std::env::var_os("PERMITD_KEEP_DIRS").is_some())
            .tempdir()
            .expect("temp dir");
        let config = dir.path().join("cluster.toml");
        let certs = settings
            .tls
            .then(|| certs::generate(&dir.path().join("tls")));
        let scheme = if settings.tls { "https" } else { "http" };
        let mut nodes: Vec<Node> = (1..=settings.nodes as u64)
            .map(|id| {
                let raft_addr = format!("127.0.0.1:{}", free_port());
                Node {
                    id,
                    api_addr: format!("127.0.0.1:{}", free_port()),
                    advertise_raft_addr: advertise(id, &raft_addr),
                    raft_addr,
                    scheme,
                    config: config.clone(),
                    worker_threads: settings.worker_threads,
                    child: None,
                }
            })
            .collect();
        std::fs::write(&config, cluster_toml(&nodes, &settings, certs.as_ref())).expect("config");
        let disks = settings
            .power_loss_disks
            .then(|| disks::Disks::mount(dir.path(), nodes.iter().map(|node| node.id)));
        for node in &mut nodes {
            node.spawn(dir.path());
        }
        let http = http_client(certs.as_ref(), Some(ADMIN_TOKEN));
        let bare_http = http_client(certs.as_ref(), None);
        Self {
            dir,
            nodes,
            http,
            bare_http,
            certs,
            settings,
            disks,
        }
    }

    pub fn node(&self, id: u64) -> &Node {
        self.nodes
            .iter()
            .find(|node| node.id == id)
            .expect("known node")
    }

    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|node| node.id == id)
            .expect("known node")
    }

    /// Waits until every running node answers `/healthz`.
    pub async fn wait_healthy(&self) {
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                let url = format!("{}/healthz", node.url());
                if let Ok(answer) = self.http.get(&url).send().await {
                    if answer.status().is_success() {
                        break;
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "node {} never became healthy",
                    node.id
                );
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// Waits until every running node names the same leader, and returns it.
    pub async fn wait_for_leader(&self) -> u64 {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let mut leaders = Vec::new();
            for node in self.nodes.iter().filter(|node| node.is_running()) {
                let status = self.status(node.id).await;
                leaders.push(status.as_ref().and_then(|s| s["leader"].as_u64()));
            }
            if let Some(Some(leader)) = leaders.first() {
                let agreed = leaders.iter().all(|seen| *seen == Some(*leader));
                let running = self.nodes.iter().any(|n| n.id == *leader && n.is_running());
                if agreed && running {
                    return *leader;
                }
            }
            assert!(Instant::now() < deadline, "no leader agreed: {leaders:?}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// A running node that is not `leader`.
    pub fn follower_of(&self, leader: u64) -> u64 {
        self.nodes
            .iter()
            .find(|node| node.id != leader && node.is_running())
            .expect("a running follower")
            .id
    }

    /// `/cluster/status` of a node, or `None` if it does not answer.
    pub async fn status(&self, id: u64) -> Option<Value> {
        let url = format!("{}/cluster/status", self.node(id).url());
        let answer = self
            .http
            .get(url)
            .bearer_auth(ADMIN_TOKEN)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        answer.json().await.ok()
    }

    /// SIGKILL: the node dies without any shutdown.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.node_mut(id).child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait: the node's graceful shutdown.
    pub fn stop(&mut self, id: u64) {
        if let Some(mut child) = self.node_mut(id).child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    break;
                }
                std::thread::sleep(POLL);
            }
            let status = child.wait().expect("node exits");
            assert!(status.success(), "node {id} stopped with {status}");
        }
    }

    /// Starts a stopped node again on its data.
    /// Cuts the power of nodes `ids` at once: SIGKILL, then each disk drops
    /// what its node had not made durable (`torn`: a seed that keeps a torn
    /// prefix of one unsynced write). Restart them with [`Cluster::restart`].
    pub fn power_loss(
        &mut self,
        ids: &[u64],
        torn: Option<u64>,
    ) -> Vec<permitd_powerfs::LossReport> {
        for id in ids {
            self.kill(*id);
        }
        let disks = self
            .disks
            .as_ref()
            .expect("a cluster started with Settings::power_loss_disks");
        ids.iter()
            .map(|id| disks.power_loss(*id, torn.map(|seed| seed ^ id)))
            .collect()
    }

    pub fn restart(&mut self, id: u64) {
        let dir = self.dir.path().to_owned();
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} is running");
        node.spawn(&dir);
    }

    /// Writes a cluster file for `nodes` plus a new node, and starts the new node
    /// (uninitialised: it waits to be added). Returns its id.
    pub fn spawn_extra_node(&mut self) -> u64 {
        let id = self.nodes.len() as u64 + 1;
        let config = self.dir.path().join(format!("cluster-{id}.toml"));
        let mut node = Node {
            id,
            api_addr: format!("127.0.0.1:{}", free_port()),
            raft_addr: format!("127.0.0.1:{}", free_port()),
            advertise_raft_addr: None,
            scheme: self.nodes[0].scheme,
            config: config.clone(),
            worker_threads: self.settings.worker_threads,
            child: None,
        };
        let mut all: Vec<Node> = self.nodes.iter().map(clone_node).collect();
        all.push(clone_node(&node));
        std::fs::write(
            &config,
            cluster_toml(&all, &self.settings, self.certs.as_ref()),
        )
        .expect("config");
        node.spawn(self.dir.path());
        self.nodes.push(node);
        id
    }

    /// A JSON call to a node's public API with the admin token.
    pub async fn call(
        &self,
        id: u64,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Answer {
        self.call_as(Some(ADMIN_TOKEN), id, method, path, body)
            .await
    }

    /// A JSON call with `token` as bearer token, or none.
    pub async fn call_as(
        &self,
        token: Option<&str>,
        id: u64,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Answer {
        let url = format!("{}{path}", self.node(id).url());
        let mut request = self.bare_http.request(method, url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        Answer::from(request.send().await).await
    }

    pub async fn post(&self, id: u64, path: &str, body: &Value) -> Answer {
        self.call(id, reqwest::Method::POST, path, Some(body)).await
    }

    /// Takes `count` permits of group `g` on `key` for `client` through node
    /// `id`, and asserts they were granted.
    pub async fn take(&self, id: u64, key: &str, client: &str, count: u64) {
        let path = format!("/v1/semaphores/{key}");
        let answer = self
            .post(id, &path, &request(client, &[("g", count, 1)]))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(granted(&answer.body), count, "{}", answer.body);
    }

    pub async fn put(&self, id: u64, path: &str, body: &Value) -> Answer {
        self.call(id, reqwest::Method::PUT, path, Some(body)).await
    }

    pub async fn get(&self, id: u64, path: &str) -> Answer {
        self.call(id, reqwest::Method::GET, path, None).await
    }

    /// A `/cluster/*` call with the admin token: `(status, body)`.
    pub async fn post_admin(&self, id: u64, path: &str, body: &Value) -> (u16, Value) {
        let url = format!("{}{path}", self.node(id).url());
        let answer = self
            .http
            .post(url)
            .bearer_auth(ADMIN_TOKEN)
            .json(body)
            .send()
            .await
            .expect("node answers");
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    /// `GET /v1/semaphores/{key}/usage` through node `id`, which must succeed.
    /// A 503 (an election under way, as after a node restart) is retried for a
    /// while, as every client does; any other failure fails the test.
    pub async fn usage(&self, id: u64, key: &str) -> Value {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let answer = self.get(id, &format!("/v1/semaphores/{key}/usage")).await;
            if answer.status == 503 && Instant::now() < deadline {
                assert!(answer.retry_after.is_some(), "503 without Retry-After");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            assert_eq!(answer.status, 200, "usage via node {id}: {}", answer.body);
            return answer.body;
        }
    }
}

/// Writes a cluster file of `count` nodes on free loopback ports into `dir`, for
/// tests that start the nodes some other way (`permitd up`). Returns the file and
/// the nodes' API URLs.
pub fn write_cluster_file(dir: &Path, count: u64) -> (PathBuf, Vec<String>) {
    let path = dir.join("cluster.toml");
    let nodes: Vec<Node> = (1..=count)
        .map(|id| Node {
            id,
            api_addr: format!("127.0.0.1:{}", free_port()),
            raft_addr: format!("127.0.0.1:{}", free_port()),
            advertise_raft_addr: None,
            scheme: "http",
            config: path.clone(),
            worker_threads: None,
            child: None,
        })
        .collect();
    let text = cluster_toml(&nodes, &Settings::default(), None);
    std::fs::write(&path, text).expect("config");
    (path, nodes.iter().map(Node::url).collect())
}

/// The loopback address node `id` sends Raft RPCs from with
/// [`Settings::distinct_source_ips`]: `127.0.0.(id + 1)`.
pub fn peer_source_ip(id: u64) -> std::net::Ipv4Addr {
    let last = u8::try_from(id + 1).expect("at most 254 test nodes");
    std::net::Ipv4Addr::new(127, 0, 0, last)
}

/// The node that sends from `ip` under [`Settings::distinct_source_ips`].
pub fn node_of_source_ip(ip: std::net::IpAddr) -> Option<u64> {
    match ip {
        std::net::IpAddr::V4(v4) if v4.octets()[..3] == [127, 0, 0] && v4.octets()[3] >= 2 => {
            Some(u64::from(v4.octets()[3]) - 1)
        }
        _ => None,
    }
}

fn clone_node(node: &Node) -> Node {
    Node {
        id: node.id,
        api_addr: node.api_addr.clone(),
        raft_addr: node.raft_addr.clone(),
        advertise_raft_addr: node.advertise_raft_addr.clone(),
        scheme: node.scheme,
        config: node.config.clone(),
        worker_threads: node.worker_threads,
        child: None,
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Unmounted before the temp dir is removed, never through the mount.
        drop(self.disks.take());
    }
}

/// The harness's HTTP client: trusting only the test CA of a TLS cluster, and
/// sending `token` unless a request sets its own `Authorization`.
fn http_client(certs: Option<&certs::TestCerts>, token: Option<&str>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(30));
    if let Some(token) = token {
        let mut headers = reqwest::header::HeaderMap::new();
        let value = format!("Bearer {token}").parse().expect("header value");
        headers.insert(reqwest::header::AUTHORIZATION, value);
        builder = builder.default_headers(headers);
    }
    if let Some(certs) = certs {
        let pem = std::fs::read(&certs.ca_file).expect("ca.pem");
        builder = builder
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("CA"));
    }
    builder.build().expect("http client")
}

/// Raft heartbeat of every test cluster, in ms (the `cluster.toml` values).
pub const HEARTBEAT_INTERVAL_MS: u64 = 40;
/// Shortest election timeout of every test cluster, in ms.
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 120;
/// Longest election timeout of every test cluster, in ms; openraft 0.9 also
/// uses it as the leader lease, so a follower elects after up to twice this.
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 240;
/// Log entries between two snapshots in a test cluster (the shipped
/// `cluster.toml` says 5,000).
pub const SNAPSHOT_EVERY_LOGS: u64 = 500;

fn cluster_toml(nodes: &[Node], settings: &Settings, certs: Option<&certs::TestCerts>) -> String {
    let Settings {
        defaults,
        extra_toml,
        auth,
        raft_toml,
        snapshot_every_logs,
        ..
    } = settings;
    let (heartbeat, election_min, election_max) = settings.raft_timings_ms.unwrap_or((
        HEARTBEAT_INTERVAL_MS,
        ELECTION_TIMEOUT_MIN_MS,
        ELECTION_TIMEOUT_MAX_MS,
    ));
    let mut text = format!(
        "secret = \"{SECRET}\"\n\n[auth]\nenabled = {auth}\nadmin_token = \"{ADMIN_TOKEN}\"\n\n\
         [raft]\nheartbeat_interval_ms = {heartbeat}\n\
         election_timeout_min_ms = {election_min}\n\
         election_timeout_max_ms = {election_max}\n\
         rpc_timeout_ms = 500\nsnapshot_every_logs = {snapshot_every_logs}\n{raft_toml}\n[defaults]\n{defaults}\n{extra_toml}\n"
    );
    if let Some(certs) = certs {
        text.push_str(&format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\nca_file = {:?}\npeer_client_auth = true\n\n",
            certs.cert_file, certs.key_file, certs.ca_file
        ));
    }
    for node in nodes {
        text.push_str(&format!(
            "[[node]]\nid = {}\napi_addr = \"{}\"\nraft_addr = \"{}\"\ndata_dir = \"{}\"\n",
            node.id,
            node.api_addr,
            node.raft_addr,
            if settings.power_loss_disks {
                disks::data_dir(node.id)
            } else {
                format!("data/node-{}", node.id)
            }
        ));
        if let Some(addr) = &node.advertise_raft_addr {
            text.push_str(&format!("advertise_raft_addr = \"{addr}\"\n"));
        }
        if settings.distinct_source_ips {
            text.push_str(&format!(
                "peer_source_ip = \"{}\"\n",
                peer_source_ip(node.id)
            ));
        }
        text.push('\n');
    }
    text
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    /// `x-permitd-leader`.
    pub leader: Option<u64>,
    pub retry_after: Option<String>,
}

impl Answer {
    async fn from(result: reqwest::Result<reqwest::Response>) -> Self {
        let answer = match result {
            Ok(answer) => answer,
            Err(error) => {
                return Self {
                    status: 0,
                    body: json!({"transport": error.to_string()}),
                    leader: None,
                    retry_after: None,
                }
            }
        };
        let header = |name: &str| {
            answer
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let leader = header(headers::LEADER).and_then(|value| value.parse().ok());
        let retry_after = header("retry-after");
        let status = answer.status().as_u16();
        let body = answer.json().await.unwrap_or(Value::Null);
        Self {
            status,
            body,
            leader,
            retry_after,
        }
    }

    /// The error code of a JSON error answer.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// A `request` message.
pub fn request(client: &str, demand: &[(&str, u64, u64)]) -> Value {
    let demand: Vec<Value> = demand
        .iter()
        .map(|(group, count, oldest_at)| json!({"group": group, "count": count, "oldestAt": oldest_at}))
        .collect();
    json!({"type": "request", "v": 1, "clientId": client, "demand": demand})
}

/// Sum of the permits granted in a `grant` answer.
pub fn granted(answer: &Value) -> u64 {
    answer["grants"]
        .as_array()
        .map(|grants| grants.iter().filter_map(|g| g["permits"].as_u64()).sum())
        .unwrap_or(0)
}

/// Polls `check` until it holds or `timeout` passes; returns whether it held.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    false
}
