//! Which node to ask next: the remembered leader first, then the others in turn.
//!
//! Any node accepts any call (a follower forwards to the leader), so the leader
//! is an optimisation: asking it directly saves a hop. Every v1 answer names the
//! leader in [`permitd_core::contract::headers::LEADER`]; permitd sends the leader's node id there (a URL is
//! accepted too). An id is mapped to an endpoint once the endpoints' ids are
//! known (the client asks each node's `/cluster/status` in the background when
//! an unknown id shows up). Until then the tracker learns by trying: a node that
//! answered is asked first next time. A node that failed is skipped until the
//! others were tried.
//!
//! While no node can serve (the leader died, an election runs), a call does not
//! sleep out its backoff or the server's `Retry-After`: [`find_ready`] asks every
//! endpoint's `/readyz` at once, every [`READY_PROBE_INTERVAL_MS`], and the call
//! retries as soon as one node knows a leader. A new leader is thus found within
//! one probe interval of its election, not after a second of `Retry-After`.
//!
//! In a cluster of several shards each shard has a leader of its own. The
//! tracker then keeps two things apart: the leader it follows for calls that
//! name no key (the meta shard's, [`META_SHARD`], learned from answers of that
//! shard and from answers that name no shard, as before shards), and one
//! leader per shard ([`ShardLeaders`]), learned from each answer's leader and
//! shard headers. A call for a key asks its shard's leader first, else goes
//! where a call naming no key would. An answer that fails for a shard
//! (`not_leader`, `leader_changed`, a node unreachable) replaces that shard's
//! leader with the one the answer named, or forgets it, as it does the
//! followed leader.
//!
//! Invariants:
//! - endpoints are normalised base URLs (no trailing slash) and never duplicated;
//! - a leader named by a header that is not yet an endpoint is added (a cluster
//!   grown after the client was configured is still reached), up to
//!   [`MAX_ENDPOINTS`];
//! - at most [`permitd_core::shard::MAX_SHARDS`] shard leaders are remembered.

use std::time::Duration;

use http::StatusCode;
use permitd_core::contract::Readiness;
use permitd_transport::Transport;
use tokio::time::Instant;
use url::Url;

use crate::error::ClientError;
use crate::outgoing::Outgoing;
use crate::shard_leaders::{ShardHint, ShardLeader, ShardLeaders, META_SHARD};

/// Most endpoints one client remembers (configured plus learned).
pub const MAX_ENDPOINTS: usize = 64;

/// Pause between two rounds of readiness probes while no node is ready, in ms.
/// Each round costs one small GET per endpoint.
pub const READY_PROBE_INTERVAL_MS: u64 = 20;
/// Limit of one readiness probe, in ms: a node that takes longer is not the one
/// to retry at.
pub const READY_PROBE_TIMEOUT_MS: u64 = 250;

/// A parsed, normalised node base URL such as `http://127.0.0.1:7001`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    base: Url,
}

impl Endpoint {
    /// Parses a node URL; `127.0.0.1:7001` without a scheme means `http://`.
    pub fn parse(text: &str) -> Result<Self, ClientError> {
        let trimmed = text.trim().trim_end_matches('/');
        let invalid = |reason: String| ClientError::InvalidEndpoint {
            endpoint: text.to_string(),
            reason,
        };
        if trimmed.is_empty() {
            return Err(invalid("empty".into()));
        }
        let with_scheme = if text.contains("://") {
            trimmed.to_string()
        } else {
            format!("http://{trimmed}")
        };
        let base = Url::parse(&with_scheme).map_err(|error| invalid(error.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(invalid(format!("unsupported scheme {}", base.scheme())));
        }
        if base.cannot_be_a_base() || base.host().is_none() {
            return Err(invalid("not a base URL".into()));
        }
        if !base.username().is_empty() || base.password().is_some() {
            return Err(invalid("credentials in the URL are not supported".into()));
        }
        if base.query().is_some() || base.fragment().is_some() {
            return Err(invalid("a base URL takes no query or fragment".into()));
        }
        Ok(Self { base })
    }

    /// The base URL as text, without a trailing slash.
    pub fn as_str(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// The URL of `segments` under this base, each segment percent-encoded (a key
    /// may hold `/`, `?`, spaces or any other character).
    pub fn url<S: AsRef<str>>(&self, segments: &[S]) -> Url {
        let mut url = self.base.clone();
        {
            // `parse` rejected URLs that cannot be a base, so this cannot fail.
            let mut path = url
                .path_segments_mut()
                .expect("endpoint URLs are base URLs");
            path.pop_if_empty();
            path.extend(segments.iter().map(AsRef::as_ref));
        }
        url
    }
}

/// Parses a comma- or whitespace-separated endpoint list (the `PERMITD_ENDPOINTS`
/// form), dropping duplicates.
pub fn parse_endpoints(text: &str) -> Result<Vec<Endpoint>, ClientError> {
    let mut endpoints: Vec<Endpoint> = Vec::new();
    for part in text.split(|c: char| c == ',' || c.is_whitespace()) {
        if part.is_empty() {
            continue;
        }
        let endpoint = Endpoint::parse(part)?;
        if !endpoints.contains(&endpoint) {
            endpoints.push(endpoint);
        }
    }
    if endpoints.is_empty() {
        return Err(ClientError::NoEndpoints);
    }
    Ok(endpoints)
}

/// What a node's [`permitd_core::contract::headers::LEADER`] says: the leader's node id (what permitd
/// sends) or its API base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderHint {
    NodeId(u64),
    Url(Endpoint),
}

impl LeaderHint {
    /// Parses a header value; `None` for anything unusable.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if let Ok(id) = text.parse::<u64>() {
            return Some(Self::NodeId(id));
        }
        Endpoint::parse(text).ok().map(Self::Url)
    }
}

/// Asks every endpoint's `/readyz` at once, in rounds [`READY_PROBE_INTERVAL_MS`]
/// apart, until one answers that it knows a leader or `until` passes. Returns
/// that node and the leader it named. Probes still in flight when one answers
/// are dropped. Every probe goes through `transport`, the client's.
pub async fn find_ready(
    transport: &Transport,
    endpoints: &[Endpoint],
    until: Instant,
) -> Option<(Endpoint, Option<LeaderHint>)> {
    let interval = Duration::from_millis(READY_PROBE_INTERVAL_MS);
    while Instant::now() < until {
        let round_ends = (Instant::now() + interval).min(until);
        let mut probes = tokio::task::JoinSet::new();
        for endpoint in endpoints {
            let (transport, endpoint) = (transport.clone(), endpoint.clone());
            probes.spawn(async move {
                probe_ready(&transport, &endpoint)
                    .await
                    .map(|hint| (endpoint, hint))
            });
        }
        while let Some(joined) = probes.join_next().await {
            if let Ok(Some(ready)) = joined {
                return Some(ready);
            }
        }
        tokio::time::sleep_until(round_ends).await;
    }
    None
}

/// `Some(leader)` when `endpoint` is ready (it knows a leader), `None` otherwise.
async fn probe_ready(transport: &Transport, endpoint: &Endpoint) -> Option<Option<LeaderHint>> {
    let answer = Outgoing::get(&endpoint.url(&["readyz"]))
        .limit(Duration::from_millis(READY_PROBE_TIMEOUT_MS))
        .send(transport)
        .await
        .ok()?;
    if answer.status() != StatusCode::OK {
        return None;
    }
    let body = permitd_transport::collect(answer.into_body()).await.ok()?;
    let ready: Readiness = serde_json::from_slice(&body).ok()?;
    Some(Some(LeaderHint::NodeId(ready.leader)))
}

/// Remembers the leaders and picks the node for each attempt.
#[derive(Debug, Clone)]
pub struct LeaderTracker {
    endpoints: Vec<Endpoint>,
    /// The node id of each endpoint, once learned (from `/cluster/status`).
    node_ids: Vec<Option<u64>>,
    /// Index into `endpoints` of the node to ask first for a call naming no
    /// key, if any: the meta shard's leader.
    leader: Option<usize>,
    /// A leader id named by a header that no endpoint is known to have.
    unmapped_leader: Option<u64>,
    /// Where the round-robin over the other nodes continues.
    cursor: usize,
    /// The shard count and each shard's leader.
    shards: ShardLeaders,
    /// Some shard's leader is a node id that no endpoint is known to have.
    unmapped_shard_leader: bool,
}

impl LeaderTracker {
    /// A tracker over `endpoints` (at least one), with no leader known yet.
    pub fn new(endpoints: Vec<Endpoint>) -> Result<Self, ClientError> {
        if endpoints.is_empty() {
            return Err(ClientError::NoEndpoints);
        }
        let mut unique: Vec<Endpoint> = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            if !unique.contains(&endpoint) {
                unique.push(endpoint);
            }
        }
        unique.truncate(MAX_ENDPOINTS);
        Ok(Self {
            node_ids: vec![None; unique.len()],
            endpoints: unique,
            leader: None,
            unmapped_leader: None,
            cursor: 0,
            shards: ShardLeaders::new(),
            unmapped_shard_leader: false,
        })
    }

    /// All known endpoints.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The node asked first for a call naming no key, if one is remembered.
    pub fn leader(&self) -> Option<&Endpoint> {
        self.leader.map(|index| &self.endpoints[index])
    }

    /// The known leader of `key`'s shard, if its endpoint is known.
    pub fn leader_of_key(&self, key: &str) -> Option<&Endpoint> {
        let shard = self.shards.shard_of(key);
        let index = self
            .shards
            .leader(shard)
            .and_then(|leader| self.index_of(leader))?;
        Some(&self.endpoints[index])
    }

    /// The shard count the tracker follows (1 until an answer names another).
    pub fn shard_count(&self) -> u32 {
        self.shards.count()
    }

    /// A leader id was named that no endpoint is known to have: learning the
    /// endpoints' ids (`/cluster/status`) would let calls skip the forwarding hop.
    pub fn wants_node_ids(&self) -> bool {
        self.unmapped_leader.is_some() || self.unmapped_shard_leader
    }

    /// Records that `endpoint` is node `id`.
    pub fn learn_node_id(&mut self, endpoint: &Endpoint, id: u64) {
        let Some(index) = self.position(endpoint) else {
            return;
        };
        for (other, known) in self.node_ids.iter_mut().enumerate() {
            if other != index && *known == Some(id) {
                *known = None;
            }
        }
        self.node_ids[index] = Some(id);
        if self.unmapped_leader == Some(id) {
            self.unmapped_leader = None;
            self.leader = Some(index);
        }
        self.unmapped_shard_leader = self
            .shards
            .known()
            .any(|leader| self.index_of(leader).is_none());
    }

    /// The node to ask next for a call naming no key: the leader if known,
    /// else the next in turn.
    pub fn pick(&self) -> Endpoint {
        let index = self.leader.unwrap_or(self.cursor % self.endpoints.len());
        self.endpoints[index].clone()
    }

    /// The node to ask next for a call about `key` (none: a call naming no
    /// key): the leader of its shard if known, else as [`Self::pick`].
    pub fn pick_for(&self, key: Option<&str>) -> Endpoint {
        match key.and_then(|key| self.leader_of_key(key)) {
            Some(leader) => leader.clone(),
            None => self.pick(),
        }
    }

    /// `endpoint` answered; `hint` is its leader header, if any. A hint that
    /// cannot be mapped to an endpoint leaves the answering node first in line
    /// (it reached the leader, by itself or by forwarding).
    pub fn answered(&mut self, endpoint: &Endpoint, hint: Option<&LeaderHint>) {
        if let Some(index) = hint.and_then(|hint| self.resolve(hint)) {
            self.leader = Some(index);
            return;
        }
        self.leader = self.position(endpoint).or(self.leader);
    }

    /// [`Self::answered`] for an answer that carried shard headers (`shard`):
    /// the count is learned, and the answering shard's leader is the node
    /// `hint` names (else the node that answered). Only the meta shard's
    /// answers (or any, in a cluster of one shard) move the leader followed
    /// for calls naming no key; another shard's answer makes the node that
    /// answered that leader only while none is known.
    pub fn answered_for(
        &mut self,
        endpoint: &Endpoint,
        hint: Option<&LeaderHint>,
        shard: Option<&ShardHint>,
    ) {
        let Some(answering) = self.learn_shards(shard) else {
            return self.answered(endpoint, hint);
        };
        let leader = match hint {
            Some(hint) => self.shard_leader(hint),
            None => self.position(endpoint).map(ShardLeader::Endpoint),
        };
        if let Some(leader) = leader {
            self.shards.set(answering, leader);
        }
        if self.follows_meta(answering) {
            self.answered(endpoint, hint);
        } else if self.leader.is_none() {
            self.leader = self.position(endpoint);
        }
    }

    /// `endpoint` failed (connection error, timeout, 502/503/504). `hint` is the leader
    /// the failing node named, if it named one. The next pick moves on.
    pub fn failed(&mut self, endpoint: &Endpoint, hint: Option<&LeaderHint>) {
        let failed = self.position(endpoint);
        if let Some(index) = hint.and_then(|hint| self.resolve(hint)) {
            if Some(index) != failed {
                self.leader = Some(index);
                return;
            }
        }
        if self.leader.is_some() && self.leader == failed {
            self.leader = None;
        }
        self.cursor = match failed {
            Some(index) => index + 1,
            None => self.cursor + 1,
        } % self.endpoints.len();
    }

    /// [`Self::failed`] for a call about `key` (if it named one), whose
    /// answer carried shard headers (`shard`) if it got one. The failing
    /// shard (the one that answered, else the key's) takes the leader `hint`
    /// names, unless that is the failed node; otherwise it forgets a leader
    /// that is the failed node. A node that gave no answer at all is forgotten
    /// as every shard's leader. The leader followed for calls naming no key
    /// takes `hint` only from the meta shard.
    pub fn failed_for(
        &mut self,
        endpoint: &Endpoint,
        key: Option<&str>,
        hint: Option<&LeaderHint>,
        shard: Option<&ShardHint>,
    ) {
        let answering = self.learn_shards(shard);
        let failing = answering.or_else(|| key.map(|key| self.shards.shard_of(key)));
        let failed = self.position(endpoint);
        let is_failed = |tracker: &Self, leader: ShardLeader| {
            failed.is_some() && tracker.index_of(leader) == failed
        };
        if let Some(shard) = failing {
            match hint.and_then(|hint| self.shard_leader(hint)) {
                Some(named) if !is_failed(self, named) => self.shards.set(shard, named),
                _ => {
                    if self
                        .shards
                        .leader(shard)
                        .is_some_and(|known| is_failed(self, known))
                    {
                        self.shards.forget(shard);
                    }
                }
            }
        }
        if let (None, None, Some(failed)) = (shard, hint, failed) {
            let failed_id = self.node_ids[failed];
            self.shards.forget_where(|leader| match leader {
                ShardLeader::Endpoint(index) => index == failed,
                ShardLeader::Node(id) => failed_id == Some(id),
            });
        }
        let meta = failing.is_none_or(|shard| self.follows_meta(shard));
        self.failed(endpoint, if meta { hint } else { None });
    }

    /// Learns the count from `shard`, and returns the shard that answered when
    /// it is one of that count.
    fn learn_shards(&mut self, shard: Option<&ShardHint>) -> Option<u32> {
        let shard = shard?;
        self.shards.learn_count(shard.shards);
        shard
            .shard
            .filter(|answering| shard.shards == self.shards.count() && *answering < shard.shards)
    }

    /// Whether answers of `shard` name the leader followed for calls naming no key.
    fn follows_meta(&self, shard: u32) -> bool {
        shard == META_SHARD || self.shards.count() == 1
    }

    /// The shard leader a hint names: a URL becomes an endpoint (added if there
    /// is room), an id is kept as it is and flagged when no endpoint has it.
    fn shard_leader(&mut self, hint: &LeaderHint) -> Option<ShardLeader> {
        match hint {
            LeaderHint::NodeId(id) => {
                let leader = ShardLeader::Node(*id);
                if self.index_of(leader).is_none() {
                    self.unmapped_shard_leader = true;
                }
                Some(leader)
            }
            LeaderHint::Url(_) => self.resolve(hint).map(ShardLeader::Endpoint),
        }
    }

    /// The endpoint a shard leader is, if known.
    fn index_of(&self, leader: ShardLeader) -> Option<usize> {
        match leader {
            ShardLeader::Endpoint(index) => Some(index),
            ShardLeader::Node(id) => self.node_ids.iter().position(|known| *known == Some(id)),
        }
    }

    fn position(&self, endpoint: &Endpoint) -> Option<usize> {
        self.endpoints.iter().position(|known| known == endpoint)
    }

    /// The endpoint a hint names, adding a new URL if there is room.
    fn resolve(&mut self, hint: &LeaderHint) -> Option<usize> {
        match hint {
            LeaderHint::NodeId(id) => {
                let found = self.node_ids.iter().position(|known| *known == Some(*id));
                self.unmapped_leader = if found.is_none() { Some(*id) } else { None };
                found
            }
            LeaderHint::Url(url) => {
                if let Some(index) = self.position(url) {
                    return Some(index);
                }
                if self.endpoints.len() >= MAX_ENDPOINTS {
                    return None;
                }
                self.endpoints.push(url.clone());
                self.node_ids.push(None);
                Some(self.endpoints.len() - 1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(urls: &[&str]) -> LeaderTracker {
        LeaderTracker::new(
            urls.iter()
                .map(|url| Endpoint::parse(url).unwrap())
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn endpoints_are_normalised() {
        assert_eq!(
            Endpoint::parse("127.0.0.1:7001").unwrap().as_str(),
            "http://127.0.0.1:7001"
        );
        assert_eq!(
            Endpoint::parse("https://a.example/").unwrap().as_str(),
            "https://a.example"
        );
        assert_eq!(
            Endpoint::parse("http://h:1/prefix/").unwrap().as_str(),
            "http://h:1/prefix"
        );
        for bad in ["", "ftp://h", "http://", "http://h/?q=1", "mailto:x@y"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn urls_encode_each_segment() {
        let endpoint = Endpoint::parse("http://h:1").unwrap();
        assert_eq!(
            endpoint
                .url(&["v1", "semaphores", "acct/1 ?#%", "usage"])
                .as_str(),
            "http://h:1/v1/semaphores/acct%2F1%20%3F%23%25/usage"
        );
        let prefixed = Endpoint::parse("http://h:1/api/").unwrap();
        assert_eq!(
            prefixed.url(&["v1", "semaphores"]).as_str(),
            "http://h:1/api/v1/semaphores"
        );
        assert_eq!(
            endpoint.url(&["cluster", "status"]).as_str(),
            "http://h:1/cluster/status"
        );
    }

    #[test]
    fn endpoint_lists_split_on_commas_and_spaces_and_drop_duplicates() {
        let list = parse_endpoints("http://a:1, b:2 http://a:1/,").unwrap();
        let texts: Vec<&str> = list.iter().map(Endpoint::as_str).collect();
        assert_eq!(texts, ["http://a:1", "http://b:2"]);
        assert!(matches!(
            parse_endpoints(" , "),
            Err(ClientError::NoEndpoints)
        ));
    }

    fn url(text: &str) -> LeaderHint {
        LeaderHint::parse(text).unwrap()
    }

    #[test]
    fn hints_parse_as_node_ids_or_urls() {
        assert_eq!(LeaderHint::parse(" 2 "), Some(LeaderHint::NodeId(2)));
        assert_eq!(
            LeaderHint::parse("http://b:2/"),
            Some(LeaderHint::Url(Endpoint::parse("http://b:2").unwrap()))
        );
        assert_eq!(LeaderHint::parse("ftp://x"), None);
    }

    #[test]
    fn url_hint_names_the_leader_and_an_unknown_leader_is_added() {
        let mut tracker = tracker(&["http://a:1", "http://b:2"]);
        assert_eq!(tracker.pick().as_str(), "http://a:1");
        let a = tracker.pick();
        tracker.answered(&a, Some(&url("http://b:2/")));
        assert_eq!(tracker.pick().as_str(), "http://b:2");
        tracker.answered(&a, Some(&url("http://c:3")));
        assert_eq!(tracker.leader().unwrap().as_str(), "http://c:3");
        assert_eq!(tracker.endpoints().len(), 3);
    }

    #[test]
    fn node_id_hints_map_once_ids_are_learned() {
        let mut tracker = tracker(&["http://a:1", "http://b:2", "http://c:3"]);
        let a = Endpoint::parse("http://a:1").unwrap();
        let c = Endpoint::parse("http://c:3").unwrap();
        // Unknown id: the answering node stays first in line, and ids are wanted.
        tracker.answered(&a, Some(&LeaderHint::NodeId(3)));
        assert_eq!(tracker.pick(), a);
        assert!(tracker.wants_node_ids());
        tracker.learn_node_id(&a, 1);
        tracker.learn_node_id(&c, 3);
        assert!(!tracker.wants_node_ids());
        assert_eq!(tracker.pick(), c);
        // A later answer naming node 1 moves there directly.
        tracker.answered(&c, Some(&LeaderHint::NodeId(1)));
        assert_eq!(tracker.pick(), a);
    }

    #[test]
    fn an_answer_without_header_makes_the_node_the_leader() {
        let mut tracker = tracker(&["http://a:1", "http://b:2"]);
        let b = Endpoint::parse("http://b:2").unwrap();
        tracker.answered(&b, None);
        assert_eq!(tracker.pick(), b);
    }

    #[test]
    fn failures_rotate_and_forget_a_failed_leader() {
        let mut tracker = tracker(&["http://a:1", "http://b:2", "http://c:3"]);
        let b = Endpoint::parse("http://b:2").unwrap();
        tracker.answered(&b, None);
        tracker.failed(&b, None);
        assert!(tracker.leader().is_none());
        assert_eq!(tracker.pick().as_str(), "http://c:3");
        let c = tracker.pick();
        tracker.failed(&c, None);
        assert_eq!(tracker.pick().as_str(), "http://a:1");
    }

    #[test]
    fn a_failing_node_naming_another_leader_redirects() {
        let mut tracker = tracker(&["http://a:1", "http://b:2"]);
        let a = tracker.pick();
        let b = Endpoint::parse("http://b:2").unwrap();
        tracker.learn_node_id(&b, 2);
        tracker.failed(&a, Some(&LeaderHint::NodeId(2)));
        assert_eq!(tracker.pick(), b);
        // A node naming itself while failing is not believed.
        tracker.failed(&b, Some(&LeaderHint::NodeId(2)));
        assert!(tracker.leader().is_none());
        assert_eq!(tracker.pick(), a);
    }

    /// A tracker over nodes 1, 2 and 3 at `http://n1:1`… with their ids known,
    /// and a key of each of 3 shards.
    fn three_nodes() -> (LeaderTracker, [Endpoint; 3], [String; 3]) {
        let mut tracker = tracker(&["http://n1:1", "http://n2:2", "http://n3:3"]);
        let nodes = [1, 2, 3].map(|id| Endpoint::parse(&format!("http://n{id}:{id}")).unwrap());
        for (id, node) in (1..).zip(&nodes) {
            tracker.learn_node_id(node, id);
        }
        let keys = [0, 1, 2].map(|shard| {
            (0..)
                .map(|n| format!("key-{n}"))
                .find(|key| permitd_core::shard::shard_of(key, 3) == Ok(shard))
                .unwrap()
        });
        (tracker, nodes, keys)
    }

    fn of(shard: u32, shards: u32) -> ShardHint {
        ShardHint {
            shard: Some(shard),
            shards,
        }
    }

    #[test]
    fn each_shard_is_asked_at_its_own_leader() {
        let (mut tracker, [n1, n2, n3], [k0, k1, k2]) = three_nodes();
        assert_eq!(tracker.shard_count(), 1);
        // Node 1 answers for shard 1, naming node 2; shard 2's answer names node 3.
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(2)), Some(&of(1, 3)));
        tracker.answered_for(&n3, Some(&LeaderHint::NodeId(3)), Some(&of(2, 3)));
        assert_eq!(tracker.shard_count(), 3);
        assert_eq!(tracker.pick_for(Some(&k1)), n2);
        assert_eq!(tracker.pick_for(Some(&k2)), n3);
        // Shard 0's leader is unknown: its key goes where a keyless call goes,
        // the first node that answered.
        assert_eq!(tracker.leader(), Some(&n1));
        assert_eq!(tracker.pick_for(Some(&k0)), n1);
        // Shard 0 is the meta shard: its leader is the one keyless calls follow.
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(3)), Some(&of(0, 3)));
        assert_eq!(tracker.pick(), n3);
        assert_eq!(tracker.pick_for(None), n3);
        assert_eq!(tracker.pick_for(Some(&k0)), n3);
        // Other shards' answers do not move it.
        tracker.answered_for(&n2, Some(&LeaderHint::NodeId(2)), Some(&of(1, 3)));
        assert_eq!(tracker.pick(), n3);
        assert_eq!(tracker.pick_for(Some(&k1)), n2);
        assert_eq!(tracker.leader_of_key(&k2), Some(&n3));
    }

    #[test]
    fn answers_of_one_shard_clusters_follow_one_leader() {
        let (mut tracker, [_, n2, n3], [k0, k1, _]) = three_nodes();
        tracker.answered_for(&n3, Some(&LeaderHint::NodeId(2)), Some(&of(0, 1)));
        assert_eq!(tracker.shard_count(), 1);
        assert_eq!(tracker.pick(), n2);
        assert_eq!(tracker.pick_for(Some(&k0)), n2);
        assert_eq!(tracker.pick_for(Some(&k1)), n2);
        // An answer with no shard headers (a node routing without shards) works as before.
        tracker.answered_for(&n3, Some(&LeaderHint::NodeId(3)), None);
        assert_eq!(tracker.pick(), n3);
    }

    #[test]
    fn an_answer_covering_every_shard_teaches_the_count_only() {
        let (mut tracker, [_, n2, _], [_, k1, _]) = three_nodes();
        let every = ShardHint {
            shard: None,
            shards: 3,
        };
        tracker.answered_for(&n2, None, Some(&every));
        assert_eq!(tracker.shard_count(), 3);
        assert_eq!(tracker.leader_of_key(&k1), None);
        // As before shards: the node that answered is asked first.
        assert_eq!(tracker.pick(), n2);
        assert_eq!(tracker.pick_for(Some(&k1)), n2);
    }

    #[test]
    fn a_new_count_forgets_the_shard_leaders_and_a_huge_one_is_ignored() {
        let (mut tracker, [n1, n2, _], [_, k1, _]) = three_nodes();
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(2)), Some(&of(1, 3)));
        assert_eq!(tracker.leader_of_key(&k1), Some(&n2));
        let huge = permitd_core::shard::MAX_SHARDS + 1;
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(1)), Some(&of(7, huge)));
        assert_eq!(tracker.shard_count(), 3);
        assert_eq!(tracker.leader_of_key(&k1), Some(&n2));
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(1)), Some(&of(0, 4)));
        assert_eq!(tracker.shard_count(), 4);
        let shard = permitd_core::shard::shard_of(&k1, 4).unwrap();
        assert_eq!(tracker.leader_of_key(&k1).is_some(), shard == 0);
    }

    #[test]
    fn a_shard_leader_named_by_an_unknown_id_waits_for_discovery() {
        let mut tracker = tracker(&["http://n1:1", "http://n2:2"]);
        let (n1, n2) = (
            Endpoint::parse("http://n1:1").unwrap(),
            Endpoint::parse("http://n2:2").unwrap(),
        );
        let key = (0..)
            .map(|n| format!("k{n}"))
            .find(|key| permitd_core::shard::shard_of(key, 2) == Ok(1))
            .unwrap();
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(2)), Some(&of(1, 2)));
        assert!(tracker.wants_node_ids());
        assert_eq!(tracker.leader_of_key(&key), None);
        assert_eq!(tracker.pick_for(Some(&key)), n1);
        tracker.learn_node_id(&n1, 1);
        assert!(tracker.wants_node_ids(), "node 2 is still unknown");
        tracker.learn_node_id(&n2, 2);
        assert!(!tracker.wants_node_ids());
        assert_eq!(tracker.pick_for(Some(&key)), n2);
        // The keyless leader was never node 2: shard 1 is not the meta shard.
        assert_eq!(tracker.pick(), n1);
    }

    #[test]
    fn a_failing_shard_takes_the_leader_it_names_or_forgets_its_own() {
        let (mut tracker, [n1, n2, n3], [k0, k1, k2]) = three_nodes();
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(1)), Some(&of(0, 3)));
        tracker.answered_for(&n2, Some(&LeaderHint::NodeId(2)), Some(&of(1, 3)));
        tracker.answered_for(&n3, Some(&LeaderHint::NodeId(3)), Some(&of(2, 3)));
        // Node 2 no longer leads shard 1 and names node 3 (not_leader).
        tracker.failed_for(
            &n2,
            Some(&k1),
            Some(&LeaderHint::NodeId(3)),
            Some(&of(1, 3)),
        );
        assert_eq!(tracker.pick_for(Some(&k1)), n3);
        assert_eq!(tracker.pick(), n1, "the meta shard's leader stays");
        // Node 3 fails shard 2 naming itself (leader_changed): forgotten, and
        // the key goes where keyless calls go.
        tracker.failed_for(
            &n3,
            Some(&k2),
            Some(&LeaderHint::NodeId(3)),
            Some(&of(2, 3)),
        );
        assert_eq!(tracker.leader_of_key(&k2), None);
        assert_eq!(tracker.pick_for(Some(&k2)), n1);
        assert_eq!(tracker.pick_for(Some(&k1)), n3, "shard 1 is another shard");
        // A failure of the meta shard naming node 2 moves the keyless leader.
        tracker.failed_for(
            &n1,
            Some(&k0),
            Some(&LeaderHint::NodeId(2)),
            Some(&of(0, 3)),
        );
        assert_eq!(tracker.pick(), n2);
        assert_eq!(tracker.pick_for(Some(&k0)), n2);
    }

    #[test]
    fn an_unreachable_node_is_forgotten_as_every_shards_leader() {
        let (mut tracker, [n1, n2, _], [k0, k1, k2]) = three_nodes();
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(1)), Some(&of(0, 3)));
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(2)), Some(&of(1, 3)));
        tracker.answered_for(&n1, Some(&LeaderHint::NodeId(2)), Some(&of(2, 3)));
        // No answer from node 2 while calling for shard 1's key.
        tracker.failed_for(&n2, Some(&k1), None, None);
        assert_eq!(tracker.leader_of_key(&k1), None);
        assert_eq!(tracker.leader_of_key(&k2), None);
        assert_eq!(tracker.leader_of_key(&k0), Some(&n1));
        assert_eq!(tracker.pick_for(Some(&k2)), n1);
        // The keyless leader failing moves every fallback on, as before shards.
        tracker.failed_for(&n1, Some(&k0), None, None);
        assert!(tracker.leader().is_none());
        assert_eq!(tracker.pick_for(Some(&k0)), n2);
    }
}
