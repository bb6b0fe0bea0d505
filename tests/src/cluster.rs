//! [`Cluster`]: real `permitd` processes in a temporary directory, started,
//! stopped, killed and called over HTTP.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config_file::{cluster_toml, SNAPSHOT_EVERY_LOGS};
use crate::http::{granted, http_client, request, Answer};
use crate::process::{clone_node, free_port, Node};
use crate::{certs, disks, netns, ADMIN_TOKEN, POLL, START_TIMEOUT};

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
    /// Node `i` sends its Raft RPCs from `127.0.0.(i+1)` ([`crate::peer_source_ip`]),
    /// so a proxy can tell senders apart without reading the (TLS) traffic.
    pub distinct_source_ips: bool,
    /// More lines of the `[raft]` table, in TOML.
    pub raft_toml: String,
    /// `[raft] snapshot_every_logs`: [`SNAPSHOT_EVERY_LOGS`] by default, ten
    /// times more often than the shipped `cluster.toml`, so that tests cross
    /// snapshots within seconds.
    pub snapshot_every_logs: u64,
    /// `(heartbeat_interval_ms, election_timeout_min_ms, election_timeout_max_ms)`
    /// instead of the harness's fast [`crate::HEARTBEAT_INTERVAL_MS`],
    /// [`crate::ELECTION_TIMEOUT_MIN_MS`] and [`crate::ELECTION_TIMEOUT_MAX_MS`].
    pub raft_timings_ms: Option<(u64, u64, u64)>,
    /// `[raft] rpc_timeout_ms` instead of the harness's 500.
    pub rpc_timeout_ms: Option<u64>,
    /// `--worker-threads` of every node; `None` leaves permitd's default.
    pub worker_threads: Option<u16>,
    /// Each node's data dir on a `powerfs` mount that can lose power
    /// ([`disks`]; [`Cluster::power_loss`]).
    pub power_loss_disks: bool,
    /// Each node in a network namespace of its own on one bridge
    /// ([`netns::Lan`], [`Cluster::lan`]); needs root: check
    /// [`netns::unavailable`] first.
    pub namespaces: bool,
    /// `[cluster] shards`: [`SHARDS_ENV`] when set (the whole suite at
    /// another shard count), else the node's default (1).
    pub shards: Option<u32>,
}

/// The environment variable that runs every test cluster with its number of
/// shards (`PERMITD_TEST_SHARDS=8 cargo test`; docs/operations.md, "Shards").
pub const SHARDS_ENV: &str = "PERMITD_TEST_SHARDS";

/// The shard count [`SHARDS_ENV`] asks for, if any.
pub fn shards_from_env() -> Option<u32> {
    std::env::var(SHARDS_ENV).ok()?.parse().ok()
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
            rpc_timeout_ms: None,
            worker_threads: None,
            power_loss_disks: false,
            namespaces: false,
            shards: shards_from_env(),
        }
    }
}

impl Settings {
    /// The repository's `cluster.toml` as shipped ([`shipped_cluster_file`]):
    /// its whole `[raft]` table (heartbeat, elections, RPC timeout, snapshot
    /// policy), its `[limits]` and its `[defaults]`, not the harness's. Ports,
    /// secret, token and data dirs stay the harness's.
    pub fn shipped() -> Self {
        let file = shipped_cluster_file();
        let table = |name: &str| -> toml::Table {
            file.get(name)
                .and_then(toml::Value::as_table)
                .cloned()
                .unwrap_or_else(|| panic!("cluster.toml has a [{name}] table"))
        };
        let mut raft = table("raft");
        let mut take = |key: &str| -> u64 {
            let value = raft
                .remove(key)
                .and_then(|value| value.as_integer())
                .unwrap_or_else(|| panic!("cluster.toml sets [raft] {key}"));
            u64::try_from(value).expect("a timing is not negative")
        };
        let timings = (
            take("heartbeat_interval_ms"),
            take("election_timeout_min_ms"),
            take("election_timeout_max_ms"),
        );
        let rpc_timeout_ms = take("rpc_timeout_ms");
        let snapshot_every_logs = take("snapshot_every_logs");
        let to_toml = |table: &toml::Table| toml::to_string(table).expect("TOML");
        Self {
            defaults: to_toml(&table("defaults")),
            extra_toml: format!("[limits]\n{}", to_toml(&table("limits"))),
            // The rest of the table (`snapshot_every_ms`, anything added later).
            raft_toml: to_toml(&raft),
            snapshot_every_logs,
            raft_timings_ms: Some(timings),
            rpc_timeout_ms: Some(rpc_timeout_ms),
            ..Self::default()
        }
    }
}

/// The repository's `cluster.toml`, parsed.
pub fn shipped_cluster_file() -> toml::Table {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../cluster.toml");
    let text = std::fs::read_to_string(path).expect("the repository's cluster.toml");
    text.parse().expect("cluster.toml is TOML")
}

/// The API port of a node in a namespace of its own ([`Settings::namespaces`]).
pub const NAMESPACED_API_PORT: u16 = 7000;
/// The Raft port of a node in a namespace of its own.
pub const NAMESPACED_RAFT_PORT: u16 = 7100;

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
    /// The nodes' namespaces, with [`Settings::namespaces`].
    pub lan: Option<netns::Lan>,
}

impl Cluster {
    /// Starts `settings.nodes` nodes, initialises them and waits for a leader.
    pub async fn start(settings: Settings) -> Self {
        let cluster = Self::spawn(settings);
        cluster.wait_healthy().await;
        let init = cluster.post_admin(1, "/cluster/init", &json!({})).await;
        assert_eq!(init.0, 200, "init failed: {}", init.1);
        cluster.wait_for_leader().await;
        cluster.wait_spread().await;
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
        cluster.wait_spread().await;
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
        let ids: Vec<u64> = (1..=settings.nodes as u64).collect();
        let lan = settings.namespaces.then(|| {
            assert!(!settings.tls, "namespaced nodes have no certificates");
            netns::Lan::create(&ids).expect("network namespaces")
        });
        let mut nodes: Vec<Node> = ids
            .iter()
            .map(|&id| {
                // A node of its own host listens on fixed ports.
                let (host, api_port, raft_port) = match &lan {
                    Some(lan) => (
                        lan.ip(id).to_string(),
                        NAMESPACED_API_PORT,
                        NAMESPACED_RAFT_PORT,
                    ),
                    None => ("127.0.0.1".to_owned(), free_port(), free_port()),
                };
                let raft_addr = format!("{host}:{raft_port}");
                Node {
                    id,
                    api_addr: format!("{host}:{api_port}"),
                    advertise_raft_addr: advertise(id, &raft_addr),
                    raft_addr,
                    scheme,
                    config: config.clone(),
                    working_dir: None,
                    worker_threads: settings.worker_threads,
                    namespace: lan.as_ref().map(|lan| lan.namespace(id)),
                    child: None,
                }
            })
            .collect();
        let toml = cluster_toml(&nodes, &settings, certs.as_ref());
        std::fs::write(&config, &toml).expect("config");
        let disks = settings.power_loss_disks.then(|| {
            let disks = disks::Disks::mount(dir.path(), nodes.iter().map(|node| node.id));
            for node in &mut nodes {
                let mount = dir.path().join(disks::mount_dir(node.id));
                disks::write_config(&mount, &toml);
                node.config = PathBuf::from(disks::CONFIG_FILE);
                node.working_dir = Some(mount);
            }
            disks
        });
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
            lan,
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

    /// With more than one shard: waits until every running node sees each
    /// shard led by its preferred leader (node `shard mod N + 1` of nodes
    /// 1..=N, `leader/handover.rs`), so a test starts in the steady state and
    /// not amid the handovers of a new cluster. Returns each shard's leader.
    pub async fn wait_spread(&self) -> Vec<u64> {
        let shards = self.settings.shards.unwrap_or(1);
        let voters = self.settings.nodes as u64;
        let deadline = Instant::now() + START_TIMEOUT;
        let preferred: Vec<u64> = (0..u64::from(shards))
            .map(|shard| shard % voters + 1)
            .collect();
        if shards == 1 {
            return preferred;
        }
        loop {
            let mut seen = Vec::new();
            for node in self.nodes.iter().filter(|node| node.is_running()) {
                let map = self.admin_get(node.id, "/cluster/shards").await;
                let leaders: Vec<Option<u64>> = map
                    .as_ref()
                    .and_then(|map| map["shards"].as_array().cloned())
                    .unwrap_or_default()
                    .iter()
                    .map(|shard| shard["leader"].as_u64())
                    .collect();
                seen.push(leaders);
            }
            let spread = seen.iter().all(|leaders| {
                leaders
                    .iter()
                    .copied()
                    .eq(preferred.iter().copied().map(Some))
            });
            if spread {
                return preferred;
            }
            assert!(
                Instant::now() < deadline,
                "the shards' leaders did not spread: {seen:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// The cluster's shard count ([`Settings::shards`]; 1 by default).
    pub fn shard_count(&self) -> u32 {
        self.settings.shards.unwrap_or(1)
    }

    /// The shard that holds `key` in this cluster.
    pub fn shard_of_key(&self, key: &str) -> u32 {
        permitd_core::shard::shard_of(key, self.shard_count()).expect("a valid shard count")
    }

    /// Each running node's view of every shard (`GET /cluster/shards`), in
    /// node order; an empty list for a node that does not answer.
    async fn shard_maps(&self) -> Vec<Vec<Value>> {
        let views = self.shard_views().await;
        views.into_iter().map(|(_, shards)| shards).collect()
    }

    /// Each running node's id and its view of every shard (`GET
    /// /cluster/shards`: per shard its `leader`, `term`, `members` and
    /// `appliedIndex`, shard `k` at position `k`), in node order; an empty
    /// list for a node that does not answer.
    pub async fn shard_views(&self) -> Vec<(u64, Vec<Value>)> {
        let mut views = Vec::new();
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            let map = self.admin_get(node.id, "/cluster/shards").await;
            let shards = map
                .as_ref()
                .and_then(|map| map["shards"].as_array().cloned())
                .unwrap_or_default();
            views.push((node.id, shards));
        }
        views
    }

    /// Waits until every running node names the same running leader and the
    /// same term for every shard, and returns each shard's `(leader, term)`,
    /// in shard order: at one shard, the leader and term of the cluster.
    pub async fn shard_leaders_and_terms(&self) -> Vec<(u64, u64)> {
        let shards = self.shard_count() as usize;
        let agreed = |views: &[(u64, Vec<Value>)]| -> Option<Vec<(u64, u64)>> {
            let (_, first) = views.first()?;
            let seen: Vec<(u64, u64)> = (0..shards)
                .map(|shard| {
                    let status = first.get(shard)?;
                    Some((status["leader"].as_u64()?, status["term"].as_u64()?))
                })
                .collect::<Option<_>>()?;
            let same = views.iter().all(|(_, view)| {
                view.len() == shards
                    && view.iter().zip(&seen).all(|(status, (leader, term))| {
                        status["leader"].as_u64() == Some(*leader)
                            && status["term"].as_u64() == Some(*term)
                    })
            });
            let running = seen.iter().all(|(leader, _)| {
                self.nodes
                    .iter()
                    .any(|node| node.id == *leader && node.is_running())
            });
            (same && running).then_some(seen)
        };
        let (found, views) = crate::wait::eventually_seen(START_TIMEOUT, || async {
            let views = self.shard_views().await;
            (agreed(&views).is_some(), views)
        })
        .await;
        assert!(
            found,
            "the nodes agree on no leader and term of every shard: {views:?}"
        );
        agreed(&views).expect("agreed above")
    }

    /// Waits until node `id` names a leader of every shard and has applied,
    /// in each it follows, what that leader had applied once `id` named it;
    /// returns whether it did within `timeout`.
    ///
    /// The targets are fixed before the wait: under load a leader is always
    /// an entry or two ahead of its followers, which learn each commit with
    /// the next append or heartbeat, so comparing against the leader's
    /// moving index could miss every poll.
    pub async fn wait_caught_up(&self, id: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let (named, targets) = crate::wait::eventually_seen(timeout, || async {
            let targets = self.catch_up_targets(id).await;
            (targets.is_some(), targets)
        })
        .await;
        let Some(targets) = targets.filter(|_| named) else {
            return false;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        crate::wait::eventually(left, || async {
            for &(shard, target) in &targets {
                match self.shard_applied(id, shard).await {
                    Some(applied) if applied >= target => {}
                    _ => return false,
                }
            }
            true
        })
        .await
    }

    /// `(shard, the leader's applied index)` of every shard node `id` follows,
    /// with its leader as `id` names it; `None` while `id` names no leader of
    /// some shard or a leader does not answer.
    async fn catch_up_targets(&self, id: u64) -> Option<Vec<(u32, u64)>> {
        let theirs = self.admin_get(id, "/cluster/shards").await?;
        let mut targets = Vec::new();
        for shard in 0..self.shard_count() {
            let leader = theirs["shards"][shard as usize]["leader"].as_u64()?;
            if leader != id {
                targets.push((shard, self.shard_applied(leader, shard).await?));
            }
        }
        Some(targets)
    }

    /// The first key `prefix-0`, `prefix-1`, … that `shard` holds.
    pub fn key_in_shard(&self, prefix: &str, shard: u32) -> String {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|key| self.shard_of_key(key) == shard)
            .expect("every shard holds keys")
    }

    /// Waits until every running node names the same running leader of
    /// `shard`, and returns it: at one shard, the leader
    /// [`Cluster::wait_for_leader`] finds.
    pub async fn shard_leader(&self, shard: u32) -> u64 {
        let (agreed, leaders) = crate::wait::eventually_seen(START_TIMEOUT, || async {
            let leaders: Vec<Option<u64>> = self
                .shard_maps()
                .await
                .iter()
                .map(|map| {
                    map.get(shard as usize)
                        .and_then(|status| status["leader"].as_u64())
                })
                .collect();
            let agreed = self.agreed_running_leader(&leaders).is_some();
            (agreed, leaders)
        })
        .await;
        assert!(agreed, "no leader of shard {shard} agreed: {leaders:?}");
        self.agreed_running_leader(&leaders).expect("agreed above")
    }

    /// The leader every node names in `leaders`, if they all name the same
    /// one and it runs.
    fn agreed_running_leader(&self, leaders: &[Option<u64>]) -> Option<u64> {
        let leader = (*leaders.first()?)?;
        let agreed = leaders.iter().all(|seen| *seen == Some(leader));
        let running = self.nodes.iter().any(|n| n.id == leader && n.is_running());
        (agreed && running).then_some(leader)
    }

    /// The leader of `key`'s shard, once every running node agrees on it
    /// ([`Cluster::shard_leader`]): the node that runs `key`'s rounds.
    pub async fn key_leader(&self, key: &str) -> u64 {
        self.shard_leader(self.shard_of_key(key)).await
    }

    /// The index of the last entry of `shard` node `id` applied, or `None`
    /// if it does not answer or has applied nothing.
    pub async fn shard_applied(&self, id: u64, shard: u32) -> Option<u64> {
        let map = self.admin_get(id, "/cluster/shards").await?;
        map["shards"].get(shard as usize)?["appliedIndex"].as_u64()
    }

    /// A running node that is not `leader`.
    pub fn follower_of(&self, leader: u64) -> u64 {
        self.nodes
            .iter()
            .find(|node| node.id != leader && node.is_running())
            .expect("a running follower")
            .id
    }

    /// Every node but `leader`.
    pub fn followers_of(&self, leader: u64) -> Vec<u64> {
        let ids = self.nodes.iter().map(|node| node.id);
        ids.filter(|id| *id != leader).collect()
    }

    /// `/cluster/status` of a node, or `None` if it does not answer.
    pub async fn status(&self, id: u64) -> Option<Value> {
        self.admin_get(id, "/cluster/status").await
    }

    /// A node's JSON answer to `GET path` with the admin token, or `None` if
    /// it does not answer within 2 s.
    pub async fn admin_get(&self, id: u64, path: &str) -> Option<Value> {
        let url = format!("{}{path}", self.node(id).url());
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

    /// `lastApplied` of node `id`'s `/cluster/status`, or `None` if it does not
    /// answer or has applied nothing.
    pub async fn last_applied(&self, id: u64) -> Option<u64> {
        self.status(id).await?["lastApplied"].as_u64()
    }

    /// Waits until every running node has applied all that `leader` had
    /// applied when called: whatever the leader committed before has taken
    /// effect everywhere. Fails the test after 30 s.
    pub async fn wait_applied_everywhere(&self, leader: u64) {
        let target = self
            .last_applied(leader)
            .await
            .expect("the leader answers its status");
        let deadline = Instant::now() + START_TIMEOUT;
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            loop {
                let applied = self.last_applied(node.id).await;
                if applied >= Some(target) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {} applied {applied:?}, not yet {target}",
                    node.id
                );
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// The value of the metric `name` (a series without labels) on node `id`,
    /// or `None` if the node does not answer or has no such series.
    pub async fn metric(&self, id: u64, name: &str) -> Option<f64> {
        let url = format!("{}/metrics", self.node(id).url());
        let text = self.http.get(url).send().await.ok()?.text().await.ok()?;
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    }

    /// The sum of every series of the metric `name` (with any labels; not its
    /// `_bucket`, `_sum` or `_count` series) on node `id`, or `None` if the node
    /// does not answer or has no such series.
    pub async fn metric_total(&self, id: u64, name: &str) -> Option<f64> {
        let url = format!("{}/metrics", self.node(id).url());
        let text = self.http.get(url).send().await.ok()?.text().await.ok()?;
        let values: Vec<f64> = text
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(name)?;
                let value = match rest.strip_prefix('{') {
                    Some(labelled) => labelled.split_once("} ")?.1,
                    None => rest.strip_prefix(' ')?,
                };
                value.trim().parse().ok()
            })
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) to node `id`: the process freezes
    /// without closing anything, as a paused VM or a starved CPU would, and
    /// goes on where it was.
    pub fn pause(&self, id: u64, paused: bool) {
        use nix::sys::signal::{kill, Signal};
        let pid = self.node(id).pid().expect("the node runs");
        let signal = if paused {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        kill(nix::unistd::Pid::from_raw(pid as i32), signal).expect("signal the node");
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

    /// Starts a stopped node again on its data.
    pub fn restart(&mut self, id: u64) {
        let dir = self.dir.path().to_owned();
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} is running");
        node.spawn(&dir);
    }

    /// Writes a cluster file for `nodes` plus a new node, and starts the new node
    /// (uninitialised: it waits to be added). Returns its id.
    pub fn spawn_extra_node(&mut self) -> u64 {
        assert!(self.lan.is_none(), "a namespaced cluster cannot grow");
        let id = self.nodes.len() as u64 + 1;
        let config = self.dir.path().join(format!("cluster-{id}.toml"));
        let mut node = Node {
            id,
            api_addr: format!("127.0.0.1:{}", free_port()),
            raft_addr: format!("127.0.0.1:{}", free_port()),
            advertise_raft_addr: None,
            scheme: self.nodes[0].scheme,
            config: config.clone(),
            working_dir: None,
            worker_threads: self.settings.worker_threads,
            namespace: None,
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

    /// [`Cluster::call`] about `shard` alone (`x-permitd-shard`) when `Some`:
    /// a call that names no key (a batch, `/readyz`) then covers that shard
    /// only and goes to its leader as one call, as at one shard.
    pub async fn call_in_shard(
        &self,
        id: u64,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        shard: Option<u32>,
    ) -> Answer {
        let url = format!("{}{path}", self.node(id).url());
        let mut request = self.bare_http.request(method, url).bearer_auth(ADMIN_TOKEN);
        if let Some(shard) = shard {
            request = request.header(permitd_core::contract::headers::SHARD, shard);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        Answer::from(request.send().await).await
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
        // Deleted once no process runs in them.
        drop(self.lan.take());
    }
}

/// `count` keys named `prefix-00`, `prefix-01`, …, checked to cover every one
/// of `shards` shards (so a test over them touches each shard).
pub fn keys_covering_shards(prefix: &str, count: usize, shards: u32) -> Vec<String> {
    let keys: Vec<String> = (0..count).map(|i| format!("{prefix}-{i:02}")).collect();
    let covered: std::collections::BTreeSet<u32> = keys
        .iter()
        .map(|key| permitd_core::shard::shard_of(key, shards).expect("a valid shard count"))
        .collect();
    assert_eq!(
        covered.len(),
        shards as usize,
        "the keys cover every shard: {keys:?}"
    );
    keys
}
