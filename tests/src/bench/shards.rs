//! Shards: the same loads on fresh clusters of S Raft groups over the same
//! three nodes (`[cluster] shards`), to check docs/scaling.md's model against
//! measurement: with `S ≥ N` and leaders spread, every node leads some shards
//! and follows the rest, so the load (and the CPU) spreads over all nodes.
//!
//! For every S of the profile, on a cluster of its own:
//! 1. idle: once every shard has a leader all nodes agree on, every node has
//!    applied all of every shard and the leaders are spread
//!    ([`Sharded::settle`]), a
//!    window with no load: what S groups' heartbeats cost each node (CPU,
//!    peer calls, fsyncs);
//! 2. the grant path ([`super::grant`]), 256 clients over 100 keys, each
//!    key's calls sent to its shard's leader (`shard_of` over the leader map
//!    of `GET /cluster/shards`), as a client that routes by key would;
//! 3. `SemaphoreQueue` runners ([`super::lease`]) spread one per key over
//!    64 keys, strict leases, limit 32: a runner's client finds its node by
//!    itself, and a node that does not lead the key's shard forwards.
//!
//! Some S are measured idle only (a cluster per S, as above). Each row keeps
//! the window's [`Cost`]: every node's CPU, fsyncs and peer calls, and the
//! log entries of every shard ([`super::cpu`]); the report sets the loaded
//! rows beside S = 1's and the spread of the nodes' CPU beside the issue's
//! ±25 %.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use permitd_core::contract::ShardMap;
use permitd_core::shard::shard_of;

use super::cpu::{Calls, Cost, NodeCost, Window};
use super::grant::{self, GrantResult, GrantRun};
use super::lease::{self, LeaseResult, LeaseRun};
use super::stats::shard_map;
use super::Profile;
use crate::wait::eventually_seen;
use crate::{Cluster, Settings, START_TIMEOUT};

/// Keys of the grant row (the "256 clients over 100 keys").
const GRANT_KEYS: usize = 100;
/// Runners of the lease row, one per key.
const LEASE_RUNNERS: usize = 64;
/// Limit of every key of the lease row (the contended row's).
const LEASE_LIMIT: u64 = 32;
/// How long [`Sharded::settle`] waits for the leaders to spread (each shard's leader
/// hands it to its preferred node a lease after that node caught up) before
/// it measures them as they are.
const SPREAD_TIMEOUT: Duration = Duration::from_secs(10);

/// What a row ran.
#[derive(Debug, Clone)]
pub enum Load {
    Idle,
    Grant(GrantRun, Box<GrantResult>),
    Lease(LeaseRun, Box<LeaseResult>),
}

/// One row: a window on a cluster of `shards` shards.
#[derive(Debug, Clone)]
pub struct ShardRow {
    /// `[cluster] shards` of the cluster.
    pub shards: u32,
    /// Shards the nodes report serving (`GET /cluster/shards`).
    pub served: usize,
    /// Shards each node led when the row started, in node order.
    pub leads: Vec<(u64, usize)>,
    pub load: Load,
    pub cost: Cost,
}

impl ShardRow {
    /// The load's name in the JSON.
    pub fn kind(&self) -> &'static str {
        match self.load {
            Load::Idle => "idle",
            Load::Grant(..) => "grant",
            Load::Lease(..) => "lease",
        }
    }

    /// Granted permits (grant row) or admissions (lease row) per second.
    pub fn permits_per_s(&self) -> f64 {
        match &self.load {
            Load::Idle => 0.0,
            Load::Grant(_, result) => result.permits_per_s,
            Load::Lease(_, result) => result.cycles_per_s,
        }
    }

    /// Clients (grant row) or runners (lease row).
    pub fn clients(&self) -> usize {
        match &self.load {
            Load::Idle => 0,
            Load::Grant(run, _) => run.clients,
            Load::Lease(run, _) => run.runners,
        }
    }

    pub fn keys(&self) -> usize {
        match &self.load {
            Load::Idle => 0,
            Load::Grant(run, _) => run.keys,
            Load::Lease(run, _) => run.keys,
        }
    }

    /// Each node's CPU over the window, in cores (`NaN` when unread).
    pub fn node_cores(&self) -> Vec<(u64, f64)> {
        let cost = &self.cost;
        cost.nodes
            .iter()
            .map(|node| (node.id, cost.cores(node.cpu_s)))
            .collect()
    }

    /// `(max/mean − 1, min/mean − 1)` of the nodes' CPU: how far the busiest
    /// and the idlest node are from the mean (the issue wants both within
    /// ±25 %); `None` when a reading failed.
    pub fn cpu_spread(&self) -> Option<(f64, f64)> {
        let cores: Vec<f64> = self.node_cores().iter().map(|(_, cores)| *cores).collect();
        spread(&cores)
    }

    /// The mean over the nodes of `rate(node)`.
    pub fn node_mean(&self, rate: impl Fn(&NodeCost) -> f64) -> f64 {
        let nodes = &self.cost.nodes;
        nodes.iter().map(rate).sum::<f64>() / nodes.len() as f64
    }

    /// docs/scaling.md's model, fed by this row (a grant row of one shard,
    /// whose one leader is the window's): `(l, f, N·l / (l + (N − 1)·f))`, the
    /// leader's and a follower's CPU µs per permit and the ratio of the
    /// bound with leaders spread over `N` nodes (`S ≥ N`) to this one's.
    pub fn model_ratio(&self) -> Option<(f64, f64, f64)> {
        let cost = &self.cost;
        let leader = cost.us_per_cycle(cost.leader_cpu_s);
        let followers: Vec<f64> = cost
            .followers_cpu_s
            .iter()
            .map(|(_, used)| cost.us_per_cycle(*used))
            .collect();
        let follower = followers.iter().sum::<f64>() / followers.len() as f64;
        let nodes = (followers.len() + 1) as f64;
        let ratio = nodes * leader / (leader + (nodes - 1.0) * follower);
        let grant = matches!(self.load, Load::Grant(..));
        (self.shards == 1 && grant && ratio.is_finite()).then_some((leader, follower, ratio))
    }
}

/// `(max/mean − 1, min/mean − 1)` of `values`; `None` when one is not finite
/// or the mean is not positive.
fn spread(values: &[f64]) -> Option<(f64, f64)> {
    if values.is_empty() || values.iter().any(|value| !value.is_finite()) {
        return None;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    (mean > 0.0).then(|| (max / mean - 1.0, min / mean - 1.0))
}

/// Runs the section: every loaded S, then every idle-only S.
pub async fn run(profile: &Profile) -> Vec<ShardRow> {
    let mut rows = Vec::new();
    for &shards in &profile.shard_counts {
        eprintln!("bench: shards, S = {shards}");
        let mut sharded = Sharded::start(shards).await;
        rows.push(idle(&mut sharded, profile.idle_window).await);
        rows.push(grant_row(&mut sharded, profile).await);
        rows.push(lease_row(&mut sharded, profile).await);
    }
    for &shards in &profile.idle_shard_counts {
        eprintln!("bench: shards, S = {shards}, idle");
        let mut sharded = Sharded::start(shards).await;
        rows.push(idle(&mut sharded, profile.idle_window).await);
    }
    rows
}

/// One of the section's clusters.
struct Sharded {
    cluster: super::BenchCluster,
    /// Its `[cluster] shards`.
    shards: u32,
    /// Whether [`Sharded::settle`] still waits for the leaders to spread:
    /// once they did not in [`SPREAD_TIMEOUT`], the cluster's later rows
    /// measure them as they are without waiting again.
    await_spread: bool,
}

impl Sharded {
    /// A fresh bench cluster of `shards` shards.
    async fn start(shards: u32) -> Self {
        let settings = Settings {
            shards: Some(shards),
            ..super::settings()
        };
        let cluster = super::BenchCluster::start(settings).await;
        cluster.wait_for_leader().await;
        Self {
            cluster,
            shards,
            await_spread: true,
        }
    }

    /// Waits until every running node serves the same shards with the same
    /// leaders, every shard has one, every node has applied what the others
    /// have of every shard (nothing in flight) and the leaders are spread;
    /// returns that leader map. Leaders not spread after [`SPREAD_TIMEOUT`]
    /// are measured as they are (the rows say who led what); a cluster that
    /// never agrees fails the bench after [`START_TIMEOUT`].
    async fn settle(&mut self) -> ShardMap {
        let cluster = &self.cluster;
        let ids: Vec<u64> = cluster.nodes.iter().map(|node| node.id).collect();
        if self.await_spread {
            let spread = |maps: &[Option<ShardMap>]| agreed(maps) && balanced(&ids, maps);
            let (held, maps) = agreement(cluster, SPREAD_TIMEOUT, spread).await;
            if let (true, Some(map)) = (held, maps.into_iter().flatten().next()) {
                return map;
            }
            self.await_spread = false;
        }
        let (settled, maps) = agreement(cluster, START_TIMEOUT, agreed).await;
        assert!(settled, "the shards never settled: {maps:?}");
        let map = maps.into_iter().flatten().next().expect("a node answered");
        if !self.await_spread && !balanced(&ids, &[Some(map.clone())]) {
            let leads = leads(cluster, &map);
            eprintln!("bench: S = {}, leaders not spread: {leads:?}", self.shards);
        }
        map
    }

    /// A row of this cluster, its leaders as in `map`.
    fn row(&self, map: &ShardMap, load: Load, cost: Cost) -> ShardRow {
        ShardRow {
            shards: self.shards,
            served: map.shards.len(),
            leads: leads(&self.cluster, map),
            load,
            cost,
        }
    }
}

/// Polls every running node's leader map until `holds` says yes or
/// `timeout` passes: whether it did, and the maps last read.
async fn agreement(
    cluster: &Cluster,
    timeout: Duration,
    holds: impl Fn(&[Option<ShardMap>]) -> bool,
) -> (bool, Vec<Option<ShardMap>>) {
    eventually_seen(timeout, || async {
        let mut maps = Vec::new();
        for node in cluster.nodes.iter().filter(|node| node.is_running()) {
            maps.push(shard_map(cluster, node.id).await);
        }
        (holds(&maps), maps)
    })
    .await
}

/// Every map read, with the same shards, each with a leader and the same
/// leader and applied index in every map.
fn agreed(maps: &[Option<ShardMap>]) -> bool {
    let Some(Some(first)) = maps.first() else {
        return false;
    };
    let same = |map: &Option<ShardMap>| {
        map.as_ref().is_some_and(|map| {
            map.shards.len() == first.shards.len()
                && map.shards.iter().zip(&first.shards).all(|(shard, seen)| {
                    shard.leader.is_some()
                        && shard.leader == seen.leader
                        && shard.applied_index == seen.applied_index
                })
        })
    };
    !first.shards.is_empty() && maps.iter().all(same)
}

/// The first map's leaders spread over the nodes `ids`: the shards each
/// leads differ by one at most.
fn balanced(ids: &[u64], maps: &[Option<ShardMap>]) -> bool {
    let Some(Some(map)) = maps.first() else {
        return false;
    };
    let counts: Vec<usize> = ids.iter().map(|id| led_by(map, *id)).collect();
    let (most, least) = (counts.iter().max(), counts.iter().min());
    most.zip(least)
        .is_some_and(|(most, least)| most - least <= 1)
}

/// Shards node `id` leads in `map`.
fn led_by(map: &ShardMap, id: u64) -> usize {
    let leaders = map.shards.iter().map(|shard| shard.leader);
    leaders.filter(|leader| *leader == Some(id)).count()
}

/// Shards each node of `cluster` leads in `map`, in node order.
fn leads(cluster: &Cluster, map: &ShardMap) -> Vec<(u64, usize)> {
    let nodes = cluster.nodes.iter();
    nodes.map(|node| (node.id, led_by(map, node.id))).collect()
}

/// The node leading `key`'s shard in `map`; the answering node (which
/// forwards) when the shard has no leader.
fn leader_of(map: &ShardMap, key: &str) -> u64 {
    let count = u32::try_from(map.shards.len()).unwrap_or(u32::MAX);
    shard_of(key, count)
        .ok()
        .and_then(|shard| map.shards.get(shard as usize)?.leader)
        .unwrap_or(map.id)
}

/// A settled cluster with no load for `window`.
async fn idle(sharded: &mut Sharded, window: Duration) -> ShardRow {
    let map = sharded.settle().await;
    let cluster = &sharded.cluster;
    let leader = cluster.wait_for_leader().await;
    let no_calls = Calls::Client(Arc::new(AtomicU64::new(0)));
    let opened = Window::open(cluster, leader, no_calls).await;
    tokio::time::sleep(window).await;
    let cost = opened.close(cluster).await;
    sharded.row(&map, Load::Idle, cost)
}

/// The grant row, each key's calls to its shard's leader.
async fn grant_row(sharded: &mut Sharded, profile: &Profile) -> ShardRow {
    let map = sharded.settle().await;
    let leader = sharded.cluster.wait_for_leader().await;
    let run = super::grant_run(profile, profile.shard_grant_clients, GRANT_KEYS, 1, false);
    let tag = format!("s{}-grant", sharded.shards);
    let route = |key: &str| leader_of(&map, key);
    let result = grant::run_routed(&sharded.cluster, leader, &run, &tag, route).await;
    let cost = result.cost.clone();
    sharded.row(&map, Load::Grant(run, Box::new(result)), cost)
}

/// The lease row: one runner per key.
async fn lease_row(sharded: &mut Sharded, profile: &Profile) -> ShardRow {
    let map = sharded.settle().await;
    let leader = sharded.cluster.wait_for_leader().await;
    let run = LeaseRun {
        runners: LEASE_RUNNERS,
        keys: LEASE_RUNNERS,
        limit: LEASE_LIMIT,
        leases: true,
        backlog: lease::BACKLOG,
        permits_per_lease: super::PERMITS_PER_LEASE,
        round_wait_ms: 1,
        warmup: profile.warmup * 2,
        measure: profile.lease_measure,
    };
    let key = format!("s{}-lease", sharded.shards);
    let result = lease::run(&sharded.cluster, leader, &run, &key).await;
    let cost = result.cost.clone();
    sharded.row(&map, Load::Lease(run, Box::new(result)), cost)
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::ShardStatus;

    use super::*;

    fn map(id: u64, leaders: &[Option<u64>], applied: u64) -> ShardMap {
        let shards = leaders
            .iter()
            .enumerate()
            .map(|(shard, leader)| ShardStatus {
                shard: shard as u32,
                leader: *leader,
                term: 1,
                members: vec![1, 2, 3],
                applied_index: Some(applied),
            });
        ShardMap {
            id,
            shards: shards.collect(),
        }
    }

    #[test]
    fn spread_is_the_extremes_over_the_mean() {
        let (above, below) = spread(&[1.2, 1.0, 0.8]).expect("finite");
        assert!((above - 0.2).abs() < 1e-9 && (below + 0.2).abs() < 1e-9);
        assert_eq!(spread(&[1.0, f64::NAN]), None);
        assert_eq!(spread(&[0.0, 0.0]), None);
    }

    #[test]
    fn a_map_is_settled_when_every_node_agrees() {
        let leaders = [Some(1), Some(2), Some(3)];
        let settled = [1, 2, 3].map(|id| Some(map(id, &leaders, 7)));
        assert!(agreed(&settled));
        let behind = [Some(map(1, &leaders, 7)), Some(map(2, &leaders, 6))];
        assert!(!agreed(&behind));
        let leaderless = [Some(map(1, &[Some(1), None], 7))];
        assert!(!agreed(&leaderless));
        assert!(!agreed(&[Some(map(1, &leaders, 7)), None]));
    }

    #[test]
    fn leaders_are_spread_when_their_counts_differ_by_one_at_most() {
        let ids = [1, 2, 3];
        assert!(balanced(&ids, &[Some(map(1, &[Some(1)], 0))]));
        let spread = [Some(1), Some(2), Some(3), Some(1)];
        assert!(balanced(&ids, &[Some(map(1, &spread, 0))]));
        let bunched = [Some(1), Some(1), Some(3)];
        assert!(!balanced(&ids, &[Some(map(1, &bunched, 0))]));
        assert!(!balanced(&ids, &[None]));
    }

    #[test]
    fn keys_go_to_their_shards_leader() {
        let one = map(2, &[Some(3)], 0);
        assert_eq!(leader_of(&one, "any-key"), 3);
        let three = map(2, &[Some(1), Some(2), None], 0);
        let key = (0..100)
            .map(|index| format!("k-{index}"))
            .find(|key| shard_of(key, 3) == Ok(2))
            .expect("a key of shard 2");
        assert_eq!(leader_of(&three, &key), 2, "leaderless: the answering node");
    }
}
