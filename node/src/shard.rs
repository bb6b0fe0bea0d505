//! One shard on this node: a Raft group of its own over the cluster's voters,
//! with its own store (over the node's one write-ahead log), leadership, rounds
//! driver, reclaim timers, election guard and event log.
//!
//! A cluster of S shards runs S of these on every node; a key lives in
//! `shard_of(key, S)` (`permitd_core::shard`). Shard 0 is also the meta group:
//! it alone holds the tokens and the cluster defaults written through the API,
//! and each other shard's leader copies those defaults into its own log
//! ([`crate::leader::seed_defaults`]), so every shard's apply stays a pure
//! function of its own log (docs/architecture.md, "Shards").

use std::sync::Arc;
use std::time::Duration;

use permitd_core::KeyConfig;
use permitd_storage::{NodeId, Opened, ShardId, SharedState};
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::config::RaftTimings;
use crate::leader::leadership::{watch_leadership, Leadership};
use crate::leader::rounds::RoundLimits;
use crate::leader::rounds::Rounds;
use crate::observe::event_log::{EventHub, EventLog};
use crate::raft::election_guard::ElectionGuard;
use crate::raft::liveness::{Liveness, LivenessShard};
use crate::raft::network::Network;
use crate::raft::quiescence::{Quiescence, RaftSwitch};
use crate::raft::stall_clock::StallClock;
use crate::raft::stall_probe::LeaderContact;
use crate::raft::Raft;

/// The shard that holds the tokens and the cluster defaults.
pub const META_SHARD: ShardId = 0;

/// One shard's running parts on this node.
pub struct Shard {
    pub id: ShardId,
    pub raft: Raft,
    pub state: SharedState,
    pub leadership: watch::Receiver<Leadership>,
    pub rounds: Rounds,
    /// Gaps between the appends received from this shard's leader.
    pub leader_contact: Arc<LeaderContact>,
    /// Answers this shard's pre-votes; decides when this node may stand.
    pub election_guard: Arc<ElectionGuard>,
    /// Recent lifecycle events of this shard's keys (`GET /v1/events`).
    pub events: EventLog,
    /// Handovers this node started for the shard (`leader/handover.rs`):
    /// each is an election on purpose.
    pub handovers: watch::Receiver<u64>,
    /// When the shard is quiet here (`raft/quiescence.rs`).
    pub quiescence: Quiescence,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("id", &self.id)
            .field("leadership", &*self.leadership.borrow())
            .finish_non_exhaustive()
    }
}

/// Why a shard's Raft core could not start.
#[derive(Debug, thiserror::Error)]
#[error("shard {shard}: {detail}")]
pub struct ShardStartError {
    pub shard: ShardId,
    pub detail: String,
}

/// What every shard of a node shares when it starts.
pub(crate) struct ShardStart<'a> {
    pub node: NodeId,
    pub timings: &'a RaftTimings,
    /// The node's `[limits]`, shared out over its shards.
    pub rounds: RoundLimits,
    pub reclaim_horizon: Duration,
    pub seams: &'a crate::seams::Seams,
    pub raft_runtime: &'a Handle,
    pub network: &'a Network,
    pub config: Arc<openraft::Config>,
    /// The node's shard count: the parked-work limits are shared out over it.
    pub shards: u32,
    /// What every shard's event log shares (the node's stream limit).
    pub events: &'a EventHub,
    /// The node's liveness exchanges (`raft/liveness.rs`): the peers heard stand
    /// for a quiet shard's quorum acknowledgements.
    pub liveness: &'a Arc<Liveness>,
    /// When the node's Raft runtime last woke from a stall, for every
    /// shard's election guard (`raft/stall_clock.rs`).
    pub stalls: &'a Arc<StallClock>,
}

impl Shard {
    /// Starts shard `id` over its opened store: its Raft core and its tasks.
    pub(crate) async fn start(
        id: ShardId,
        opened: Opened,
        start: &ShardStart<'_>,
    ) -> Result<Self, ShardStartError> {
        let network = start.network.for_shard(id);
        let (node, config, raft_network) = (start.node, start.config.clone(), network.clone());
        let failed = |detail: String| ShardStartError { shard: id, detail };
        // The log tells the network of each append, so that new entries leave
        // for idle followers before this node's sync (`raft/early_appends.rs`).
        let log = opened.log.observed_by(network.early_appends());
        let state_machine = opened.state_machine;
        let raft = start
            .raft_runtime
            .spawn(async move { Raft::new(node, config, raft_network, log, state_machine).await })
            .await
            .map_err(|error| failed(error.to_string()))?
            .map_err(|error| failed(error.to_string()))?;
        let leader_contact = Arc::new(LeaderContact::default());
        let timings = start.timings;
        let election_guard = Arc::new(ElectionGuard::new(
            (start.node, id),
            (leader_contact.clone(), start.stalls.clone()),
            (
                Duration::from_millis(timings.heartbeat_interval_ms),
                Duration::from_millis(timings.election_timeout_min_ms),
                Duration::from_millis(timings.election_timeout_max_ms),
            ),
            start
                .seams
                .rng(RNG_ELECTION_GUARD + u64::from(id) * RNG_STREAMS_PER_SHARD),
        ));
        let quiescence = Quiescence {
            shard: id,
            switch: RaftSwitch::new(raft.clone()),
            wake: Arc::default(),
        };
        {
            let _on_raft_runtime = start.raft_runtime.enter();
            election_guard
                .clone()
                .start(raft.clone(), network, quiescence.switch.clone());
            if id == META_SHARD {
                crate::raft::stall_probe::start(&raft, "raft", Some(start.stalls.clone()));
            }
        }
        if id == META_SHARD {
            crate::raft::stall_probe::start(&raft, "api", None);
        }
        let (stepping_down, stepping) = watch::channel(false);
        let leadership = watch_leadership(&raft, election_guard.leader_silent(), stepping, id);
        let (started, handovers) = watch::channel(0);
        crate::leader::handover::Handover {
            shard: id,
            raft: raft.clone(),
            network: start.network.for_shard(id),
            stepping_down,
            lease: Duration::from_millis(timings.election_timeout_max_ms),
            heartbeat: Duration::from_millis(timings.heartbeat_interval_ms),
            switch: quiescence.switch.clone(),
            started,
        }
        .start(start.shards);
        if start.shards > 1 {
            let _on_raft_runtime = start.raft_runtime.enter();
            let heartbeat = Duration::from_millis(timings.heartbeat_interval_ms);
            quiescence.start(raft.clone(), leadership.clone(), heartbeat);
        }
        let state = opened.state;
        let rounds = Rounds::start(
            raft.clone(),
            state.clone(),
            leadership.clone(),
            start.rounds.per_shard(start.shards),
            (start.seams, start.raft_runtime),
        );
        {
            // On the Raft runtime: it takes a notice of every entry the
            // leader applies, and there that wakes no other thread.
            let _on_raft_runtime = start.raft_runtime.enter();
            crate::leader::reclaim::Reclaimer::start(
                raft.clone(),
                state.clone(),
                leadership.clone(),
                start.reclaim_horizon,
                start.seams.clock.clone(),
            );
        }
        crate::leader::snapshots::start(raft.clone(), start.node, timings.snapshot_every_ms);
        let events = {
            // On the Raft runtime, where entries are applied: a notice then
            // wakes no other thread (the API runtime's sleeps through a
            // follower's entries; `leader/applied_feed.rs`).
            let _on_raft_runtime = start.raft_runtime.enter();
            start_events(&state, &start.seams.clock, start.events)
        };
        crate::observe::raft_metrics::start(
            raft.clone(),
            id,
            (quiescence.switch.clone(), start.liveness.clone()),
        );
        Ok(Self {
            id,
            raft,
            state,
            leadership,
            rounds,
            leader_contact,
            election_guard,
            events,
            handovers,
            quiescence,
        })
    }

    /// This shard as the node's liveness exchanges need it.
    pub(crate) fn liveness(&self) -> LivenessShard {
        LivenessShard {
            id: self.id,
            raft: self.raft.clone(),
            leadership: self.leadership.clone(),
            switch: self.quiescence.switch.clone(),
            wake: self.quiescence.wake.clone(),
            contact: self.leader_contact.clone(),
        }
    }

    /// Starts the task that writes the cluster defaults into this shard:
    /// the file's `[defaults]` into the meta shard until any are written,
    /// and the meta shard's into every other (`leader/seed_defaults.rs`).
    /// `meta` is the meta shard's defaults ([`crate::leader::seed_defaults::meta_defaults`]).
    pub(crate) fn seed_defaults(
        &self,
        file: KeyConfig,
        meta: impl FnOnce() -> watch::Receiver<Option<KeyConfig>>,
    ) {
        let source = match self.id {
            META_SHARD => crate::leader::seed_defaults::Source::File(file),
            _ => crate::leader::seed_defaults::Source::Meta(meta()),
        };
        crate::leader::seed_defaults::start(
            self.raft.clone(),
            self.state.clone(),
            self.leadership.clone(),
            source,
        );
    }
}

/// The shard's event log, fed from its applied entries.
fn start_events(state: &SharedState, clock: &crate::clock::Clock, hub: &EventHub) -> EventLog {
    // Listen before reading where the state stands: openraft may be applying
    // (replaying) entries in its own task, and an entry's notice is sent after
    // its state, so none applied after the read is missed.
    let applied = state.subscribe();
    let applied_at_start = state.last_applied().map_or(0, |log_id| log_id.index);
    let events = EventLog::new(applied_at_start, hub);
    crate::observe::applied_events::start(state.clone(), events.clone(), applied, clock.clone());
    events
}

/// The random stream of shard 0's election guard's timeout draws
/// ([`crate::seams::Seams::rng`]); shard k's is `k` streams of
/// [`RNG_STREAMS_PER_SHARD`] further on.
const RNG_ELECTION_GUARD: u64 = 1;
/// Streams set aside per shard.
const RNG_STREAMS_PER_SHARD: u64 = 16;
