//! The nemesis: a fault schedule drawn from the run's random state, and its
//! execution against a [`Cluster`] behind the [`Network`] proxies.
//!
//! The schedule (kinds, order and every duration) is a pure function of the
//! random state and the profile; which node is "the leader" is found at run time. After
//! every fault the nemesis heals everything, then waits for the cluster to
//! recover (every node up, all agreeing on one leader that serves a
//! linearizable read) before a short quiet gap and the next fault.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use permitd_client::SemaphoreClient;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};

use super::proxy::Network;
use super::random::{RandomState, ReplayRng};
use crate::{Cluster, ELECTION_TIMEOUT_MAX_MS};

/// How long the cluster may take to recover from one fault.
pub const RECOVERY_TIMEOUT: Duration = Duration::from_secs(45);

/// What the nemesis does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL the leader, restart it after `down_ms`.
    KillLeader,
    /// SIGKILL a follower, restart it after `down_ms`.
    KillFollower,
    /// SIGSTOP the leader for `down_ms` (> the election timeout), then SIGCONT.
    PauseLeader,
    /// SIGKILL every node, restart them all after `down_ms`.
    RestartCluster,
    /// Cut one node (the leader, or a follower) off from the others for `down_ms`.
    Partition,
    /// Cut the power of the leader, a follower or every node: SIGKILL, and
    /// their disks drop every write not made durable (`powerfs`); restart
    /// after `down_ms`.
    PowerLoss,
}

impl FaultKind {
    pub const ALL: [FaultKind; 6] = [
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::PauseLeader,
        FaultKind::RestartCluster,
        FaultKind::Partition,
        FaultKind::PowerLoss,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill_leader",
            FaultKind::KillFollower => "kill_follower",
            FaultKind::PauseLeader => "pause_leader",
            FaultKind::RestartCluster => "restart_cluster",
            FaultKind::Partition => "partition",
            FaultKind::PowerLoss => "power_loss",
        }
    }
}

/// One planned fault.
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    pub kind: FaultKind,
    /// How long the node is down, paused or cut off.
    pub down_ms: u64,
    /// Quiet time after recovery, before the next fault.
    pub gap_ms: u64,
    /// Partition: cut off the leader (else a follower).
    pub target_leader: bool,
    /// KillFollower / Partition of a follower: which of the two (0 or 1).
    pub follower_pick: usize,
    /// PowerLoss: every node at once (else as `target_leader` says).
    pub everyone: bool,
    /// PowerLoss: the seed of a torn write, if one is kept.
    pub torn: Option<u64>,
}

/// The faults a profile must inject at least, before random ones.
pub fn required(kind: FaultKind) -> usize {
    match kind {
        FaultKind::KillLeader => 10,
        FaultKind::PauseLeader => 5,
        FaultKind::RestartCluster => 1,
        FaultKind::Partition => 2,
        FaultKind::KillFollower => 2,
        FaultKind::PowerLoss => 3,
    }
}

/// The deterministic schedule of a random state: the required faults in a
/// drawn order, then an endless stream of drawn ones.
#[derive(Debug)]
pub struct Schedule {
    rng: ReplayRng,
    required: Vec<FaultKind>,
}

impl Schedule {
    pub fn new(random_state: RandomState) -> Self {
        let mut rng = ReplayRng::new(random_state);
        let mut required: Vec<FaultKind> = FaultKind::ALL
            .iter()
            .flat_map(|kind| std::iter::repeat_n(*kind, self::required(*kind)))
            .collect();
        required.shuffle(&mut rng);
        required.reverse(); // popped from the end
        Self { rng, required }
    }

    /// Required faults not yet handed out.
    pub fn required_left(&self) -> usize {
        self.required.len()
    }

    pub fn next_fault(&mut self) -> Fault {
        let kind = self.required.pop().unwrap_or_else(|| {
            // Weights: leader kills and pauses most, a whole-cluster restart rarely.
            match self.rng.random_range(0..20u32) {
                0..=6 => FaultKind::KillLeader,
                7..=9 => FaultKind::KillFollower,
                10..=14 => FaultKind::PauseLeader,
                15 => FaultKind::RestartCluster,
                16 => FaultKind::PowerLoss,
                _ => FaultKind::Partition,
            }
        });
        let down_ms = match kind {
            // Mostly long enough for the others to elect a new leader; sometimes
            // a quick restart that races the election.
            FaultKind::KillLeader | FaultKind::KillFollower => {
                if self.rng.random_bool(0.25) {
                    self.rng.random_range(100..=500)
                } else {
                    ELECTION_TIMEOUT_MAX_MS + self.rng.random_range(200..=1_500)
                }
            }
            // Well past the election timeout: followers refuse votes while the
            // leader's lease lasts, so a pause just over it may change nothing.
            FaultKind::PauseLeader => {
                2 * ELECTION_TIMEOUT_MAX_MS + self.rng.random_range(300..=1_500)
            }
            FaultKind::RestartCluster | FaultKind::PowerLoss => self.rng.random_range(200..=1_500),
            FaultKind::Partition => self.rng.random_range(1_500..=4_000),
        };
        Fault {
            kind,
            down_ms,
            gap_ms: self.rng.random_range(200..=1_200),
            target_leader: self.rng.random_bool(0.7),
            follower_pick: self.rng.random_range(0..2),
            everyone: self.rng.random_bool(0.3),
            torn: self
                .rng
                .random_bool(0.5)
                .then(|| self.rng.random_range(1..u64::MAX)),
        }
    }
}

/// One fault as it happened.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub index: usize,
    pub kind: FaultKind,
    /// The node it hit (none for a whole-cluster restart).
    pub node: Option<u64>,
    pub down_ms: u64,
    /// Since the start of the run.
    pub at_ms: u64,
    /// From healing to a recovered cluster; `None` if it never recovered.
    pub recovered_after_ms: Option<u64>,
    /// The leader after recovery.
    pub new_leader: Option<u64>,
}

impl FaultRecord {
    pub fn to_json(&self) -> Value {
        json!({
            "index": self.index,
            "kind": self.kind.name(),
            "node": self.node,
            "downMs": self.down_ms,
            "atMs": self.at_ms,
            "recoveredAfterMs": self.recovered_after_ms,
            "newLeader": self.new_leader,
        })
    }
}

/// Runs faults against the cluster until the profile is satisfied.
#[derive(Debug)]
pub struct Nemesis {
    pub cluster: Cluster,
    pub network: Network,
    /// For the linearizable read that proves recovery.
    pub client: SemaphoreClient,
    pub probe_key: String,
    pub origin: Instant,
    pub records: Vec<FaultRecord>,
}

impl Nemesis {
    /// Faults until `duration` has passed and every required fault ran, or
    /// until `hard_stop`. Stops early when the cluster fails to recover.
    pub async fn run(&mut self, schedule: &mut Schedule, duration: Duration, hard_stop: Instant) {
        let start = Instant::now();
        loop {
            let done = start.elapsed() >= duration && schedule.required_left() == 0;
            if done || Instant::now() >= hard_stop {
                return;
            }
            let fault = schedule.next_fault();
            let record = self.inject(fault).await;
            let recovered = record.recovered_after_ms.is_some();
            eprintln!(
                "chaos: fault #{} {} node={:?} down={}ms recovered_after={:?}ms leader={:?}",
                record.index,
                fault.kind.name(),
                record.node,
                fault.down_ms,
                record.recovered_after_ms,
                record.new_leader
            );
            self.records.push(record);
            if !recovered {
                return;
            }
            tokio::time::sleep(Duration::from_millis(fault.gap_ms)).await;
        }
    }

    /// Faults injected per kind.
    pub fn counts(&self) -> BTreeMap<FaultKind, usize> {
        let mut counts: BTreeMap<FaultKind, usize> =
            FaultKind::ALL.iter().map(|kind| (*kind, 0)).collect();
        for record in &self.records {
            *counts.entry(record.kind).or_default() += 1;
        }
        counts
    }

    async fn inject(&mut self, fault: Fault) -> FaultRecord {
        let at_ms = self.origin.elapsed().as_millis() as u64;
        let down = Duration::from_millis(fault.down_ms);
        // Every fault starts from a recovered cluster, so there is a leader.
        let leader = self.leader().await;
        let ids: Vec<u64> = self.cluster.nodes.iter().map(|node| node.id).collect();
        let followers: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| Some(*id) != leader)
            .collect();
        let follower = followers
            .get(fault.follower_pick % followers.len().max(1))
            .copied();
        let node = match fault.kind {
            FaultKind::KillLeader => {
                let node = leader.or(follower);
                if let Some(id) = node {
                    self.cluster.kill(id);
                    tokio::time::sleep(down).await;
                    self.cluster.restart(id);
                }
                node
            }
            FaultKind::KillFollower => {
                if let Some(id) = follower {
                    self.cluster.kill(id);
                    tokio::time::sleep(down).await;
                    self.cluster.restart(id);
                }
                follower
            }
            FaultKind::PauseLeader => {
                let node = leader.or(follower);
                if let Some(id) = node {
                    self.signal(id, Signal::SIGSTOP);
                    tokio::time::sleep(down).await;
                    self.signal(id, Signal::SIGCONT);
                }
                node
            }
            FaultKind::RestartCluster => {
                for id in &ids {
                    self.cluster.kill(*id);
                }
                tokio::time::sleep(down).await;
                for id in &ids {
                    self.cluster.restart(*id);
                }
                None
            }
            FaultKind::PowerLoss => {
                let victims = match (fault.everyone, fault.target_leader) {
                    (true, _) => ids.clone(),
                    (false, true) => leader.or(follower).into_iter().collect(),
                    (false, false) => follower.into_iter().collect(),
                };
                let reports = self.cluster.power_loss(&victims, fault.torn);
                eprintln!("chaos: power loss on {victims:?}: {reports:?}");
                tokio::time::sleep(down).await;
                for id in &victims {
                    self.cluster.restart(*id);
                }
                (!fault.everyone)
                    .then(|| victims.first().copied())
                    .flatten()
            }
            FaultKind::Partition => {
                let node = if fault.target_leader {
                    leader.or(follower)
                } else {
                    follower
                };
                if let Some(id) = node {
                    self.network.isolate(id);
                    tokio::time::sleep(down).await;
                    self.network.heal();
                }
                node
            }
        };
        let healed = Instant::now();
        let new_leader = self.wait_recovered().await;
        FaultRecord {
            index: self.records.len() + 1,
            kind: fault.kind,
            node,
            down_ms: fault.down_ms,
            at_ms,
            recovered_after_ms: new_leader.map(|_| healed.elapsed().as_millis() as u64),
            new_leader,
        }
    }

    fn signal(&self, id: u64, signal: Signal) {
        if let Some(pid) = self.cluster.node(id).pid() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    /// The node that says it leads, with the highest term; `None` if none does.
    pub async fn leader(&self) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        for node in self.cluster.nodes.iter().filter(|node| node.is_running()) {
            if let Some(status) = self.cluster.status(node.id).await {
                let term = status["term"].as_u64().unwrap_or(0);
                if status["leader"].as_u64() == Some(node.id)
                    && best.is_none_or(|(_, best_term)| term > best_term)
                {
                    best = Some((node.id, term));
                }
            }
        }
        best.map(|(id, _)| id)
    }

    /// Heals everything the nemesis may have left (a stopped process, a cut
    /// link, a dead node) and waits for recovery. Returns the leader.
    pub async fn heal_all(&mut self) -> Option<u64> {
        self.network.heal();
        let ids: Vec<u64> = self.cluster.nodes.iter().map(|node| node.id).collect();
        for id in ids {
            if self.cluster.node(id).is_running() {
                self.signal(id, Signal::SIGCONT);
            } else {
                self.cluster.restart(id);
            }
        }
        self.wait_recovered().await
    }

    /// Waits until every node is up and names the same leader, and a
    /// linearizable read succeeds. Returns the leader, or `None` on timeout.
    pub async fn wait_recovered(&self) -> Option<u64> {
        let deadline = Instant::now() + RECOVERY_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(leader) = self.agreed_leader().await {
                let read = tokio::time::timeout(
                    Duration::from_secs(5),
                    self.client.usage(&self.probe_key),
                )
                .await;
                if matches!(read, Ok(Ok(_))) {
                    return Some(leader);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    async fn agreed_leader(&self) -> Option<u64> {
        let mut seen = Vec::new();
        for node in &self.cluster.nodes {
            if !node.is_running() {
                return None;
            }
            seen.push(self.cluster.status(node.id).await?["leader"].as_u64()?);
        }
        let first = *seen.first()?;
        seen.iter().all(|leader| *leader == first).then_some(first)
    }
}
