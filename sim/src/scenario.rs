//! Scripted scenarios: the simulator's three real nodes with no random faults,
//! where a test writes what happens and when, and asserts on what the clients
//! got and at what simulated time (docs/simulation.md, "Scenario tests").
//!
//! A scenario is one async script, run as the simulated host `script`. It
//! calls the nodes' HTTP API through the simulator's transport
//! ([`Cluster::post`] and friends, or the real Rust client from
//! [`Cluster::client`]), sleeps in simulated time, and changes the world:
//! [`Cluster::crash`] and [`Cluster::restart`] a node, [`Cluster::pause`] it
//! (every link to and from it held, then delivered in a burst, as a
//! `SIGSTOP`ped process's peers see it) or [`Cluster::cut_off`] it (every link
//! dropping). Time is simulated and the links take exactly 1 ms, so a timing
//! rule ("answered at `waitMs`", "granted in the first round after the
//! release") is asserted with bounds of a few milliseconds that never flake.
//! A run is deterministic: the same scenario gives the same trace hash.
//!
//! The nodes, the network and the simulation itself are the seed runs' own
//! (`node_host.rs`, `net.rs`, [`crate::run::simulation`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use permitd_core::contract::cluster::ClusterStatus;
use permitd_core::contract::headers;
use permitd_node::leader::rounds::RoundLimits;
use permitd_storage::NodeId;
use permitd_transport::{collect, Deadline, HttpTransport};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::net::SimTransport;
use crate::node_host::{self, host_name, ClusterSpec, NodeWorld, API_PORT};
use crate::run::simulation;
use crate::trace::Trace;
use crate::workload;

/// The nodes of every scenario.
const NODES: u64 = 3;
/// The host the script runs on.
const SCRIPT_HOST: &str = "script";
/// How long a call to `/cluster/status` may take (a paused or dead node
/// does not answer).
const STATUS_TIMEOUT: Duration = Duration::from_millis(300);
/// How often a wait for a condition looks again, in simulated time.
const POLL_EVERY: Duration = Duration::from_millis(5);

/// One scenario's settings; [`Scenario::run`] runs a script under them.
#[derive(Debug, Clone)]
pub struct Scenario {
    seed: u64,
    /// A script not finished by then fails.
    limit: Duration,
    rounds: RoundLimits,
    /// `[raft] rpc_timeout_ms`, if not the shipped one.
    rpc_timeout_ms: Option<u64>,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            seed: 1,
            limit: Duration::from_secs(120),
            rounds: RoundLimits::default(),
            rpc_timeout_ms: None,
        }
    }
}

impl Scenario {
    pub fn new() -> Self {
        Self::default()
    }

    /// The seed of the nodes' and turmoil's draws (election timeouts, ids).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The nodes' `[limits]` of waiting work.
    pub fn rounds(mut self, rounds: RoundLimits) -> Self {
        self.rounds = rounds;
        self
    }

    /// The nodes' Raft RPC deadline (`[raft] rpc_timeout_ms`).
    pub fn rpc_timeout_ms(mut self, rpc_timeout_ms: u64) -> Self {
        self.rpc_timeout_ms = Some(rpc_timeout_ms);
        self
    }

    /// Runs `script` against a fresh cluster until it returns; a failed
    /// assertion in it fails the run with the trace's last events. Returns
    /// the run's trace (its hash shows that a run replays).
    pub fn run<F, Fut>(self, script: F) -> Trace
    where
        F: FnOnce(Cluster) -> Fut + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let trace = Trace::keeping(400);
        let mut spec = ClusterSpec::new(self.seed, NODES, trace.clone());
        spec.rounds = self.rounds;
        if let Some(rpc_timeout_ms) = self.rpc_timeout_ms {
            spec.timings.rpc_timeout_ms = rpc_timeout_ms;
        }
        let worlds: BTreeMap<NodeId, NodeWorld> =
            (1..=NODES).map(|id| (id, NodeWorld::default())).collect();
        // Every link takes exactly 1 ms: timings are exact.
        let mut sim = simulation(self.seed, self.limit)
            .max_message_latency(Duration::from_millis(1))
            .build();
        node_host::add_nodes(&mut sim, &spec, &worlds);
        let cluster = Cluster {
            shared: Arc::new(Shared {
                controls: Mutex::default(),
                isolated: Mutex::default(),
                trace: trace.clone(),
            }),
        };
        let controls = cluster.clone();
        sim.client(SCRIPT_HOST, async move {
            script(cluster).await;
            Ok(())
        });
        let hosts: Vec<String> = (1..=NODES)
            .map(host_name)
            .chain([SCRIPT_HOST.to_owned()])
            .collect();
        loop {
            // A failed assertion in the script panics out of the step: show
            // what led to it first.
            let step = std::panic::catch_unwind(AssertUnwindSafe(|| sim.step()));
            match step {
                Ok(Ok(true)) => {
                    let violations = spec.replicas.check();
                    assert!(
                        violations.is_empty(),
                        "{violations:?}\n{}",
                        last_events(&trace)
                    );
                    return trace;
                }
                Ok(Ok(false)) => {}
                Ok(Err(error)) => panic!("{error}\n{}", last_events(&trace)),
                Err(panic) => {
                    eprintln!("{}", last_events(&trace));
                    std::panic::resume_unwind(panic);
                }
            }
            controls.apply(&mut sim, &hosts);
        }
    }
}

/// What the step loop does for the script between two steps: what only the
/// simulation (not a host) can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    Crash(NodeId),
    Restart(NodeId),
}

/// How a node is kept from the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    /// Its links hold every message, delivered when it is resumed.
    Paused,
    /// Its links drop every message.
    CutOff,
}

#[derive(Debug)]
struct Shared {
    controls: Mutex<Vec<(Control, oneshot::Sender<()>)>>,
    isolated: Mutex<BTreeMap<NodeId, Isolation>>,
    trace: Trace,
}

/// One HTTP answer, as the script got it.
#[derive(Debug, Clone)]
pub struct Answer {
    /// 0 when no answer came (the transport's error is in `body.transport`).
    pub status: u16,
    pub body: Value,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
    /// The leader the answering node named (`x-permitd-leader`).
    pub leader: Option<NodeId>,
    /// When it came, in simulated time since the start.
    pub at: Duration,
}

impl Answer {
    /// The error body's code, or "".
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }

    /// Permits granted in a grant answer.
    pub fn granted(&self) -> u64 {
        self.body["grants"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|grant| grant["permits"].as_u64())
            .sum()
    }

    /// The first grant's id.
    pub fn grant_id(&self) -> String {
        match self.body["grants"][0]["grantId"].as_str() {
            Some(id) => id.to_owned(),
            None => panic!("no grant in {}", self.body),
        }
    }
}

/// The script's handle on the cluster; cheap to clone (a spawned call takes
/// its own).
#[derive(Debug, Clone)]
pub struct Cluster {
    shared: Arc<Shared>,
}

/// Simulated time since the start.
pub fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

impl Cluster {
    fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
        mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every node's id.
    pub fn nodes(&self) -> Vec<NodeId> {
        (1..=NODES).collect()
    }

    /// Every node but `id`.
    pub fn others(&self, id: NodeId) -> Vec<NodeId> {
        self.nodes().into_iter().filter(|n| *n != id).collect()
    }

    /// Records `what` in the run's trace.
    pub fn event(&self, what: impl std::fmt::Display) {
        self.shared.trace.event(now(), SCRIPT_HOST, what);
    }

    /// Sends one call to `node`'s API; `timeout` bounds it (none: it waits
    /// as long as the node takes, a held link included).
    pub async fn call(
        &self,
        node: NodeId,
        method: http::Method,
        path: &str,
        body: Option<&Value>,
        timeout: Option<Duration>,
    ) -> Answer {
        let uri = format!("http://{}:{API_PORT}{path}", host_name(node));
        let bytes = body.map_or_else(Bytes::new, |body| Bytes::from(body.to_string()));
        let mut request = http::Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(bytes)
            .expect("a valid request");
        if let Some(timeout) = timeout {
            request.extensions_mut().insert(Deadline(timeout));
        }
        let answer = match SimTransport.send(request).await {
            Ok(response) => {
                let (retry_after, leader) = (
                    number_header(&response, "retry-after"),
                    number_header(&response, headers::LEADER),
                );
                let status = response.status().as_u16();
                match collect(response.into_body()).await {
                    Ok(bytes) => Answer {
                        status,
                        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                        retry_after,
                        leader,
                        at: now(),
                    },
                    Err(error) => failed(&error),
                }
            }
            Err(error) => failed(&error),
        };
        self.event(format_args!(
            "{method} node{node} {path}: {} {}",
            answer.status,
            answer.code()
        ));
        answer
    }

    pub async fn post(&self, node: NodeId, path: &str, body: &Value) -> Answer {
        self.call(node, http::Method::POST, path, Some(body), None)
            .await
    }

    pub async fn put(&self, node: NodeId, path: &str, body: &Value) -> Answer {
        self.call(node, http::Method::PUT, path, Some(body), None)
            .await
    }

    pub async fn get(&self, node: NodeId, path: &str) -> Answer {
        self.call(node, http::Method::GET, path, None, None).await
    }

    /// Sends a POST in a task of its own; the task ends with its answer.
    pub fn spawn_post(
        &self,
        node: NodeId,
        path: &str,
        body: &Value,
    ) -> tokio::task::JoinHandle<Answer> {
        let (cluster, path, body) = (self.clone(), path.to_owned(), body.clone());
        tokio::spawn(async move { cluster.post(node, &path, &body).await })
    }

    /// `node`'s `/cluster/status`, if it answers within [`STATUS_TIMEOUT`].
    pub async fn status(&self, node: NodeId) -> Option<ClusterStatus> {
        let path = permitd_core::contract::paths::CLUSTER_STATUS;
        let answer = self
            .call(node, http::Method::GET, path, None, Some(STATUS_TIMEOUT))
            .await;
        if answer.status != 200 {
            return None;
        }
        serde_json::from_value(answer.body).ok()
    }

    /// The leader a majority of the nodes names, itself among them, once
    /// there is one (waits for it: a fresh cluster or one after a leader's
    /// loss elects).
    pub async fn leader(&self) -> NodeId {
        loop {
            let mut named: BTreeMap<NodeId, Vec<NodeId>> = BTreeMap::new();
            for node in self.nodes() {
                if let Some(leader) = self.status(node).await.and_then(|s| s.leader) {
                    named.entry(leader).or_default().push(node);
                }
            }
            let elected = named
                .into_iter()
                .find(|(leader, by)| by.contains(leader) && by.len() as u64 > NODES / 2);
            if let Some((leader, _)) = elected {
                return leader;
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Waits (in simulated time, at most `within`) until `check` holds;
    /// whether it did.
    pub async fn eventually<F, Fut>(&self, within: Duration, mut check: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let until = now() + within;
        loop {
            if check().await {
                return true;
            }
            if now() >= until {
                return false;
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Configures `key` through `node` (any node forwards to the leader).
    pub async fn configure(&self, node: NodeId, key: &str, config: Value) {
        let answer = self
            .put(node, &format!("/v1/semaphores/{key}/config"), &config)
            .await;
        assert_eq!(answer.status, 200, "configuring {key}: {}", answer.body);
    }

    /// Requests waiting on the leader `node` for `key`'s round, parked or held
    /// (its holders view).
    pub async fn waiting(&self, node: NodeId, key: &str) -> usize {
        let answer = self
            .get(node, &format!("/v1/semaphores/{key}/holders"))
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.body["clients"]
            .as_object()
            .into_iter()
            .flat_map(|clients| clients.values())
            .map(|client| client["waiting"].as_array().map_or(0, Vec::len))
            .sum()
    }

    /// The real Rust client, over the simulated network, knowing every node.
    pub fn client(&self, seed: u64) -> permitd_client::SemaphoreClient {
        let endpoints: Vec<String> = self
            .nodes()
            .into_iter()
            .map(|id| format!("{}:{API_PORT}", host_name(id)))
            .collect();
        workload::client(&endpoints, seed).expect("a client")
    }

    /// Crashes node `id` (its process dies; its disk keeps what a killed
    /// process's would) and returns once it is down.
    pub async fn crash(&self, id: NodeId) {
        self.control(Control::Crash(id)).await;
    }

    /// Starts node `id` again on its disk.
    pub async fn restart(&self, id: NodeId) {
        self.control(Control::Restart(id)).await;
    }

    async fn control(&self, control: Control) {
        let (done, applied) = oneshot::channel();
        Self::lock(&self.shared.controls).push((control, done));
        applied.await.expect("the step loop applies controls");
    }

    /// Holds every message to and from node `id` until [`Self::resume`]: to
    /// its peers it is a paused process (its own timers still run).
    pub fn pause(&self, id: NodeId) {
        self.isolate(id, Some(Isolation::Paused));
    }

    /// Delivers what was held, and lets messages through again.
    pub fn resume(&self, id: NodeId) {
        self.isolate(id, None);
    }

    /// Drops every message to and from node `id` until [`Self::reconnect`].
    pub fn cut_off(&self, id: NodeId) {
        self.isolate(id, Some(Isolation::CutOff));
    }

    pub fn reconnect(&self, id: NodeId) {
        self.isolate(id, None);
    }

    /// Drops every message between nodes `a` and `b` (both ways), and only
    /// between them, until [`Self::repair`].
    pub fn partition(&self, a: NodeId, b: NodeId) {
        turmoil::partition(host_name(a).as_str(), host_name(b).as_str());
        self.event(format_args!("partition node{a} node{b}"));
    }

    pub fn repair(&self, a: NodeId, b: NodeId) {
        turmoil::repair(host_name(a).as_str(), host_name(b).as_str());
        self.event(format_args!("repair node{a} node{b}"));
    }

    fn isolate(&self, id: NodeId, isolation: Option<Isolation>) {
        let node = host_name(id);
        let others = self
            .others(id)
            .into_iter()
            .map(host_name)
            .chain([SCRIPT_HOST.to_owned()]);
        let previous = {
            let mut isolated = Self::lock(&self.shared.isolated);
            match isolation {
                Some(isolation) => isolated.insert(id, isolation),
                None => isolated.remove(&id),
            }
        };
        for other in others {
            match (previous, isolation) {
                (Some(Isolation::Paused), None) => turmoil::release(node.as_str(), other.as_str()),
                (Some(Isolation::CutOff), None) => turmoil::repair(node.as_str(), other.as_str()),
                (_, Some(Isolation::Paused)) => turmoil::hold(node.as_str(), other.as_str()),
                (_, Some(Isolation::CutOff)) => turmoil::partition(node.as_str(), other.as_str()),
                (None, None) => {}
            }
        }
        self.event(format_args!("node{id} {isolation:?}"));
    }

    /// Applies the script's controls (from the step loop, between steps).
    fn apply(&self, sim: &mut turmoil::Sim<'_>, hosts: &[String]) {
        let controls = std::mem::take(&mut *Self::lock(&self.shared.controls));
        for (control, done) in controls {
            let id = match control {
                Control::Crash(id) | Control::Restart(id) => id,
            };
            node_host::with_links_out_cut(sim, id, hosts, |sim| match control {
                Control::Crash(_) => sim.crash(host_name(id)),
                Control::Restart(_) => sim.bounce(host_name(id)),
            });
            // The cut above left the links healthy: a paused or cut-off node
            // stays so.
            let isolation = Self::lock(&self.shared.isolated).get(&id).copied();
            for other in hosts.iter().filter(|other| **other != host_name(id)) {
                match isolation {
                    Some(Isolation::Paused) => sim.hold(host_name(id), other.as_str()),
                    Some(Isolation::CutOff) => sim.partition(host_name(id), other.as_str()),
                    None => {}
                }
            }
            self.shared
                .trace
                .event(sim.elapsed(), SCRIPT_HOST, format_args!("{control:?}"));
            let _ = done.send(());
        }
    }
}

/// The trace's last events, for a failed run's report.
fn last_events(trace: &Trace) -> String {
    format!("last events:\n  {}", trace.last().join("\n  "))
}

/// A header's value, if it is a number.
fn number_header<B>(response: &http::Response<B>, name: &str) -> Option<u64> {
    let value = response.headers().get(name)?.to_str().ok()?;
    value.parse().ok()
}

/// A call that got no answer.
fn failed(error: &dyn std::fmt::Display) -> Answer {
    Answer {
        status: 0,
        body: json!({ "transport": error.to_string() }),
        retry_after: None,
        leader: None,
        at: now(),
    }
}
