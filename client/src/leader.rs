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
//! Invariants:
//! - endpoints are normalised base URLs (no trailing slash) and never duplicated;
//! - a leader named by a header that is not yet an endpoint is added (a cluster
//!   grown after the client was configured is still reached), up to
//!   [`MAX_ENDPOINTS`].

use std::time::Duration;

use http::StatusCode;
use permitd_core::contract::Readiness;
use permitd_transport::Transport;
use tokio::time::Instant;
use url::Url;

use crate::error::ClientError;
use crate::outgoing::Outgoing;

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

/// Remembers the leader and picks the node for each attempt.
#[derive(Debug, Clone)]
pub struct LeaderTracker {
    endpoints: Vec<Endpoint>,
    /// The node id of each endpoint, once learned (from `/cluster/status`).
    node_ids: Vec<Option<u64>>,
    /// Index into `endpoints` of the node to ask first, if any.
    leader: Option<usize>,
    /// A leader id named by a header that no endpoint is known to have.
    unmapped_leader: Option<u64>,
    /// Where the round-robin over the other nodes continues.
    cursor: usize,
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
        })
    }

    /// All known endpoints.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The node asked first, if one is remembered.
    pub fn leader(&self) -> Option<&Endpoint> {
        self.leader.map(|index| &self.endpoints[index])
    }

    /// A leader id was named that no endpoint is known to have: learning the
    /// endpoints' ids (`/cluster/status`) would let calls skip the forwarding hop.
    pub fn wants_node_ids(&self) -> bool {
        self.unmapped_leader.is_some()
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
    }

    /// The node to ask next: the leader if known, else the next in turn.
    pub fn pick(&self) -> Endpoint {
        let index = self.leader.unwrap_or(self.cursor % self.endpoints.len());
        self.endpoints[index].clone()
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
}
