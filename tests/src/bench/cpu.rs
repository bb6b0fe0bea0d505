//! What a throughput row cost: CPU time of every process, log entries and
//! HTTP calls over the row's measured window, per completed permit cycle.
//!
//! A [`Window`] is opened at the start of the window and closed at its end;
//! each end reads, for every running node and for the bench process itself
//! (which plays every client), `utime + stime` from `/proc/<pid>/stat` (CPU
//! time of all the process's threads, dead ones included, in clock ticks:
//! [`clock_ticks_per_s`]), the leader's `lastLogIndex` (`/cluster/status`)
//! and the HTTP calls the clients made. The section then names the cycles per
//! second it completed in its window ([`Cost::with_cycles_per_s`]); every
//! per-cycle figure is a rate over a rate, so the few milliseconds between
//! the section's window and the readings' do not matter.
//!
//! Calls are counted by the clients where the section's own loop sends them
//! ([`Calls::Client`]: an atomic counter bumped per call). Where a library
//! sends them (the `SemaphoreQueue` runners), they come from the nodes'
//! `permitd_http_requests_total{listener="api",route=~"/v1/semaphores.*"}`
//! ([`Calls::Served`]), summed over nodes; a follower that forwards a call to
//! the leader counts it twice there, so the share that reached followers is
//! reported beside it ([`Cost::messages_via_followers`]; 0 when the clients
//! talk to the leader, as they do once they know it).
//!
//! The same `/metrics` pages give the followers' leader contact gaps over the
//! window ([`super::gaps`]): whether heartbeats kept coming under the load.
//!
//! With shards every node leads some groups and follows the others, so the
//! split by one leader says little; each window also keeps every node's own
//! share ([`NodeCost`]): its CPU, its WAL's group commits
//! (`permitd_wal_syncs_total`, one `fdatasync` each) and the calls its peer
//! listener served (`permitd_http_requests_total{listener="raft"}` on
//! `/raft/*` routes: the other nodes' Raft RPCs, each an HTTP request and its
//! answer), and the log entries of every shard: the growth of the sum of
//! `appliedIndex` over `GET /cluster/shards` on the window's node, whose
//! `lastLogIndex` above counts one group only.
//!
//! The readings are ordered so the bench's own polls fall outside the CPU
//! window: an opening reads HTTP first and CPU last, a closing CPU first.
//! Resolution is one clock tick (10 ms at 100 Hz) per process and end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use serde_json::{json, Value};

use super::gaps::{ContactGaps, GapBuckets};
use super::stats::{last_log_index, shard_map};
use crate::Cluster;

/// Clock ticks per second of `/proc/<pid>/stat` times: `getconf CLK_TCK`,
/// read once; 100 (Linux's `USER_HZ` everywhere) if that fails.
pub fn clock_ticks_per_s() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|output| String::from_utf8(output.stdout).ok())
            .and_then(|text| text.trim().parse::<u64>().ok())
            .filter(|ticks| *ticks > 0)
            .unwrap_or(100)
    })
}

/// One process's CPU time: a node (by pid) or the bench itself.
#[derive(Debug, Clone, Copy)]
pub struct ProcessCpu {
    /// `None`: this process (`/proc/self`).
    pid: Option<u32>,
}

impl ProcessCpu {
    pub fn of(pid: u32) -> Self {
        Self { pid: Some(pid) }
    }

    pub fn this_process() -> Self {
        Self { pid: None }
    }

    /// `utime + stime` in clock ticks; `None` when the process is gone.
    pub fn ticks(&self) -> Option<u64> {
        let path = match self.pid {
            Some(pid) => format!("/proc/{pid}/stat"),
            None => "/proc/self/stat".to_owned(),
        };
        stat_ticks(&std::fs::read_to_string(path).ok()?)
    }
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line. The
/// command name (field 2) is in parentheses and may hold spaces and `)`, so
/// the fields are counted from the last `)`.
fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (the state).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Where a window's HTTP calls are counted.
#[derive(Debug, Clone)]
pub enum Calls {
    /// By the clients: every call they send bumps the counter.
    Client(Arc<AtomicU64>),
    /// By the nodes: their `/v1/semaphores` calls in `/metrics`.
    Served,
}

/// A count and when it was read.
type Stamped<T> = (Instant, T);

/// CPU ticks of every node running at the opening (`(id, ticks)`) and of
/// the bench process.
#[derive(Debug, Clone)]
struct CpuTicks {
    nodes: Vec<(u64, Option<u64>)>,
    client: Option<u64>,
}

/// One end of a window. Each quantity carries its own time, since the HTTP
/// readings take a while (and are kept out of the CPU window).
#[derive(Debug, Clone)]
struct Reading {
    cpu: Stamped<CpuTicks>,
    last_index: Stamped<u64>,
    /// Calls so far: `(leader's, followers')` served, or the client counter
    /// as the leader's share.
    calls: Option<Stamped<(u64, u64)>>,
    /// Each node's contact gap histogram so far.
    gaps: Vec<(u64, GapBuckets)>,
    /// The highest term any node reports ([`max_term`]).
    term: u64,
    /// Each node's own counters ([`NodeCounters`]).
    counters: Option<Stamped<Vec<(u64, NodeCounters)>>>,
    /// Every shard's applied index and term, summed ([`ShardTotals`]).
    shards: Option<Stamped<ShardTotals>>,
}

/// One node's counters in its `/metrics` page.
#[derive(Debug, Clone, Copy, Default)]
struct NodeCounters {
    syncs: u64,
    peer_calls: u64,
}

impl NodeCounters {
    fn parse(page: &str) -> Self {
        Self {
            syncs: series_sum(page, WAL_SYNCS, |_| true),
            peer_calls: series_sum(page, HTTP_REQUESTS, |labels| {
                labels.contains("listener=\"raft\"") && labels.contains("route=\"/raft/")
            }),
        }
    }
}

/// Sums over every shard one node serves: the entries it applied and the
/// terms it saw (each election begins a term in its shard).
#[derive(Debug, Clone, Copy)]
struct ShardTotals {
    applied: u64,
    terms: u64,
}

/// Node `id`'s [`ShardTotals`]; `None` when it does not answer.
async fn shard_totals(cluster: &Cluster, id: u64) -> Option<Stamped<ShardTotals>> {
    let map = shard_map(cluster, id).await?;
    let shards = map.shards.iter();
    let totals = ShardTotals {
        applied: shards.clone().filter_map(|shard| shard.applied_index).sum(),
        terms: shards.map(|shard| shard.term).sum(),
    };
    Some((Instant::now(), totals))
}

/// A measured window in progress (see the module comment).
#[derive(Debug)]
pub struct Window {
    leader: u64,
    calls: Calls,
    processes: Vec<(u64, ProcessCpu)>,
    start: Reading,
}

impl Window {
    /// Opens a window on `cluster` whose leader is `leader`: the leader's log
    /// index first (as the sections always read it), then the nodes' metrics
    /// and terms, then CPU and client calls.
    pub async fn open(cluster: &Cluster, leader: u64, calls: Calls) -> Self {
        let processes: Vec<(u64, ProcessCpu)> = cluster
            .nodes
            .iter()
            .filter_map(|node| Some((node.id, ProcessCpu::of(node.pid()?))))
            .collect();
        let last_index = (Instant::now(), last_log_index(cluster, leader).await);
        let shards = shard_totals(cluster, leader).await;
        let pages = metrics_pages(cluster).await;
        let served = served_calls(pages.as_ref(), leader, &calls);
        let gaps = node_gaps(pages.as_ref());
        let counters = node_counters(pages.as_ref());
        let term = max_term(cluster).await;
        let cpu = read_cpu(&processes);
        let calls_now = client_calls(&calls).or(served);
        Self {
            leader,
            calls,
            processes,
            start: Reading {
                cpu,
                last_index,
                calls: calls_now,
                gaps,
                term,
                counters,
                shards,
            },
        }
    }

    /// Closes the window (CPU and client calls first, then the log indexes,
    /// then the nodes' metrics and terms): what it cost, its cycles still to be named
    /// ([`Cost::with_cycles_per_s`]).
    pub async fn close(self, cluster: &Cluster) -> Cost {
        let cpu = read_cpu(&self.processes);
        let calls_now = client_calls(&self.calls);
        let last_index = (Instant::now(), last_log_index(cluster, self.leader).await);
        let shards = shard_totals(cluster, self.leader).await;
        let pages = metrics_pages(cluster).await;
        let calls_now =
            calls_now.or_else(|| served_calls(pages.as_ref(), self.leader, &self.calls));
        let end = Reading {
            cpu,
            last_index,
            calls: calls_now,
            gaps: node_gaps(pages.as_ref()),
            term: max_term(cluster).await,
            counters: node_counters(pages.as_ref()),
            shards,
        };
        let contact_gaps = window_gaps(&self.start.gaps, &end.gaps);
        let ticks = clock_ticks_per_s() as f64;
        let seconds = |from: Option<u64>, to: Option<u64>| -> Option<f64> {
            Some(to?.checked_sub(from?)? as f64 / ticks)
        };
        let mut leader_cpu_s = None;
        let mut followers_cpu_s = Vec::new();
        let mut nodes = Vec::new();
        for ((id, from), (_, to)) in self.start.cpu.1.nodes.iter().zip(&end.cpu.1.nodes) {
            let used = seconds(*from, *to);
            if *id == self.leader {
                leader_cpu_s = used;
            } else {
                followers_cpu_s.push((*id, used));
            }
            nodes.push(node_cost(*id, used, &self.start, &end));
        }
        let stamped_span = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
            (Some(from), Some(to)) => (to - from).as_secs_f64(),
            _ => f64::NAN,
        };
        let counted_at = |reading: &Reading| reading.counters.as_ref().map(|(at, _)| *at);
        let shards_at = |reading: &Reading| reading.shards.map(|(at, _)| at);
        let shard_growth = |total: fn(&ShardTotals) -> u64| {
            let (from, to) = (self.start.shards?.1, end.shards?.1);
            Some(total(&to).saturating_sub(total(&from)))
        };
        let calls = match (self.start.calls, end.calls) {
            (
                Some((from_at, (leader_from, followers_from))),
                Some((to_at, (leader_to, followers_to))),
            ) => Some((
                (to_at - from_at).as_secs_f64(),
                leader_to.saturating_sub(leader_from),
                followers_to.saturating_sub(followers_from),
            )),
            _ => None,
        };
        Cost {
            cpu_window_s: (end.cpu.0 - self.start.cpu.0).as_secs_f64(),
            leader_cpu_s,
            followers_cpu_s,
            client_cpu_s: seconds(self.start.cpu.1.client, end.cpu.1.client),
            cycles_per_s: f64::NAN,
            entries: end.last_index.1.saturating_sub(self.start.last_index.1),
            entries_window_s: (end.last_index.0 - self.start.last_index.0).as_secs_f64(),
            messages: calls.map(|(_, leader, followers)| leader + followers),
            messages_window_s: calls.map_or(f64::NAN, |(seconds, _, _)| seconds),
            messages_via_followers: match self.calls {
                Calls::Client(_) => None,
                Calls::Served => calls.map(|(_, _, followers)| followers),
            },
            messages_source: match self.calls {
                Calls::Client(_) => "client",
                Calls::Served => "served",
            },
            contact_gaps,
            elections: end.term.saturating_sub(self.start.term),
            nodes,
            nodes_window_s: stamped_span(counted_at(&self.start), counted_at(&end)),
            shard_entries: shard_growth(|totals| totals.applied),
            shard_entries_window_s: stamped_span(shards_at(&self.start), shards_at(&end)),
            shard_elections: shard_growth(|totals| totals.terms),
        }
    }
}

/// Node `id`'s share of the window between `start` and `end`: `cpu_s`, and
/// its counters' growth where both ends read them.
fn node_cost(id: u64, cpu_s: Option<f64>, start: &Reading, end: &Reading) -> NodeCost {
    let counters = |reading: &Reading| {
        let (_, nodes) = reading.counters.as_ref()?;
        nodes
            .iter()
            .find(|(node, _)| *node == id)
            .map(|(_, counters)| *counters)
    };
    let (from, to) = (counters(start), counters(end));
    let growth = |count: fn(&NodeCounters) -> u64| Some(count(&to?).saturating_sub(count(&from?)));
    NodeCost {
        id,
        cpu_s,
        syncs: growth(|counters| counters.syncs),
        peer_calls: growth(|counters| counters.peer_calls),
    }
}

fn read_cpu(processes: &[(u64, ProcessCpu)]) -> Stamped<CpuTicks> {
    let nodes = processes
        .iter()
        .map(|(id, process)| (*id, process.ticks()))
        .collect();
    let client = ProcessCpu::this_process().ticks();
    (Instant::now(), CpuTicks { nodes, client })
}

/// The client counter now, for [`Calls::Client`].
fn client_calls(calls: &Calls) -> Option<Stamped<(u64, u64)>> {
    match calls {
        Calls::Client(counter) => Some((Instant::now(), (counter.load(Ordering::Relaxed), 0))),
        Calls::Served => None,
    }
}

/// Every running node's `/metrics` page (`(id, text)`) and when the last
/// arrived; `None` when a node does not answer.
async fn metrics_pages(cluster: &Cluster) -> Option<Stamped<Vec<(u64, String)>>> {
    let mut pages = Vec::new();
    for node in cluster.nodes.iter().filter(|node| node.is_running()) {
        let url = format!("{}/metrics", node.url());
        let answer = cluster
            .http
            .get(url)
            .timeout(std::time::Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        pages.push((node.id, answer.text().await.ok()?));
    }
    Some((Instant::now(), pages))
}

/// `(leader's, followers')` served `/v1/semaphores` calls, for [`Calls::Served`].
fn served_calls(
    pages: Option<&Stamped<Vec<(u64, String)>>>,
    leader: u64,
    calls: &Calls,
) -> Option<Stamped<(u64, u64)>> {
    if matches!(calls, Calls::Client(_)) {
        return None;
    }
    let (at, pages) = pages?;
    let (mut at_leader, mut at_followers) = (0, 0);
    for (id, page) in pages {
        let served = semaphore_calls(page);
        if *id == leader {
            at_leader += served;
        } else {
            at_followers += served;
        }
    }
    Some((*at, (at_leader, at_followers)))
}

/// Each node's contact gap histogram (none when the pages are missing). A
/// node records none while it leads, so with one group these are the
/// followers'; with shards, every node follows some.
fn node_gaps(pages: Option<&Stamped<Vec<(u64, String)>>>) -> Vec<(u64, GapBuckets)> {
    pages.map_or_else(Vec::new, |(_, pages)| {
        pages
            .iter()
            .map(|(id, page)| (*id, GapBuckets::parse(page)))
            .collect()
    })
}

/// Each node's [`NodeCounters`] (none when the pages are missing).
fn node_counters(
    pages: Option<&Stamped<Vec<(u64, String)>>>,
) -> Option<Stamped<Vec<(u64, NodeCounters)>>> {
    let (at, pages) = pages?;
    let counters = pages
        .iter()
        .map(|(id, page)| (*id, NodeCounters::parse(page)))
        .collect();
    Some((*at, counters))
}

/// The nodes' gaps between the two readings, summed; `None` unless both
/// ends read the same nodes.
fn window_gaps(start: &[(u64, GapBuckets)], end: &[(u64, GapBuckets)]) -> Option<ContactGaps> {
    let ids =
        |readings: &[(u64, GapBuckets)]| readings.iter().map(|(id, _)| *id).collect::<Vec<_>>();
    if start.is_empty() || ids(start) != ids(end) {
        return None;
    }
    let buckets = start
        .iter()
        .zip(end)
        .fold(GapBuckets::default(), |sum, ((_, from), (_, to))| {
            sum.plus(&to.since(from))
        });
    Some(ContactGaps { buckets })
}

/// The nodes' HTTP call counter (`node/src/observe/http_metrics.rs`).
const HTTP_REQUESTS: &str = "permitd_http_requests_total";
/// A node's WAL group commits (`storage/src/wal/metrics.rs`).
const WAL_SYNCS: &str = "permitd_wal_syncs_total";

/// Sum of `permitd_http_requests_total` over the public listener's
/// `/v1/semaphores…` and `/v1/batch` routes (a queue sends a poll's reports
/// for several keys as one batch) in a Prometheus text page.
fn semaphore_calls(metrics: &str) -> u64 {
    series_sum(metrics, HTTP_REQUESTS, |labels| {
        let route =
            labels.contains("route=\"/v1/semaphores") || labels.contains("route=\"/v1/batch\"");
        labels.contains("listener=\"api\"") && route
    })
}

/// Sum of the series of counter `name` whose labels (the text between the
/// braces; empty for a series without labels) pass `labels`, in a Prometheus
/// text page.
fn series_sum(page: &str, name: &str, labels: impl Fn(&str) -> bool) -> u64 {
    page.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labelled, value) = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            labels(labelled).then(|| value.trim().parse::<f64>().ok())?
        })
        .map(|value| value as u64)
        .sum()
}

/// One node's share of a window.
#[derive(Debug, Clone, Default)]
pub struct NodeCost {
    pub id: u64,
    /// CPU seconds over the CPU window; `None` when a reading failed.
    pub cpu_s: Option<f64>,
    /// WAL group commits (one `fdatasync` each) over the nodes' window.
    pub syncs: Option<u64>,
    /// Calls its peer listener served (the other nodes' Raft RPCs).
    pub peer_calls: Option<u64>,
}

/// What one window cost. Every quantity is a rate over its own reading
/// interval (CPU, log index and calls are read one after the other), and per
/// cycle means per the section's cycles per second over its window: the
/// intervals differ by the time of a status call, the rates do not.
#[derive(Debug, Clone, Default)]
pub struct Cost {
    /// Between the two CPU readings.
    pub cpu_window_s: f64,
    /// CPU seconds used in the window; `None` when a reading failed.
    pub leader_cpu_s: Option<f64>,
    pub followers_cpu_s: Vec<(u64, Option<f64>)>,
    /// The bench process: every client.
    pub client_cpu_s: Option<f64>,
    /// Permit cycles completed per second (named by the section).
    pub cycles_per_s: f64,
    /// Log entries the leader appended, and over how long.
    pub entries: u64,
    pub entries_window_s: f64,
    /// HTTP calls of the clients, and over how long.
    pub messages: Option<u64>,
    pub messages_window_s: f64,
    /// `client` or `served` (see the module comment).
    pub messages_source: &'static str,
    /// Of `messages` (served), those that reached followers.
    pub messages_via_followers: Option<u64>,
    /// The followers' leader contact gaps; `None` when a reading failed.
    pub contact_gaps: Option<ContactGaps>,
    /// Term increases over the window: anything but 0 means the leader the
    /// costs are split by was not the leader all along.
    pub elections: u64,
    /// Every node's own share, in node order.
    pub nodes: Vec<NodeCost>,
    /// Between the two readings of the nodes' counters.
    pub nodes_window_s: f64,
    /// Log entries applied in every shard (on the window's node), and over
    /// how long; `None` when a reading failed.
    pub shard_entries: Option<u64>,
    pub shard_entries_window_s: f64,
    /// Term increases summed over the shards: elections in any of them.
    pub shard_elections: Option<u64>,
}

impl Cost {
    pub fn with_cycles_per_s(mut self, cycles_per_s: f64) -> Self {
        self.cycles_per_s = cycles_per_s;
        self
    }

    /// Sum of the followers' CPU seconds (`None` if any reading failed).
    pub fn followers_total_s(&self) -> Option<f64> {
        self.followers_cpu_s.iter().map(|(_, used)| *used).sum()
    }

    /// Every process's CPU seconds.
    pub fn total_s(&self) -> Option<f64> {
        Some(self.leader_cpu_s? + self.followers_total_s()? + self.client_cpu_s?)
    }

    /// Cores `cpu_s` kept busy on average.
    pub fn cores(&self, cpu_s: Option<f64>) -> f64 {
        cpu_s.map_or(f64::NAN, |used| used / self.cpu_window_s)
    }

    pub fn entries_per_s(&self) -> f64 {
        self.entries as f64 / self.entries_window_s
    }

    /// Log entries per second, every shard's together (`NaN` when unread).
    pub fn shard_entries_per_s(&self) -> f64 {
        self.shard_entries.map_or(f64::NAN, |entries| {
            entries as f64 / self.shard_entries_window_s
        })
    }

    /// `count` per second over the nodes' window (`NaN` when unread).
    pub fn node_rate(&self, count: Option<u64>) -> f64 {
        count.map_or(f64::NAN, |count| count as f64 / self.nodes_window_s)
    }

    /// µs of `cpu_s` per log entry of any shard (`NaN` without entries).
    pub fn us_per_shard_entry(&self, cpu_s: Option<f64>) -> f64 {
        per(self.cores(cpu_s), self.shard_entries_per_s())
    }

    pub fn messages_per_cycle(&self) -> Option<f64> {
        let per_s = self.messages? as f64 / self.messages_window_s;
        Some(per_s / self.cycles_per_s).filter(|value| value.is_finite())
    }

    /// µs of `cpu_s` per cycle (`NaN` without cycles).
    pub fn us_per_cycle(&self, cpu_s: Option<f64>) -> f64 {
        per(self.cores(cpu_s), self.cycles_per_s)
    }

    /// µs of `cpu_s` per log entry (`NaN` without entries).
    pub fn us_per_entry(&self, cpu_s: Option<f64>) -> f64 {
        per(self.cores(cpu_s), self.entries_per_s())
    }

    /// `L 41 · F 18+17 · C 25 · Σ 101` (µs of CPU per cycle).
    pub fn per_cycle_cell(&self) -> String {
        let followers: Vec<String> = self
            .followers_cpu_s
            .iter()
            .map(|(_, used)| us(self.us_per_cycle(*used)))
            .collect();
        format!(
            "L {} · F {} · C {} · Σ {}",
            us(self.us_per_cycle(self.leader_cpu_s)),
            followers.join("+"),
            us(self.us_per_cycle(self.client_cpu_s)),
            us(self.us_per_cycle(self.total_s()))
        )
    }

    /// `p99.9 40–60 ms · max 60–80 ms (1,234 gaps)`; `n/a` when unread.
    pub fn gaps_cell(&self) -> String {
        self.contact_gaps
            .as_ref()
            .map_or_else(|| "n/a".into(), ContactGaps::cell)
    }

    /// `2,345 entries/s · Σ 410 (L 160) µs/entry · 2.00 msgs/cycle`.
    pub fn entries_cell(&self) -> String {
        let messages = match (self.messages_per_cycle(), self.messages_via_followers) {
            (Some(per_cycle), Some(via)) if via > 0 => {
                format!(
                    " · {} msgs/cycle ({via} calls via followers)",
                    ratio(per_cycle)
                )
            }
            (Some(per_cycle), _) => format!(" · {} msgs/cycle", ratio(per_cycle)),
            (None, _) => String::new(),
        };
        format!(
            "{:.0} entries/s · Σ {} (L {}) µs/entry{messages}",
            self.entries_per_s(),
            us(self.us_per_entry(self.total_s())),
            us(self.us_per_entry(self.leader_cpu_s)),
        )
    }

    pub fn to_json(&self) -> Value {
        let each = |per: &dyn Fn(Option<f64>) -> f64| {
            let followers: serde_json::Map<String, Value> = self
                .followers_cpu_s
                .iter()
                .map(|(id, used)| (id.to_string(), finite(per(*used))))
                .collect();
            json!({"leader": finite(per(self.leader_cpu_s)),
                "followers": finite(per(self.followers_total_s())),
                "followersEach": followers,
                "client": finite(per(self.client_cpu_s)),
                "total": finite(per(self.total_s()))})
        };
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|node| {
                json!({"id": node.id, "cores": finite(self.cores(node.cpu_s)),
                    "cpuUsPerCycle": finite(self.us_per_cycle(node.cpu_s)),
                    "cpuUsPerShardEntry": finite(self.us_per_shard_entry(node.cpu_s)),
                    "fsyncsPerS": finite(self.node_rate(node.syncs)),
                    "peerCallsPerS": finite(self.node_rate(node.peer_calls))})
            })
            .collect();
        json!({"cpuWindowS": self.cpu_window_s, "cyclesPerS": finite(self.cycles_per_s),
            "entries": self.entries, "entriesWindowS": self.entries_window_s,
            "entriesPerS": finite(self.entries_per_s()), "clockTicksPerS": clock_ticks_per_s(),
            "cpuUsPerCycle": each(&|used| self.us_per_cycle(used)),
            "cpuUsPerEntry": each(&|used| self.us_per_entry(used)),
            "cores": each(&|used| self.cores(used)),
            "messages": self.messages, "messagesWindowS": finite(self.messages_window_s),
            "messagesPerCycle": self.messages_per_cycle(),
            "messagesSource": self.messages_source,
            "messagesViaFollowers": self.messages_via_followers,
            "followerContactGaps": self.contact_gaps.as_ref().map(ContactGaps::to_json),
            "electionsInWindow": self.elections, "nodes": nodes,
            "nodesWindowS": finite(self.nodes_window_s), "shardEntries": self.shard_entries,
            "shardEntriesPerS": finite(self.shard_entries_per_s()),
            "shardElectionsInWindow": self.shard_elections})
    }
}

/// µs per event of `cores` busy at `rate` events per second.
pub(crate) fn per(cores: f64, rate: f64) -> f64 {
    if rate > 0.0 {
        cores * 1e6 / rate
    } else {
        f64::NAN
    }
}

/// `2.00`; small values with more decimals (`0.0034`).
fn ratio(value: f64) -> String {
    if value >= 0.1 || value == 0.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.4}")
    }
}

/// `NaN` as JSON `null`.
pub(crate) fn finite(value: f64) -> Value {
    if value.is_finite() {
        json!(value)
    } else {
        Value::Null
    }
}

/// µs, with a decimal below 10.
pub(crate) fn us(value: f64) -> String {
    if !value.is_finite() {
        "n/a".into()
    } else if value < 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// The highest `term` any running node reports (0 when none answers): each
/// election begins a term, so its growth over a stretch of the run is the
/// number of elections (leader changes) in it.
pub async fn max_term(cluster: &Cluster) -> u64 {
    let mut term = 0;
    for node in cluster.nodes.iter().filter(|node| node.is_running()) {
        if let Some(status) = cluster.status(node.id).await {
            term = term.max(status["term"].as_u64().unwrap_or(0));
        }
    }
    term
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_are_read_after_the_command_name() {
        let stat = "4242 (perm itd) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 75 0 0 20 0 6 0 12345 1000000 500 18446744073709551615";
        assert_eq!(stat_ticks(stat), Some(325));
        assert!(ProcessCpu::this_process().ticks().is_some());
    }

    #[test]
    fn semaphore_calls_of_the_public_listener_are_summed() {
        let page = "# TYPE permitd_http_requests_total counter\n\
            permitd_http_requests_total{listener=\"api\",route=\"/v1/semaphores/{key}\",method=\"POST\",status=\"200\"} 120\n\
            permitd_http_requests_total{listener=\"api\",route=\"/v1/semaphores/{key}\",method=\"POST\",status=\"503\"} 3\n\
            permitd_http_requests_total{listener=\"api\",route=\"/v1/batch\",method=\"POST\",status=\"200\"} 4\n\
            permitd_http_requests_total{listener=\"api\",route=\"/cluster/status\",method=\"GET\",status=\"200\"} 9\n\
            permitd_http_requests_total{listener=\"raft\",route=\"/raft/append\",method=\"POST\",status=\"200\"} 400\n";
        assert_eq!(semaphore_calls(page), 127);
    }

    #[test]
    fn node_counters_are_fsyncs_and_raft_calls() {
        let page = "# TYPE permitd_wal_syncs_total counter\n\
            permitd_wal_syncs_total 310\n\
            permitd_wal_syncs_total_extra 9\n\
            permitd_http_requests_total{listener=\"raft\",route=\"/raft/append\",method=\"POST\",status=\"200\"} 400\n\
            permitd_http_requests_total{listener=\"raft\",route=\"/raft/vote\",method=\"POST\",status=\"200\"} 2\n\
            permitd_http_requests_total{listener=\"raft\",route=\"/cluster/restore\",method=\"POST\",status=\"200\"} 1\n\
            permitd_http_requests_total{listener=\"api\",route=\"/v1/semaphores/{key}\",method=\"POST\",status=\"200\"} 120\n";
        let counters = NodeCounters::parse(page);
        assert_eq!((counters.syncs, counters.peer_calls), (310, 402));
    }
}
