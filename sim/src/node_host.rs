//! One simulated node: the node's real start-up (`app::start_unbound`), given
//! simulated seams, serving both routers on simulated TCP listeners with the
//! production per-connection path (`edge::connection`). turmoil runs it as a
//! host, and runs it again from the start after a crash: the disk is all that
//! survives.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::ServerState;
use permitd_core::KeyConfig;
use permitd_node::app::{self, App, NodeSettings};
use permitd_node::clock::Clock;
use permitd_node::config::{EdgeLimits, RaftTimings};
use permitd_node::credentials::AuthSettings;
use permitd_node::edge::connection::Connections;
use permitd_node::leader::rounds::RoundLimits;
use permitd_node::seams::Seams;
use permitd_node::shutdown::Shutdown;
use permitd_storage::{Exec, NodeId, PeerNode};

use crate::disk::SimDisk;
use crate::elections::{Disturbances, TermsSeen};
use crate::net::{SimPeerStreams, SimTransport};
use crate::replicas::Replicas;
use crate::trace::Trace;

/// The port of every node's public API.
pub const API_PORT: u16 = 7000;
/// The port of every node's `/raft/*` and `/cluster/*` listener.
pub const RAFT_PORT: u16 = 7100;
/// Where a node's data dir is on its simulated disk.
pub const DATA_DIR: &str = "/data";

/// A node's host name.
pub fn host_name(id: NodeId) -> String {
    format!("node{id}")
}

/// What every node of one run shares.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub seed: u64,
    pub members: BTreeMap<NodeId, PeerNode>,
    pub timings: RaftTimings,
    pub trace: Trace,
    /// Every term seen and when it was first led (`elections.rs`).
    pub terms: TermsSeen,
    /// When faults, restarts and stops happened (`elections.rs`).
    pub disturbances: Disturbances,
    /// The leader's bounds on waiting work (`[limits]` of the cluster file).
    pub rounds: RoundLimits,
    /// Nodes that could not start on a healthy disk.
    pub start_failures: Arc<Mutex<Vec<String>>>,
    /// The running nodes' applied states, for the replay check.
    pub replicas: Replicas,
    /// `[cluster] shards` of every node.
    pub shards: u32,
}

impl ClusterSpec {
    pub fn new(seed: u64, nodes: u64, trace: Trace) -> Self {
        let members = (1..=nodes)
            .map(|id| {
                let host = host_name(id);
                let peer = PeerNode {
                    api_addr: format!("{host}:{API_PORT}"),
                    raft_addr: format!("{host}:{RAFT_PORT}"),
                };
                (id, peer)
            })
            .collect();
        Self {
            seed,
            members,
            timings: RaftTimings {
                // Small, so snapshots, their install and log purges happen in
                // every run of a few simulated seconds.
                snapshot_every_logs: 60,
                log_kept_after_snapshot: 20,
                ..RaftTimings::default()
            },
            trace,
            terms: TermsSeen::default(),
            disturbances: Disturbances::default(),
            rounds: RoundLimits::default(),
            start_failures: Arc::default(),
            replicas: Replicas::default(),
            shards: 1,
        }
    }
}

/// One node's world: its disk and its clock's skew, both kept across its
/// restarts.
#[derive(Debug, Clone, Default)]
pub struct NodeWorld {
    pub disk: SimDisk,
    /// Milliseconds this node's wall clock is ahead (or behind) of the
    /// simulation's.
    pub skew_ms: Arc<AtomicI64>,
}

fn settings(id: NodeId, spec: &ClusterSpec, world: &NodeWorld) -> NodeSettings {
    let peer = &spec.members[&id];
    let skew = world.skew_ms.clone();
    let clock = Clock::Simulated(Arc::new(move || {
        let since_epoch = turmoil::since_epoch().unwrap_or_default().as_millis() as i64;
        (since_epoch + skew.load(Ordering::Relaxed)).max(0) as u64
    }));
    NodeSettings {
        id,
        api_addr: peer.api_addr.clone(),
        raft_addr: peer.raft_addr.clone(),
        data_dir: DATA_DIR.into(),
        secret: "simulated-peer-secret".into(),
        auth: AuthSettings::new(false, None),
        tls: None,
        peer_source_ip: None,
        timings: spec.timings.clone(),
        defaults: KeyConfig::default(),
        initial_members: spec.members.clone(),
        initialize_at_start: false,
        rounds: spec.rounds,
        edge: EdgeLimits::default(),
        reclaim_horizon: Duration::from_millis(permitd_node::leader::reclaim::DEFAULT_HORIZON_MS),
        seams: Seams {
            clock,
            precise_timer: false,
            seed: Some(spec.seed.wrapping_mul(31).wrapping_add(id)),
            exec: Exec::Inline,
            disk: Some(Arc::new(world.disk.clone())),
            transport: Some(Arc::new(SimTransport)),
            peer_transport: Some(Arc::new(SimPeerStreams::default())),
        },
        shards: spec.shards,
    }
}

/// Adds every node of `worlds` to `sim` as a host running [`run`] (again
/// from the start after a crash and a bounce).
pub fn add_nodes(
    sim: &mut turmoil::Sim<'_>,
    spec: &ClusterSpec,
    worlds: &BTreeMap<NodeId, NodeWorld>,
) {
    for (&id, world) in worlds {
        let (spec, world) = (spec.clone(), world.clone());
        sim.host(host_name(id), move || run(id, spec.clone(), world.clone()));
    }
}

/// Runs `action` (a crash, a restart) on node `id` with its links to `others`
/// cut one way, so that the FIN and RST segments its dropped connections send
/// are lost, as a dead machine's would be. (They would leave in the order
/// tokio drops the old runtime's tasks, which follows task ids counted
/// process-wide: a seed would not replay.) The links are healthy afterwards.
pub fn with_links_out_cut(
    sim: &mut turmoil::Sim<'_>,
    id: NodeId,
    others: &[String],
    action: impl FnOnce(&mut turmoil::Sim<'_>),
) {
    let from = host_name(id);
    for other in others.iter().filter(|other| **other != from) {
        sim.partition_oneway(from.clone(), other.clone());
    }
    action(sim);
    for other in others.iter().filter(|other| **other != from) {
        sim.repair_oneway(from.clone(), other.clone());
    }
}

/// The host's software: runs the node until its Raft core stops.
pub async fn run(id: NodeId, spec: ClusterSpec, world: NodeWorld) -> turmoil::Result {
    let settings = settings(id, &spec, &world);
    let handle = tokio::runtime::Handle::current();
    let now = || turmoil::sim_elapsed().unwrap_or_default();
    let app = match app::start_unbound(&settings, &handle).await {
        Ok(app) => app,
        Err(error) => {
            // A node may refuse to start on a disk that is full or failing (as
            // it must); on a healthy disk it is a finding.
            let faults = world.disk.faults();
            spec.trace
                .event(now(), &host_name(id), format_args!("cannot start: {error}"));
            spec.disturbances.at(now());
            let mut failures = spec
                .start_failures
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let first = !failures
                .iter()
                .any(|f| f.starts_with(&format!("node{id} ")));
            if !faults.full && !faults.failing_sync && first {
                failures.push(format!("node{id} at {:?}: {error}", now()));
            }
            return Ok(());
        }
    };
    spec.trace.event(now(), &host_name(id), "started");
    let _running = spec
        .replicas
        .running(id, shard_states(&app), world.disk.clone());
    spec.disturbances.at(now());
    if id == 1 && !app.meta().raft.is_initialized().await? {
        permitd_node::edge::api::cluster::initialize(&app)
            .await
            .map_err(|error| error.to_string())?;
    }
    let stop = Shutdown::default();
    let public = permitd_node::edge::api::public_router(app.clone());
    let internal = permitd_node::edge::api::internal_router(app.clone());
    tokio::spawn(accept(
        API_PORT,
        Connections::new(public, &settings.edge, None, stop.clone()),
    ));
    tokio::spawn(accept(
        RAFT_PORT,
        Connections::new(internal, &settings.edge, None, stop.clone()).with_peer_streams(),
    ));
    for shard in 0..spec.shards {
        tokio::spawn(watch_leadership(id, app.clone(), shard, spec.clone()));
    }
    let reason = app.fatal().await;
    spec.trace.event(
        now(),
        &host_name(id),
        format_args!("core stopped: {reason}"),
    );
    spec.disturbances.at(now());
    stop.trigger();
    Ok(())
}

async fn accept(port: u16, connections: Connections) {
    let listener = match turmoil::net::TcpListener::bind(("0.0.0.0", port)).await {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, port, "cannot listen");
            return;
        }
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(connections.clone().serve(stream));
            }
            Err(error) => {
                tracing::error!(%error, port, "accept failed: no more connections");
                return;
            }
        }
    }
}

/// Every shard's applied state, in shard order.
fn shard_states(app: &App) -> Vec<permitd_storage::SharedState> {
    app.shards.iter().map(|shard| shard.state.clone()).collect()
}

/// Records every term this node sees in `shard` (each shard has terms of its
/// own), and traces its role changes.
async fn watch_leadership(id: NodeId, app: App, shard: u32, spec: ClusterSpec) {
    let Some(group) = app.shard(shard) else {
        return;
    };
    let mut metrics = group.raft.metrics();
    let mut handovers = group.handovers.clone();
    let name = match spec.shards {
        1 => host_name(id),
        _ => format!("{} s{shard}", host_name(id)),
    };
    let mut last = None;
    loop {
        let (term, state, leader) = {
            let now = metrics.borrow_and_update();
            (now.current_term, now.state, now.current_leader)
        };
        let at = turmoil::sim_elapsed().unwrap_or_default();
        spec.terms
            .saw(shard, term, id, state == ServerState::Leader, at);
        if last.is_some_and(|(_, was)| was == ServerState::Leader) && state == ServerState::Learner
        {
            // It left the voters: a membership change removed the leader,
            // which goes shard by shard, each its own moment.
            spec.disturbances.in_shard(shard, at);
        }
        if last != Some((term, state)) {
            spec.trace.event(
                at,
                &name,
                format_args!("term {term} {state:?} leader {leader:?}"),
            );
            last = Some((term, state));
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            // A handover is an election on purpose: it explains the next term.
            // At S = 1 no handover task runs and its sender is gone from
            // the start: a closed watch must not end this watcher (it did,
            // and the election checks saw no term at all).
            Ok(()) = handovers.changed() => {
                spec.disturbances.in_shard(shard, at);
                spec.trace.event(at, &name, "hands the shard over");
            }
        }
    }
}
