//! Failover at S = 3: a node that leads a shard is killed (SIGKILL) while
//! every shard is under steady load; only its shard moves. Issue targets:
//! the killed node's shards serve again with p50 ≤ 400 ms and max ≤ 800 ms,
//! and the other shards answer every call, their latency within noise.
//!
//! A fresh cluster of three nodes and three shards, leaders spread (one shard
//! per node, `leader/handover.rs`). [`CLIENTS_PER_SHARD`] clients per shard,
//! each on a key of its own chosen by its shard (`shard_of`), each asking for
//! one permit every [`CALL_PERIOD`] and reporting the previous one released
//! (as the grant path does), to the node the last answer named as the
//! shard's leader ([`headers::LEADER`]), or the next node after a call that
//! reached none, as a client routing by key would. Every call is recorded.
//!
//! Each round: the cluster settled (leaders spread, every node caught up), a
//! steady window, then the leader of shard `round mod 3` is killed; once a call
//! to each of its shards sent after the kill is granted, the node restarts and
//! takes its shard back before the next round. From the records, per round:
//! - kill → serve: from the kill to the end of the first granted call of each
//!   killed shard sent after the kill (a call sent before could carry an
//!   answer the dead node wrote just before dying);
//! - the other shards: their calls that overlap the failover (from the kill to
//!   the killed shards serving again): how many failed (no grant answer: an
//!   error status, a connection error or [`CALL_TIMEOUT`]), and their latency
//!   against the steady window before the kill;
//! - whether the other shards kept their leader and term.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use permitd_client::client::now_ms;
use permitd_core::contract::headers;
use permitd_core::contract::protocol::{GrantReport, SemaphoreResponse};
use permitd_core::contract::ShardMap;
use permitd_core::shard::shard_of;

use super::grant::bench_http;
use super::stats::{ms, quantile, shard_map};
use super::Profile;
use crate::wait::eventually_seen;
use crate::{Cluster, Settings};

/// `[cluster] shards` of the section's cluster (the S = 3).
pub const SHARDS: u32 = 3;
/// Clients on each shard, each on a key of its own.
pub const CLIENTS_PER_SHARD: usize = 4;
/// One call per client per period: a steady load that leaves the two cores
/// room, so the failover measures Raft and not a saturated machine.
pub const CALL_PERIOD: Duration = Duration::from_millis(10);
/// A call without an answer for this long failed: steady calls take
/// milliseconds and a request held for a permit waits one second at most, so
/// only a call that was never going to be answered reaches it, even on a
/// loaded machine (the grant path's limit too).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before a client calls again after a failed call.
const RETRY_PAUSE: Duration = Duration::from_millis(5);
/// Longest a killed shard may take to serve again before the rounds stop.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);
/// Longest a restarted node may take to catch up on every shard.
const CATCH_UP: Duration = Duration::from_secs(30);

/// What one round measured.
#[derive(Debug, Clone)]
pub struct Round {
    /// The killed node.
    pub victim: u64,
    /// The shards it led.
    pub killed_shards: Vec<u32>,
    /// Kill → the last of its shards' first grant.
    pub serve_ms: f64,
    /// The other shards' calls overlapping the failover, and how many failed.
    pub other_calls: usize,
    pub other_failed: usize,
    /// Their latency (ms) in the steady window before the kill, and during.
    pub before_ms: (f64, f64),
    pub during_ms: (f64, f64),
    /// The other shards' leader and term after the failover are the ones
    /// before it.
    pub others_kept: bool,
}

/// What the section measured.
#[derive(Debug, Clone, Default)]
pub struct ShardFailoverResult {
    pub shards: u32,
    pub clients_per_shard: usize,
    pub rounds: Vec<Round>,
    pub serve_ms_p50: f64,
    pub serve_ms_max: f64,
    /// Over every round: the other shards' calls during the failovers.
    pub other_calls: usize,
    pub other_failed: usize,
    /// Over every round: latency p50 and p99 (ms) before and during.
    pub before_ms: (f64, f64),
    pub during_ms: (f64, f64),
    /// Granted calls per second over the steady windows, every shard.
    pub steady_calls_per_s: f64,
}

/// One call of a client.
#[derive(Debug, Clone, Copy)]
struct Call {
    shard: u32,
    sent: Instant,
    done: Instant,
    granted: bool,
}

/// What the clients share with the section.
#[derive(Debug)]
struct Shared {
    /// Set when the clients should stop.
    stop: AtomicBool,
    /// Per shard: the latest sending time of a granted call, in µs since
    /// `base` (the section's live signal that a shard serves).
    granted_sent_us: Vec<AtomicU64>,
    base: Instant,
}

impl Shared {
    fn us(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.base).as_micros()).unwrap_or(u64::MAX)
    }

    /// Whether a call to `shard` sent at or after `since` was granted.
    fn served_since(&self, shard: u32, since: Instant) -> bool {
        self.granted_sent_us[shard as usize].load(Ordering::Relaxed) >= self.us(since)
    }
}

/// A round's times, for the records to be read against.
#[derive(Debug, Clone)]
struct RoundTimes {
    victim: u64,
    killed_shards: Vec<u32>,
    steady_from: Instant,
    killed_at: Instant,
    others_kept: bool,
}

/// Runs the section on a fresh cluster: `profile.shard_failover_rounds` kills.
pub async fn run(profile: &Profile) -> ShardFailoverResult {
    eprintln!("bench: shard failover, S = {SHARDS}");
    let settings = Settings {
        shards: Some(SHARDS),
        ..super::settings()
    };
    let mut cluster = super::BenchCluster::start(settings).await;
    let leaders = cluster.wait_spread().await;
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        granted_sent_us: (0..SHARDS).map(|_| AtomicU64::new(0)).collect(),
        base: Instant::now(),
    });
    let clients = start_clients(&cluster, &leaders, &shared);
    tokio::time::sleep(profile.warmup).await;
    let mut rounds = Vec::new();
    for round in 0..profile.shard_failover_rounds {
        match kill_round(&mut cluster, &shared, round, profile.shard_failover_steady).await {
            Some(times) => rounds.push(times),
            None => break,
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    let mut calls = Vec::new();
    for client in clients {
        calls.extend(client.await.expect("client task"));
    }
    summarise(&rounds, &calls, profile.shard_failover_steady)
}

/// Keys of `shard`, one per client, found by their shard.
fn keys_of(shard: u32) -> Vec<String> {
    let named = (0..).map(|index| format!("sf-{index}"));
    let of_shard = named.filter(|key| shard_of(key, SHARDS) == Ok(shard));
    of_shard.take(CLIENTS_PER_SHARD).collect()
}

/// Every shard's clients, each first calling its shard's leader in `leaders`
/// and starting a share of [`CALL_PERIOD`] after the previous one, so their
/// calls interleave.
fn start_clients(
    cluster: &Cluster,
    leaders: &[u64],
    shared: &Arc<Shared>,
) -> Vec<tokio::task::JoinHandle<Vec<Call>>> {
    let http = bench_http(cluster);
    let nodes: Vec<(u64, String)> = cluster
        .nodes
        .iter()
        .map(|node| (node.id, node.url()))
        .collect();
    let total = SHARDS as usize * CLIENTS_PER_SHARD;
    let mut tasks = Vec::with_capacity(total);
    for shard in 0..SHARDS {
        for key in keys_of(shard) {
            let offset = CALL_PERIOD * tasks.len() as u32 / total as u32;
            let client = Client {
                http: http.clone(),
                shard,
                client_id: format!("{key}-client"),
                key,
                nodes: nodes.clone(),
                node: leaders[shard as usize],
            };
            tasks.push(tokio::spawn(client.run(shared.clone(), offset)));
        }
    }
    tasks
}

/// One round: settle, a steady window, the kill, until its shards serve
/// again, then the restart. `None` when the killed shards did not serve again
/// within [`GIVE_UP_AFTER`].
async fn kill_round(
    cluster: &mut Cluster,
    shared: &Shared,
    round: usize,
    steady: Duration,
) -> Option<RoundTimes> {
    let leaders = cluster.wait_spread().await;
    let victim = leaders[round % leaders.len()];
    let killed_shards: Vec<u32> = (0..SHARDS)
        .filter(|shard| leaders[*shard as usize] == victim)
        .collect();
    let witness = cluster.follower_of(victim);
    let steady_from = Instant::now();
    // The steady window is a measurement, not a wait for a condition.
    tokio::time::sleep(steady).await;
    let before = shard_map(cluster, witness).await;
    let killed_at = Instant::now();
    // The wall clock too, to find the kill in the nodes' logs.
    let killed_at_ms = now_ms();
    cluster.kill(victim);
    let all_served = || {
        killed_shards
            .iter()
            .all(|s| shared.served_since(*s, killed_at))
    };
    let (served, ()) = eventually_seen(GIVE_UP_AFTER, || async { (all_served(), ()) }).await;
    if !served {
        eprintln!("shard failover {round}: node {victim}'s shards {killed_shards:?} not served within {GIVE_UP_AFTER:?}");
        return None;
    }
    eprintln!(
        "bench: shard failover {round}: node {victim} (shards {killed_shards:?}) killed at \
         {killed_at_ms} ms since the epoch, served again within {:?}",
        killed_at.elapsed()
    );
    let after = shard_map(cluster, witness).await;
    let others_kept = others_kept(before.as_ref(), after.as_ref(), &killed_shards);
    cluster.restart(victim);
    cluster.wait_healthy().await;
    cluster.wait_spread().await;
    catch_up(cluster, victim).await;
    Some(RoundTimes {
        victim,
        killed_shards,
        steady_from,
        killed_at,
        others_kept,
    })
}

/// Whether every shard but `killed` has the same leader and term in `after`
/// as in `before` (both read from the same surviving node).
fn others_kept(before: Option<&ShardMap>, after: Option<&ShardMap>, killed: &[u32]) -> bool {
    let (Some(before), Some(after)) = (before, after) else {
        return false;
    };
    let others = before.shards.iter().filter(|s| !killed.contains(&s.shard));
    others.into_iter().all(|then| {
        let now = after.shards.iter().find(|s| s.shard == then.shard);
        now.is_some_and(|now| now.leader == then.leader && now.term == then.term)
    })
}

/// Waits until `restarted` has applied, on every shard, what that shard's
/// leader had applied when the wait began, so the next round's kill leaves
/// two nodes that are both up to date.
async fn catch_up(cluster: &Cluster, restarted: u64) {
    let leaders = cluster.wait_spread().await;
    let mut targets = Vec::new();
    for (shard, leader) in leaders.iter().enumerate() {
        let map = shard_map(cluster, *leader).await;
        targets.push(applied(map.as_ref(), shard).unwrap_or(0));
    }
    let (caught_up, seen) = eventually_seen(CATCH_UP, || async {
        let map = shard_map(cluster, restarted).await;
        let reached = targets.iter().enumerate().all(|(shard, target)| {
            applied(map.as_ref(), shard).is_some_and(|applied| applied >= *target)
        });
        (reached, map)
    })
    .await;
    if !caught_up {
        eprintln!("shard failover: node {restarted} not caught up to {targets:?}: {seen:?}");
    }
}

/// Shard `shard`'s applied index in `map`.
fn applied(map: Option<&ShardMap>, shard: usize) -> Option<u64> {
    map?.shards.get(shard)?.applied_index
}

/// One client of one shard's key.
struct Client {
    http: reqwest::Client,
    shard: u32,
    key: String,
    client_id: String,
    /// Every node's id and base URL.
    nodes: Vec<(u64, String)>,
    /// The node it calls: the leader the last answer named.
    node: u64,
}

/// How a call ended.
enum Outcome {
    /// A grant answer; its grants (possibly none) and the leader it named.
    Answered(Vec<GrantReport>, Option<u64>),
    /// No grant answer; the leader the answer named, if any.
    Failed(Option<u64>),
}

impl Client {
    /// Calls until the section stops; every call's record.
    async fn run(mut self, shared: Arc<Shared>, offset: Duration) -> Vec<Call> {
        let start = tokio::time::Instant::now() + offset;
        let mut ticks = tokio::time::interval_at(start, CALL_PERIOD);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut calls = Vec::new();
        let mut held: Vec<GrantReport> = Vec::new();
        let mut demand_since: Option<u64> = None;
        while !shared.stop.load(Ordering::Relaxed) {
            ticks.tick().await;
            let oldest_at = *demand_since.get_or_insert_with(now_ms);
            let request = super::one_permit(self.client_id.clone(), oldest_at, held.clone());
            let sent = Instant::now();
            let outcome = self.call(&request).await;
            let done = Instant::now();
            let granted = match outcome {
                Outcome::Answered(grants, leader) => {
                    self.follow(leader);
                    held = grants;
                    !held.is_empty()
                }
                Outcome::Failed(leader) => {
                    // The reports stay held: the next call sends them again.
                    self.reroute(leader);
                    false
                }
            };
            if granted {
                demand_since = None;
                let sent_us = shared.us(sent);
                shared.granted_sent_us[self.shard as usize].fetch_max(sent_us, Ordering::Relaxed);
            }
            calls.push(Call {
                shard: self.shard,
                sent,
                done,
                granted,
            });
            if !granted {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
        calls
    }

    async fn call(&self, request: &permitd_core::contract::protocol::SemaphoreRequest) -> Outcome {
        let url = self.url(self.node);
        let endpoint = format!("{url}/v1/semaphores/{}", self.key);
        let body = serde_json::to_vec(request).expect("protocol values serialise");
        let answer = self
            .http
            .post(&endpoint)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(CALL_TIMEOUT)
            .body(body)
            .send()
            .await;
        let Ok(answer) = answer else {
            return Outcome::Failed(None);
        };
        let leader = answer
            .headers()
            .get(headers::LEADER)
            .and_then(|value| value.to_str().ok()?.parse().ok());
        if !answer.status().is_success() {
            return Outcome::Failed(leader);
        }
        let bytes = answer.bytes().await.unwrap_or_default();
        match serde_json::from_slice(&bytes) {
            Ok(SemaphoreResponse::Grant(grant)) => {
                let reports = grant.grants.iter().map(|granted| GrantReport {
                    grant_id: granted.grant_id.to_string(),
                    claimed: granted.permits,
                    released: granted.permits,
                });
                Outcome::Answered(reports.collect(), leader)
            }
            _ => Outcome::Failed(leader),
        }
    }

    /// Calls the leader an answer named, if it is a node of the cluster.
    fn follow(&mut self, leader: Option<u64>) {
        if let Some(leader) = leader.filter(|id| self.nodes.iter().any(|(node, _)| node == id)) {
            self.node = leader;
        }
    }

    /// After a failed call: the leader it named, unless that is the node that
    /// failed; else the next node in turn.
    fn reroute(&mut self, leader: Option<u64>) {
        let failed = self.node;
        self.follow(leader);
        if self.node == failed {
            let at = self.nodes.iter().position(|(id, _)| *id == failed);
            let next = at.map_or(0, |at| (at + 1) % self.nodes.len());
            self.node = self.nodes[next].0;
        }
    }

    fn url(&self, id: u64) -> &str {
        let node = self.nodes.iter().find(|(node, _)| *node == id);
        node.map_or(self.nodes[0].1.as_str(), |(_, url)| url.as_str())
    }
}

/// Reads every round's figures from the calls.
fn summarise(rounds: &[RoundTimes], calls: &[Call], steady: Duration) -> ShardFailoverResult {
    let mut result = ShardFailoverResult {
        shards: SHARDS,
        clients_per_shard: CLIENTS_PER_SHARD,
        ..ShardFailoverResult::default()
    };
    let (mut all_before, mut all_during) = (Vec::new(), Vec::new());
    let mut steady_granted = 0;
    let mut serve_ms = Vec::new();
    for times in rounds {
        let Some(served_at) = served_at(times, calls) else {
            continue;
        };
        let killed = |call: &&Call| times.killed_shards.contains(&call.shard);
        let other = |call: &&Call| !killed(call);
        let mut before: Vec<f64> = calls
            .iter()
            .filter(other)
            .filter(|call| call.sent >= times.steady_from && call.done < times.killed_at)
            .map(|call| ms(call.done - call.sent))
            .collect();
        let during: Vec<&Call> = calls
            .iter()
            .filter(other)
            .filter(|call| call.done > times.killed_at && call.sent < served_at)
            .collect();
        let mut during_ms: Vec<f64> = during
            .iter()
            .map(|call| ms(call.done - call.sent))
            .collect();
        steady_granted += calls
            .iter()
            .filter(|call| call.granted)
            .filter(|call| call.done >= times.steady_from && call.done < times.killed_at)
            .count();
        let failed = during.iter().filter(|call| !call.granted).count();
        let took = ms(served_at - times.killed_at);
        serve_ms.push(took);
        all_before.extend_from_slice(&before);
        all_during.extend_from_slice(&during_ms);
        result.other_calls += during.len();
        result.other_failed += failed;
        result.rounds.push(Round {
            victim: times.victim,
            killed_shards: times.killed_shards.clone(),
            serve_ms: took,
            other_calls: during.len(),
            other_failed: failed,
            before_ms: p50_p99(&mut before),
            during_ms: p50_p99(&mut during_ms),
            others_kept: times.others_kept,
        });
    }
    result.serve_ms_p50 = quantile(&mut serve_ms, 0.5);
    result.serve_ms_max = serve_ms.last().copied().unwrap_or(f64::NAN);
    result.before_ms = p50_p99(&mut all_before);
    result.during_ms = p50_p99(&mut all_during);
    let steady_s = steady.as_secs_f64() * result.rounds.len() as f64;
    result.steady_calls_per_s = steady_granted as f64 / steady_s;
    result
}

/// When the last of the round's killed shards served again: the end of its
/// first granted call sent after the kill.
fn served_at(times: &RoundTimes, calls: &[Call]) -> Option<Instant> {
    let first_grant = |shard: u32| {
        let after_kill = calls.iter().filter(|call| call.sent >= times.killed_at);
        let granted = after_kill.filter(|call| call.shard == shard && call.granted);
        granted.map(|call| call.done).min()
    };
    let served: Option<Vec<Instant>> = times
        .killed_shards
        .iter()
        .map(|s| first_grant(*s))
        .collect();
    served?.into_iter().max()
}

/// `(p50, p99)` of `samples`.
fn p50_p99(samples: &mut [f64]) -> (f64, f64) {
    (quantile(samples, 0.5), quantile(samples, 0.99))
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::ShardStatus;

    use super::*;

    fn map(leaders_terms: &[(u64, u64)]) -> ShardMap {
        let shards = leaders_terms
            .iter()
            .enumerate()
            .map(|(shard, (leader, term))| ShardStatus {
                shard: shard as u32,
                leader: Some(*leader),
                term: *term,
                members: vec![1, 2, 3],
                applied_index: Some(1),
            });
        ShardMap {
            id: 2,
            shards: shards.collect(),
        }
    }

    #[test]
    fn every_client_key_is_of_its_shard() {
        for shard in 0..SHARDS {
            let keys = keys_of(shard);
            assert_eq!(keys.len(), CLIENTS_PER_SHARD);
            assert!(keys.iter().all(|key| shard_of(key, SHARDS) == Ok(shard)));
        }
    }

    #[test]
    fn only_the_killed_shards_may_change_leader_or_term() {
        let before = map(&[(1, 3), (2, 4), (3, 5)]);
        let moved = map(&[(2, 4), (2, 4), (3, 5)]);
        assert!(others_kept(Some(&before), Some(&moved), &[0]));
        let disturbed = map(&[(2, 4), (2, 5), (3, 5)]);
        assert!(!others_kept(Some(&before), Some(&disturbed), &[0]));
        assert!(!others_kept(Some(&before), None, &[0]));
    }

    #[test]
    fn a_shard_serves_again_at_its_first_grant_sent_after_the_kill() {
        let base = Instant::now();
        let at = |ms: u64| base + Duration::from_millis(ms);
        let call = |shard, sent, done, granted| Call {
            shard,
            sent: at(sent),
            done: at(done),
            granted,
        };
        let times = RoundTimes {
            victim: 1,
            killed_shards: vec![0],
            steady_from: at(0),
            killed_at: at(100),
            others_kept: true,
        };
        let calls = [
            // Answered after the kill, but sent before it: not the new leader.
            call(0, 99, 101, true),
            call(0, 102, 150, false),
            call(1, 120, 121, true),
            call(0, 160, 450, true),
            call(0, 455, 456, true),
        ];
        assert_eq!(served_at(&times, &calls), Some(at(450)));
        assert_eq!(served_at(&times, &calls[..3]), None);
    }
}
