//! Power-loss checks: a workload that writes down every answer the cluster gave
//! with 200, and the checks that each of them still holds after power cuts.
//!
//! The nodes' data dirs sit on `powerfs` mounts ([`crate::disks`]), which lose
//! every write, create, rename and unlink not yet made durable by an `fsync`
//! when the test cuts the power. What a client was told with 200 must survive
//! that, on any node that then leads:
//! - a grant: the same `requestId` sent again gets the same answer byte for
//!   byte, and the key's holders still list the grant with its fence;
//! - a key configuration: the limit read back is the last one acknowledged,
//!   or one sent later;
//! - an API token: it still authenticates.
//!
//! And across the whole run: no term had two leaders (each node logs a line
//! per term it leads), and each stopped node's applied state is a replay of
//! its own log ([`permitd_storage::audit`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use permitd_client::client::now_ms;
use serde_json::{json, Value};

use crate::{eventually, granted, request, Cluster};

/// Keys the writers spread their grants over: a key remembers at most 1,024
/// answers, and each writer's request names a client of its own.
pub const KEYS: usize = 16;
/// Grants a writer asks for per key at most (under the 1,024 answers a key keeps).
const GRANTS_PER_WRITER_AND_KEY: u64 = 200;
/// The key whose configuration the config writer keeps changing.
pub const CONFIG_KEY: &str = "pl-config";
/// How long a check may wait for the cluster to serve again.
pub const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// Requests in flight while the checks replay the acknowledged ones.
const REPLAY_CONCURRENCY: usize = 8;

/// The `[defaults]` of a power-loss cluster: grants are never claimed by the
/// workload, so their claim deadline is far beyond any run.
pub const DEFAULTS: &str =
    "limit = 1000000\nroundWaitMs = 5\nroundPeriodMs = 5\ngrantTimeoutMs = 3600000\n";

pub fn key(index: usize) -> String {
    format!("pl-key-{index}")
}

/// One answer the cluster gave with 200 to a request that got a grant.
#[derive(Debug, Clone)]
pub struct AckedGrant {
    pub key: String,
    pub request: Value,
    pub answer: Value,
}

/// Everything the cluster acknowledged, written down as the answers arrive.
#[derive(Debug, Default)]
pub struct Ledger {
    pub grants: Mutex<Vec<AckedGrant>>,
    /// The last limit of [`CONFIG_KEY`] answered with 200.
    pub config_acked: AtomicU64,
    /// Token secrets answered with 201.
    pub tokens: Mutex<Vec<String>>,
    /// Answers other than 200 (expected while nodes are down).
    pub refused: AtomicU64,
}

/// Writers that keep asking for grants, changing one key's limit and creating
/// tokens until [`Workload::stop`].
#[derive(Debug)]
pub struct Workload {
    pub ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Workload {
    /// Starts `writers` grant writers, one config writer and one token writer.
    pub fn start(cluster: &Cluster, writers: usize) -> Self {
        let ledger = Arc::new(Ledger::default());
        let stop = Arc::new(AtomicBool::new(false));
        let endpoints: Vec<String> = cluster.nodes.iter().map(|node| node.url()).collect();
        let mut tasks = Vec::new();
        for writer in 0..writers {
            let (http, endpoints) = (cluster.http.clone(), endpoints.clone());
            let (ledger, stop) = (ledger.clone(), stop.clone());
            tasks.push(tokio::spawn(grant_writer(
                writer, http, endpoints, ledger, stop,
            )));
        }
        let (http, ledger2, stop2) = (cluster.http.clone(), ledger.clone(), stop.clone());
        tasks.push(tokio::spawn(config_writer(
            http,
            endpoints.clone(),
            ledger2,
            stop2,
        )));
        let (http, ledger2, stop2) = (cluster.http.clone(), ledger.clone(), stop.clone());
        tasks.push(tokio::spawn(token_writer(http, endpoints, ledger2, stop2)));
        Self {
            ledger,
            stop,
            tasks,
        }
    }

    /// Grants acknowledged so far.
    pub fn acked(&self) -> usize {
        self.ledger.grants.lock().unwrap().len()
    }

    /// Waits until `more` grants past the current count were acknowledged.
    pub async fn wait_for_more(&self, more: usize) -> bool {
        let target = self.acked() + more;
        eventually(RECOVERY_TIMEOUT, || async { self.acked() >= target }).await
    }

    pub async fn stop(self) -> Arc<Ledger> {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            let _ = task.await;
        }
        self.ledger
    }
}

async fn post(http: &reqwest::Client, url: String, body: &Value) -> Option<(u16, Value)> {
    let answer = http
        .post(url)
        .json(body)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    let status = answer.status().as_u16();
    Some((status, answer.json().await.unwrap_or(Value::Null)))
}

async fn grant_writer(
    writer: usize,
    http: reqwest::Client,
    endpoints: Vec<String>,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
) {
    let mut sent = 0u64;
    while !stop.load(Ordering::SeqCst) && sent < GRANTS_PER_WRITER_AND_KEY * KEYS as u64 {
        let key = key(sent as usize % KEYS);
        let client = format!("w{writer}-{sent}");
        let mut body = request(&client, &[("g", 1, now_ms())]);
        body["requestId"] = json!(format!("r{writer}-{sent}"));
        let url = format!(
            "{}/v1/semaphores/{key}",
            endpoints[(writer + sent as usize) % endpoints.len()]
        );
        sent += 1;
        match post(&http, url, &body).await {
            Some((200, answer)) if granted(&answer) > 0 => {
                ledger.grants.lock().unwrap().push(AckedGrant {
                    key,
                    request: body,
                    answer,
                });
            }
            _ => {
                ledger.refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

async fn config_writer(
    http: reqwest::Client,
    endpoints: Vec<String>,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
) {
    let mut limit = 1u64;
    while !stop.load(Ordering::SeqCst) {
        let url = format!(
            "{}/v1/semaphores/{CONFIG_KEY}/config",
            endpoints[limit as usize % endpoints.len()]
        );
        let answer = http
            .put(url)
            .json(&json!({ "limit": limit }))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if matches!(&answer, Ok(answer) if answer.status().as_u16() == 200) {
            ledger.config_acked.store(limit, Ordering::SeqCst);
            limit += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tokens the token writer creates at most (the cluster holds 1,000).
const MAX_TOKENS: usize = 200;

async fn token_writer(
    http: reqwest::Client,
    endpoints: Vec<String>,
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
) {
    let mut sent = 0usize;
    while !stop.load(Ordering::SeqCst) && sent < MAX_TOKENS {
        let url = format!("{}/v1/tokens", endpoints[sent % endpoints.len()]);
        let body = json!({"name": format!("pl-reader-{sent}"), "role": "reader"});
        sent += 1;
        if let Some((201, answer)) = post(&http, url, &body).await {
            if let Some(secret) = answer["token"].as_str() {
                ledger.tokens.lock().unwrap().push(secret.to_owned());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks every acknowledged answer against the cluster's leader; returns the
/// violations (empty: everything the cluster acknowledged still holds).
pub async fn check_ledger(cluster: &Cluster, ledger: &Ledger) -> Vec<String> {
    let leader = cluster.wait_for_leader().await;
    // Every shard led again (its preferred leader back), not only the meta
    // shard: a replay must not meet a shard that is still electing.
    cluster.wait_spread().await;
    let url = cluster.node(leader).url();
    let mut violations = check_grants(cluster, &url, ledger).await;
    violations.extend(check_config(cluster, &url, ledger).await);
    violations.extend(check_tokens(cluster, &url, ledger).await);
    violations
}

async fn check_grants(cluster: &Cluster, url: &str, ledger: &Ledger) -> Vec<String> {
    let grants = ledger.grants.lock().unwrap().clone();
    let mut violations = Vec::new();
    for chunk in grants.chunks(REPLAY_CONCURRENCY) {
        let mut replays = tokio::task::JoinSet::new();
        for acked in chunk.iter().cloned() {
            let (http, url) = (
                cluster.http.clone(),
                format!("{url}/v1/semaphores/{}", acked.key),
            );
            replays.spawn(async move {
                let replayed = post(&http, url, &acked.request).await;
                (acked, replayed)
            });
        }
        while let Some(Ok((acked, replayed))) = replays.join_next().await {
            match replayed {
                Some((200, answer)) if answer == acked.answer => {}
                other => violations.push(format!(
                    "{} {}: acknowledged {}, a replay now answers {other:?}",
                    acked.key, acked.request["requestId"], acked.answer
                )),
            }
        }
    }
    violations.extend(check_holders(cluster, url, &grants).await);
    violations
}

/// Every acknowledged grant is still held, with its fence.
async fn check_holders(cluster: &Cluster, url: &str, grants: &[AckedGrant]) -> Vec<String> {
    let mut by_key: BTreeMap<&str, Vec<&AckedGrant>> = BTreeMap::new();
    for acked in grants {
        by_key.entry(&acked.key).or_default().push(acked);
    }
    let mut violations = Vec::new();
    for (key, acked) in by_key {
        let holders = get(cluster, &format!("{url}/v1/semaphores/{key}/holders")).await;
        let held: BTreeSet<(String, String, u64)> = holders["clients"]
            .as_object()
            .into_iter()
            .flatten()
            .flat_map(|(client, held)| {
                held["grants"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|grant| {
                        (
                            client.clone(),
                            grant["grantId"].as_str().unwrap_or("").to_owned(),
                            grant["fence"].as_u64().unwrap_or(0),
                        )
                    })
            })
            .collect();
        for acked in acked {
            let client = acked.request["clientId"].as_str().unwrap_or("");
            for grant in acked.answer["grants"].as_array().into_iter().flatten() {
                let wanted = (
                    client.to_owned(),
                    grant["grantId"].as_str().unwrap_or("").to_owned(),
                    grant["fence"].as_u64().unwrap_or(0),
                );
                if !held.contains(&wanted) {
                    violations.push(format!("{key}: acknowledged grant {wanted:?} is not held"));
                }
            }
        }
    }
    violations
}

async fn check_config(cluster: &Cluster, url: &str, ledger: &Ledger) -> Vec<String> {
    let acked = ledger.config_acked.load(Ordering::SeqCst);
    if acked == 0 {
        return Vec::new();
    }
    let config = get(cluster, &format!("{url}/v1/semaphores/{CONFIG_KEY}/config")).await;
    match config["limit"].as_u64() {
        // A limit sent after the last acknowledged one may have committed too.
        Some(limit) if limit >= acked => Vec::new(),
        other => vec![format!(
            "{CONFIG_KEY}: limit {acked} was acknowledged, the config now says {other:?}"
        )],
    }
}

async fn check_tokens(cluster: &Cluster, url: &str, ledger: &Ledger) -> Vec<String> {
    let tokens = ledger.tokens.lock().unwrap().clone();
    let mut violations = Vec::new();
    for token in tokens {
        let answer = cluster
            .bare_http
            .get(format!("{url}/v1/semaphores/{CONFIG_KEY}/usage"))
            .bearer_auth(&token)
            .send()
            .await;
        let status = answer.map_or(0, |answer| answer.status().as_u16());
        if status != 200 {
            violations.push(format!("an acknowledged token now gets {status}"));
        }
    }
    violations
}

async fn get(cluster: &Cluster, url: &str) -> Value {
    match cluster.http.get(url).send().await {
        Ok(answer) => answer.json().await.unwrap_or(Value::Null),
        Err(error) => json!({ "transport": error.to_string() }),
    }
}

/// Terms of a shard in which more than one node logged that it leads, from
/// the node logs in `dir` (`node-N.log`). Each shard is a Raft group with
/// terms of its own.
pub fn terms_with_two_leaders(dir: &std::path::Path, nodes: &[u64]) -> Vec<String> {
    let mut leaders: BTreeMap<(u64, u64), BTreeSet<u64>> = BTreeMap::new();
    for id in nodes {
        let text = std::fs::read_to_string(dir.join(format!("node-{id}.log"))).unwrap_or_default();
        for line in text
            .lines()
            .filter(|line| line.contains("this node leads the cluster"))
        {
            if let Some(term) = term_of(line) {
                let shard = field_of(line, "shard=").unwrap_or(0);
                leaders.entry((shard, term)).or_default().insert(*id);
            }
        }
    }
    leaders
        .into_iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .map(|((shard, term), nodes)| format!("shard {shard} term {term} had leaders {nodes:?}"))
        .collect()
}

fn term_of(line: &str) -> Option<u64> {
    field_of(line, "term=")
}

/// The number after the last `name` (`term=`, `shard=`) of a log line.
fn field_of(line: &str, name: &str) -> Option<u64> {
    let line = strip_ansi(line);
    let rest = &line[line.rfind(name)? + name.len()..];
    let digits: String = rest
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// `text` without the terminal colour codes (`ESC [ … m`) node logs carry.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Waits until every running node applied at least what the leader had
/// committed when the wait began.
pub async fn wait_caught_up(cluster: &Cluster) -> bool {
    let leader = cluster.wait_for_leader().await;
    let Some(status) = cluster.status(leader).await else {
        return false;
    };
    let target = status["lastApplied"].as_u64().unwrap_or(0);
    let running: Vec<u64> = cluster
        .nodes
        .iter()
        .filter(|node| node.is_running())
        .map(|node| node.id)
        .collect();
    eventually(RECOVERY_TIMEOUT, || async {
        for id in &running {
            let applied = cluster
                .status(*id)
                .await
                .and_then(|status| status["lastApplied"].as_u64())
                .unwrap_or(0);
            if applied < target {
                return false;
            }
        }
        true
    })
    .await
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_term_is_read_from_a_coloured_log_line() {
        let line = "\u{1b}[2m2026\u{1b}[0m INFO permitd_node::leader::leadership: this node leads the cluster \u{1b}[3mterm\u{1b}[0m\u{1b}[2m=\u{1b}[0m17";
        assert_eq!(super::term_of(line), Some(17));
        assert_eq!(
            super::term_of("this node leads the cluster term=3"),
            Some(3)
        );
        let sharded = "this node leads the cluster term=3 shard=12";
        assert_eq!(super::term_of(sharded), Some(3));
        assert_eq!(super::field_of(sharded, "shard="), Some(12));
    }
}
