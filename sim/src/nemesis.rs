//! The faults of a run, drawn from its seed: partitions (both ways and one
//! way), held links (messages delayed, then delivered in a burst), slow links,
//! frozen nodes (every link held: a paused process), a lossy network (answers
//! lost, requests delivered twice),
//! crashes and restarts, power cuts (torn or not), clock jumps, a full disk,
//! failing syncs and slow syncs. Between `start` and `stop` a fault begins every few
//! hundred simulated milliseconds and each ends after a drawn time; at `stop`
//! everything heals, so the run can show that the cluster recovers.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use permitd_storage::NodeId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use turmoil::Sim;

use crate::disk_model::DiskFaults;
use crate::elections::Disturbances;
use crate::node_host::{host_name, NodeWorld};
use crate::trace::Trace;

/// How often a node that stopped on its own is started again, as a
/// supervisor (systemd's `RestartSec`) would.
const RESTART_EVERY: Duration = Duration::from_millis(500);

/// One fault under way, and what undoes it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fault {
    Partition(NodeId, NodeId),
    OneWay(NodeId, NodeId),
    Hold(NodeId, NodeId),
    SlowLink(NodeId, NodeId),
    /// Every link to and from the node held: to the others it is a paused
    /// process, whose messages come in a burst when it resumes.
    Frozen(NodeId),
    /// Some calls lose their answer, some are delivered twice (`net.rs`).
    Lossy,
    Down(NodeId),
    DiskFull(NodeId),
    FailingSync(NodeId),
    SlowSync(NodeId),
}

/// Which faults a run may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultMix {
    pub network: bool,
    pub crashes: bool,
    pub power_cuts: bool,
    pub clocks: bool,
    pub disk: bool,
}

impl FaultMix {
    pub const ALL: FaultMix = FaultMix {
        network: true,
        crashes: true,
        power_cuts: true,
        clocks: true,
        disk: true,
    };
    pub const NONE: FaultMix = FaultMix {
        network: false,
        crashes: false,
        power_cuts: false,
        clocks: false,
        disk: false,
    };
}

/// The fault injector of one run.
#[derive(Debug)]
pub struct Nemesis {
    rng: StdRng,
    nodes: Vec<NodeId>,
    worlds: BTreeMap<NodeId, NodeWorld>,
    mix: FaultMix,
    start: Duration,
    stop: Duration,
    next_at: Duration,
    /// Faults under way and when each ends.
    active: Vec<(Duration, Fault)>,
    healed: bool,
    /// When each node was last restarted by [`Nemesis::restart_stopped`].
    restarted_at: BTreeMap<NodeId, Duration>,
    /// Every host's name, the nodes' and the clients'.
    others: Vec<String>,
    /// The links each frozen node's fault holds.
    frozen: BTreeMap<NodeId, Vec<String>>,
    trace: Trace,
    disturbances: Disturbances,
    pub injected: u64,
}

impl Nemesis {
    pub fn new(
        seed: u64,
        worlds: BTreeMap<NodeId, NodeWorld>,
        mix: FaultMix,
        (start, stop): (Duration, Duration),
        others: Vec<String>,
        trace: Trace,
        disturbances: Disturbances,
    ) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed ^ 0x006e_656d_6573_6973),
            nodes: worlds.keys().copied().collect(),
            worlds,
            mix,
            start,
            stop,
            next_at: start,
            active: Vec::new(),
            healed: false,
            restarted_at: BTreeMap::new(),
            others,
            frozen: BTreeMap::new(),
            trace,
            disturbances,
            injected: 0,
        }
    }

    /// Called after every step of the simulation.
    pub fn tick(&mut self, sim: &mut Sim<'_>) {
        let now = sim.elapsed();
        self.end_due(sim, now);
        if now >= self.stop {
            if !self.healed {
                self.heal_all(sim, now);
            }
            return;
        }
        if now >= self.next_at && now >= self.start {
            self.next_at = now + Duration::from_millis(self.rng.random_range(100..700));
            self.begin_one(sim, now);
        }
    }

    fn pair(&mut self) -> (NodeId, NodeId) {
        let a = self.nodes[self.rng.random_range(0..self.nodes.len())];
        let mut b = a;
        while b == a {
            b = self.nodes[self.rng.random_range(0..self.nodes.len())];
        }
        (a, b)
    }

    /// A pair of nodes whose link no fault cuts or holds yet, or `None`.
    /// turmoil keeps one state per link: ending one of two faults on a link
    /// (a hold's release, say) would heal the other, which the nemesis still
    /// counts as active, and a crash would then let the node's closing
    /// segments leave in task-id order (`silently`).
    fn free_pair(&mut self) -> Option<(NodeId, NodeId)> {
        let (a, b) = self.pair();
        let busy = self.cuts(a, &host_name(b)) || self.cuts(b, &host_name(a));
        (!busy).then_some((a, b))
    }

    fn node(&mut self) -> NodeId {
        self.nodes[self.rng.random_range(0..self.nodes.len())]
    }

    fn is_down(&self, id: NodeId) -> bool {
        self.active
            .iter()
            .any(|(_, fault)| *fault == Fault::Down(id))
    }

    fn begin_one(&mut self, sim: &mut Sim<'_>, now: Duration) {
        let lasts = Duration::from_millis(self.rng.random_range(100..2_000));
        let fault = match self.rng.random_range(0..11) {
            0 | 1 if self.mix.network => {
                let Some((a, b)) = self.free_pair() else {
                    return;
                };
                sim.partition(host_name(a), host_name(b));
                Fault::Partition(a, b)
            }
            2 if self.mix.network => {
                let Some((a, b)) = self.free_pair() else {
                    return;
                };
                sim.partition_oneway(host_name(a), host_name(b));
                Fault::OneWay(a, b)
            }
            3 if self.mix.network => {
                let Some((a, b)) = self.free_pair() else {
                    return;
                };
                sim.hold(host_name(a), host_name(b));
                Fault::Hold(a, b)
            }
            4 if self.mix.network => {
                let (a, b) = self.pair();
                let slow = Duration::from_millis(self.rng.random_range(20..300));
                sim.set_link_latency(host_name(a), host_name(b), slow);
                Fault::SlowLink(a, b)
            }
            9 if self.mix.network => {
                let id = self.node();
                if self.is_down(id) || self.is_frozen(id) {
                    return;
                }
                let links = self.free_links(id);
                for other in &links {
                    sim.hold(host_name(id), other.clone());
                }
                self.frozen.insert(id, links);
                Fault::Frozen(id)
            }
            10 if self.mix.network => {
                if self.active.iter().any(|(_, fault)| *fault == Fault::Lossy) {
                    return;
                }
                crate::net::set_lossy(true);
                Fault::Lossy
            }
            5 | 6 if self.mix.crashes || self.mix.power_cuts => {
                let id = self.node();
                if self.is_down(id) {
                    return;
                }
                self.silently(sim, id, |sim| sim.crash(host_name(id)));
                let cut = self.mix.power_cuts && (!self.mix.crashes || self.rng.random_bool(0.5));
                if cut {
                    let torn = self.rng.random_bool(0.5).then(|| self.rng.random::<u64>());
                    let report = self.worlds[&id].disk.power_cut(torn);
                    self.note(now, format_args!("power cut node{id}: {report:?}"));
                } else {
                    self.note(now, format_args!("crash node{id}"));
                }
                Fault::Down(id)
            }
            7 if self.mix.clocks => {
                let id = self.node();
                let skew = self.rng.random_range(-2_000i64..2_000);
                self.worlds[&id].skew_ms.store(skew, Ordering::Relaxed);
                self.note(now, format_args!("clock of node{id} at {skew:+} ms"));
                self.injected += 1;
                return;
            }
            8 if self.mix.disk => {
                let id = self.node();
                match self.rng.random_range(0..3) {
                    0 => {
                        self.set_faults(id, |faults| faults.full = true);
                        Fault::DiskFull(id)
                    }
                    1 => {
                        self.set_faults(id, |faults| faults.failing_sync = true);
                        Fault::FailingSync(id)
                    }
                    _ => {
                        let slow = Duration::from_millis(self.rng.random_range(10..150));
                        self.set_faults(id, |faults| faults.slow_sync = slow);
                        Fault::SlowSync(id)
                    }
                }
            }
            _ => return,
        };
        if !matches!(fault, Fault::Down(_)) {
            self.note(now, format_args!("begin {fault:?}"));
        }
        self.injected += 1;
        self.active.push((now + lasts, fault));
    }

    /// Traces what the nemesis did, and marks the moment as one that may
    /// explain an election.
    fn note(&self, now: Duration, what: impl std::fmt::Display) {
        self.trace.event(now, "nemesis", what);
        self.disturbances.at(now);
    }

    fn set_faults(&self, id: NodeId, change: impl FnOnce(&mut DiskFaults)) {
        let disk = &self.worlds[&id].disk;
        let mut faults = disk.faults();
        change(&mut faults);
        disk.set_faults(faults);
    }

    fn end_due(&mut self, sim: &mut Sim<'_>, now: Duration) {
        let (due, rest): (Vec<_>, Vec<_>) = self.active.drain(..).partition(|(at, _)| *at <= now);
        self.active = rest;
        for (_, fault) in due {
            self.end(sim, now, fault);
        }
    }

    fn end(&mut self, sim: &mut Sim<'_>, now: Duration, fault: Fault) {
        match &fault {
            Fault::Partition(a, b) => sim.repair(host_name(*a), host_name(*b)),
            Fault::OneWay(a, b) => sim.repair_oneway(host_name(*a), host_name(*b)),
            Fault::Hold(a, b) => sim.release(host_name(*a), host_name(*b)),
            Fault::SlowLink(a, b) => {
                sim.set_link_latency(host_name(*a), host_name(*b), Duration::from_millis(1));
            }
            Fault::Down(id) => {
                let id = *id;
                self.silently(sim, id, |sim| sim.bounce(host_name(id)));
            }
            Fault::Frozen(id) => {
                for other in self.frozen.remove(id).unwrap_or_default() {
                    sim.release(host_name(*id), other);
                }
            }
            Fault::Lossy => crate::net::set_lossy(false),
            Fault::DiskFull(id) => self.set_faults(*id, |faults| faults.full = false),
            Fault::SlowSync(id) => self.set_faults(*id, |faults| faults.slow_sync = Duration::ZERO),
            Fault::FailingSync(id) => {
                self.set_faults(*id, |faults| faults.failing_sync = false);
                // A node that hit EIO stopped (as it must): start it again.
                if !sim.is_host_running(host_name(*id)) {
                    let id = *id;
                    self.silently(sim, id, |sim| sim.bounce(host_name(id)));
                }
            }
        }
        self.note(now, format_args!("end {fault:?}"));
    }

    /// Ends every fault, restarts every stopped node, sets clocks right.
    fn heal_all(&mut self, sim: &mut Sim<'_>, now: Duration) {
        for (_, fault) in std::mem::take(&mut self.active) {
            self.end(sim, now, fault);
        }
        for id in self.nodes.clone() {
            self.worlds[&id].skew_ms.store(0, Ordering::Relaxed);
            if !sim.is_host_running(host_name(id)) {
                self.silently(sim, id, |sim| sim.bounce(host_name(id)));
            }
        }
        self.healed = true;
        self.note(now, "healed");
    }

    /// Runs `action` (a crash, a restart) with every link out of node `id`
    /// cut, so that the FIN and RST segments its dropped connections send are
    /// lost, as a dead machine's would be. (They would leave in the order
    /// tokio drops the old runtime's tasks, which follows task ids counted
    /// process-wide: a seed would not replay.) Links that a fault already cuts
    /// stay cut.
    fn silently(&self, sim: &mut Sim<'_>, id: NodeId, action: impl FnOnce(&mut Sim<'_>)) {
        let from = host_name(id);
        let others = self.free_links(id);
        for other in &others {
            sim.partition_oneway(from.clone(), other.clone());
        }
        action(sim);
        for other in &others {
            sim.repair_oneway(from.clone(), other.clone());
        }
    }

    /// Every other host whose link from node `id` no fault cuts or holds.
    fn free_links(&self, id: NodeId) -> Vec<String> {
        let from = host_name(id);
        self.others
            .iter()
            .filter(|other| **other != from && !self.cuts(id, other))
            .cloned()
            .collect()
    }

    fn is_frozen(&self, id: NodeId) -> bool {
        self.frozen.contains_key(&id)
    }

    /// Whether an active fault cuts or holds the link from node `id` to `other`.
    fn cuts(&self, id: NodeId, other: &str) -> bool {
        self.active.iter().any(|(_, fault)| match fault {
            Fault::Partition(a, b) | Fault::Hold(a, b) => {
                (*a == id && host_name(*b) == other) || (*b == id && host_name(*a) == other)
            }
            Fault::OneWay(a, b) => *a == id && host_name(*b) == other,
            Fault::Frozen(n) => self.frozen.get(n).is_some_and(|links| {
                (*n == id && links.iter().any(|link| link == other))
                    || (host_name(*n) == other && links.contains(&host_name(id)))
            }),
            _ => false,
        })
    }

    /// Restarts nodes that stopped on their own (a failed sync) while no fault
    /// holds them down.
    pub fn restart_stopped(&mut self, sim: &mut Sim<'_>) {
        let now = sim.elapsed();
        for id in self.nodes.clone() {
            let held_down = self.active.iter().any(
                |(_, fault)| matches!(fault, Fault::Down(n) | Fault::FailingSync(n) if *n == id),
            );
            let recently = self
                .restarted_at
                .get(&id)
                .is_some_and(|at| now < *at + RESTART_EVERY);
            if !held_down && !recently && !sim.is_host_running(host_name(id)) {
                self.note(now, format_args!("restart node{id}"));
                self.restarted_at.insert(id, now);
                self.silently(sim, id, |sim| sim.bounce(host_name(id)));
            }
        }
    }
}
