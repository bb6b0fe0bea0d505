//! Outbound Raft RPCs: openraft's `RaftNetworkFactory` over one
//! [`Transport`]: in production a pooled HTTP client ([`client`]), in the
//! simulator its simulated network.
//!
//! Error mapping follows openraft's examples: a peer we cannot connect to is
//! `Unreachable` (openraft backs off), any other transport failure (a timeout
//! included) is a `NetworkError`, and an error the peer's Raft answered is a
//! `RemoteError`.
//!
//! Appends that carry entries get a deadline that fits their size. openraft 0.9
//! gives every AppendEntries call one heartbeat interval (40 ms by default) and
//! then sends it again; a round entry of a few MiB takes longer than that to
//! send, decode and flush on a busy node, so it was cut off and resent forever
//! while the followers heard nothing and elected a new leader. Here the send
//! runs in its own task under `rpc_timeout + bytes / APPEND_BYTES_PER_MS`; when
//! openraft gives up waiting and asks again for the same entries (same vote,
//! same previous log id), the call joins the send under way instead of starting
//! another, and answers for the entries both cover. Heartbeats (no entries) are
//! sent apart, so followers keep hearing from the leader meanwhile.
//! openraft records such an answer at the later call's time; 0.9 uses that
//! time for metrics only, and linearizable reads send their own heartbeats on
//! fresh connections, which never join a send.
//!
//! An append whose body would pass [`MAX_APPEND_BYTES`] is not sent: openraft
//! is answered `PayloadTooLarge` with a hint of how many entries fit, and sends
//! fewer (one entry always goes: a round entry is far smaller than the peer's
//! body limit).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, Request, StatusCode};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::LogId;
use permitd_core::contract::headers;
use permitd_storage::{codec, NodeId, PeerNode, ShardId, TypeConfig};
use permitd_transport::{Deadline, Transport, TransportError};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::commit_ride::{self, CommitRide, COMMIT_NOTICES_HELD};
use super::early_appends::{
    lock, AppendInFlight, AppendResult, AppendSender, EarlyAppends, Follower, EARLY_ENTRIES_MAX,
};
use super::heartbeats::Heartbeats;
use super::peer_logs::{PeerLogs, RUNS_FOUND_HELD};
use super::wire::SnapshotChunk;
use super::{bearer, SECRET_HEADER};
use crate::credentials::Secret;
use crate::seams::Seams;

/// Largest AppendEntries body sent at once, in bytes; longer runs of entries are
/// split (well under the peers' `/raft/*` body limit).
pub const MAX_APPEND_BYTES: usize = 8 * 1024 * 1024;
/// Bytes per millisecond an append is granted on top of the RPC timeout (a
/// deliberately slow 1 MB/s: loopback on a loaded machine, with the peer's
/// decode, flush and the applies it waits behind): 4 MiB of entries get
/// `rpc_timeout_ms` + 4 s.
pub const APPEND_BYTES_PER_MS: usize = 1024;

/// The deadline of an append of `bytes`.
pub fn append_timeout(rpc_timeout: Duration, bytes: usize) -> Duration {
    let extra_ms = (bytes / APPEND_BYTES_PER_MS) as u64;
    rpc_timeout + Duration::from_millis(extra_ms)
}

/// Creates connections to peers; they share one transport, hence (in
/// production) one connection pool.
#[derive(Debug, Clone)]
pub struct Network {
    transport: Transport,
    /// This node, named in [`headers::SENDER`].
    id: NodeId,
    secret: Secret,
    rpc_timeout: Duration,
    /// How long openraft waits before calling a peer that refused a connection
    /// again ([`Connection::backoff`]).
    retry_unreachable: Duration,
    /// `http` or `https`.
    scheme: &'static str,
    /// Where each peer's log ends, as its vote answers said.
    peer_logs: PeerLogs,
    /// Where a large append is encoded ([`Seams::blocking`]).
    seams: Seams,
    /// The Raft group whose RPCs this network carries: named in the query of
    /// every call (`?shard=k`; none for shard 0, so a one-shard cluster's
    /// calls are what they always were).
    shard: ShardId,
    /// Every shard's heartbeats to a peer, coalesced (`heartbeats.rs`); none
    /// in a cluster of one shard.
    heartbeats: Option<Arc<Heartbeats>>,
    /// This shard's followers, for appends sent before the leader's own
    /// sync (`early_appends.rs`).
    early: Arc<EarlyAppends>,
}

impl Network {
    /// Calls peers at `scheme://raft_addr` through `transport`. A peer that
    /// refused a connection is called again after `retry_unreachable`.
    pub fn new(
        id: NodeId,
        secret: Secret,
        (rpc_timeout, retry_unreachable): (Duration, Duration),
        scheme: &'static str,
        transport: Transport,
    ) -> Self {
        Self {
            transport,
            id,
            secret,
            rpc_timeout,
            retry_unreachable,
            scheme,
            peer_logs: PeerLogs::default(),
            seams: Seams::production(),
            shard: 0,
            heartbeats: None,
            early: EarlyAppends::new(id),
        }
    }

    /// This network, sending the heartbeats of `shards` shards coalesced per
    /// peer when there is more than one ([`Heartbeats`]).
    pub fn with_shards(mut self, shards: u32, heartbeat: Duration) -> Self {
        self.heartbeats = (shards > 1).then(|| Heartbeats::new(heartbeat));
        self
    }

    /// This network for calls of no shard (`/raft/heartbeats`).
    fn unsharded(&self) -> Self {
        Self {
            shard: 0,
            ..self.clone()
        }
    }

    /// This network for `shard`'s group: same transport (one connection
    /// pool per peer for every shard), its own record of the peers' logs.
    pub fn for_shard(&self, shard: ShardId) -> Self {
        Self {
            shard,
            peer_logs: PeerLogs::default(),
            early: EarlyAppends::new(self.id),
            ..self.clone()
        }
    }

    /// What this shard's log store tells of each append, so that new entries
    /// leave for idle followers before this node's sync (`early_appends.rs`).
    pub fn early_appends(&self) -> Arc<EarlyAppends> {
        Arc::clone(&self.early)
    }

    /// This network, encoding large appends as `seams` say (inline in the
    /// simulator).
    pub fn with_seams(mut self, seams: Seams) -> Self {
        self.seams = seams;
        self
    }
}

/// The production client of Raft RPC. With `tls`, peers are called over HTTPS,
/// verified against the cluster CA, with this node's certificate as client
/// certificate; `source_ip` is the local address of its connections
/// (`peer_source_ip`). A connection attempt gets `rpc_timeout`; each call sets
/// its own deadline.
pub fn client(
    rpc_timeout: Duration,
    tls: Option<&crate::credentials::tls::Tls>,
    source_ip: Option<std::net::IpAddr>,
) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(rpc_timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .local_address(source_ip)
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        builder = tls.client(builder)?;
    }
    builder.build()
}

impl Network {
    /// Calls a peer's `/raft/{path}` outside openraft (the election guard's
    /// pre-vote), with the same secret, TLS and codec as openraft's calls.
    pub async fn call<Resp: DeserializeOwned>(
        &self,
        target: NodeId,
        target_node: &PeerNode,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> RpcResult<Resp, openraft::error::Infallible> {
        post(self, target, target_node, path, body, timeout).await
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &PeerNode) -> Connection {
        Connection {
            follower: Follower::new(Arc::new(self.clone()), target, node.clone()),
            network: self.clone(),
            target,
            target_node: node.clone(),
            append: None,
            commit_sent: None,
            ride: CommitRide::default(),
        }
    }
}

/// The peer's answer to entries up to `sent`, as an answer to entries up to
/// `asked` (same vote and previous log id).
fn cover(
    answer: AppendEntriesResponse<NodeId>,
    sent: LogId<NodeId>,
    asked: LogId<NodeId>,
) -> AppendEntriesResponse<NodeId> {
    let matching = match answer {
        AppendEntriesResponse::Success => Some(sent),
        AppendEntriesResponse::PartialSuccess(matching) => matching,
        other => return other,
    };
    if matching >= Some(asked) {
        AppendEntriesResponse::Success
    } else {
        AppendEntriesResponse::PartialSuccess(matching)
    }
}

/// One peer, as seen by the replication stream that openraft runs for it.
#[derive(Debug)]
pub struct Connection {
    /// What early appends know of this follower (`early_appends.rs`).
    follower: Arc<Mutex<Follower>>,
    network: Network,
    target: NodeId,
    target_node: PeerNode,
    /// The last append with entries, while it is being sent.
    append: Option<AppendInFlight>,
    /// The commit index the last append sent on this connection carried
    /// (`None` before the first): an empty append that moves it is news to
    /// the follower, not a heartbeat ([`Connection::coalesces`]).
    commit_sent: Option<Option<LogId<NodeId>>>,
    /// Whether a commit notice need not be sent (`commit_ride.rs`).
    ride: CommitRide,
}

type RpcResult<T, E = RaftError<NodeId>> = Result<T, RPCError<NodeId, PeerNode, E>>;

impl Connection {
    /// Whether `request` waits to go with the other shards' heartbeats
    /// (`heartbeats.rs`): an empty append that carries the commit index this
    /// connection last sent, a heartbeat. One that moves it (or the first
    /// one) goes at once: openraft sends a follower nothing else while an
    /// append is in flight, so holding the commit index for the coalescer's
    /// window (half a heartbeat) held the next entries too, and every call
    /// of a lightly loaded sharded cluster waited for it (bench
    /// shard-failover, S = 3: p50 ~21 ms; sent at once, 4–6 ms).
    fn coalesces(&self, request: &AppendEntriesRequest<TypeConfig>) -> bool {
        request.entries.is_empty() && self.commit_sent == Some(request.leader_commit)
    }

    /// Sends `request` to `/raft/{path}` within openraft's deadline and ours.
    async fn send<Req, Resp, Err>(
        &self,
        path: &str,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, Err>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        Err: std::error::Error + DeserializeOwned,
    {
        let timeout = option.hard_ttl().min(self.network.rpc_timeout);
        let body =
            codec::encode(request).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        post(
            &self.network,
            self.target,
            &self.target_node,
            path,
            body,
            timeout,
        )
        .await
    }

    /// How a call of every shard's heartbeats to this peer is sent
    /// (`heartbeats.rs`): `POST /raft/heartbeats`, of no shard.
    fn heartbeats_call(&self) -> super::heartbeats::SendCall {
        let (network, target, node) = (
            self.network.unsharded(),
            self.target,
            self.target_node.clone(),
        );
        Box::new(move |appends| {
            Box::pin(async move {
                let body = codec::encode(&appends).map_err(|error| error.to_string())?;
                let timeout = network.rpc_timeout;
                post::<Vec<super::heartbeats::ShardAnswer>, openraft::error::Infallible>(
                    &network,
                    target,
                    &node,
                    "heartbeats",
                    body,
                    timeout,
                )
                .await
                .map_err(|error| error.to_string())
            })
        })
    }

    /// Sends an append openraft asked for: a heartbeat with the other shards'
    /// (`heartbeats.rs`), another empty append alone, entries in a task.
    async fn deliver(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> AppendResult {
        let coalesces = self.coalesces(&request);
        self.commit_sent = Some(request.leader_commit);
        if coalesces {
            if let Some(heartbeats) = &self.network.heartbeats {
                let append = (self.network.shard, request);
                let call = self.heartbeats_call();
                return heartbeats
                    .send(self.target, &self.target_node, append, call)
                    .await;
            }
        }
        if request.entries.is_empty() {
            return self.send("append", &request, option).await;
        }
        self.send_entries(request, option).await
    }

    /// Sends an append with entries in its own task, or joins the one under way
    /// that covers it: one openraft asked for before, or one sent early
    /// (see the module docs and `early_appends.rs`).
    async fn send_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> AppendResult {
        let asked = *request
            .entries
            .last()
            .map(|entry| &entry.log_id)
            .expect("entries");
        self.network.early.replicating(&self.follower);
        let early = lock(&self.follower).take_early(&request);
        if early.is_none() && self.network.peer_logs.may_hold(self.target, &asked) {
            if let Some(answer) = self.probe(&request, asked, option).await? {
                return Ok(answer);
            }
        }
        if self
            .append
            .as_ref()
            .is_some_and(|sending| !sending.answers(&request))
        {
            // openraft moved on: the old send finishes (or times out) alone.
            self.append = None;
        }
        if self.append.is_none() {
            self.append = match early {
                Some(early) => Some(early),
                None => {
                    let (request, body) = encode_append(&self.network.seams, request).await?;
                    let append = self
                        .network
                        .spawn_append(self.target, &self.target_node, &request, body)
                        .map_err(|fitting| {
                            RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(fitting))
                        })?;
                    Some(append)
                }
            };
        }
        lock(&self.follower).sending(true);
        let sending = self.append.as_mut().expect("set above");
        // openraft may stop waiting here; the task goes on and the next call joins it.
        let joined = (&mut sending.task).await;
        let (sent, vote) = (sending.last_log_id, sending.vote);
        self.append = None;
        let answer = match joined {
            Ok(answer) => answer,
            Err(error) => Err(RPCError::Network(NetworkError::new(&error))),
        };
        let mut follower = lock(&self.follower);
        follower.sending(false);
        match &answer {
            Ok(answer) => follower.answered(vote, sent, answer),
            Err(_) => follower.answered(vote, sent, &AppendEntriesResponse::Conflict),
        }
        drop(follower);
        Ok(cover(answer?, sent, asked))
    }

    /// Asks whether the peer holds `asked`, the last entry of `request`, with an
    /// empty append (see [`super::peer_logs`]); the answer to `request` if that
    /// settles it, `None` if the entries must go.
    async fn probe(
        &self,
        request: &AppendEntriesRequest<TypeConfig>,
        asked: LogId<NodeId>,
        option: &RPCOption,
    ) -> RpcResult<Option<AppendEntriesResponse<NodeId>>> {
        let probe = AppendEntriesRequest::<TypeConfig> {
            vote: request.vote,
            prev_log_id: Some(asked),
            leader_commit: request.leader_commit,
            entries: Vec::new(),
        };
        let answer = self.send("append", &probe, option).await?;
        tracing::debug!(target = self.target, %asked, %answer, "probed for a run");
        match answer {
            AppendEntriesResponse::Success => {
                metrics::counter!(RUNS_FOUND_HELD).increment(1);
                Ok(Some(AppendEntriesResponse::Success))
            }
            higher @ AppendEntriesResponse::HigherVote(_) => Ok(Some(higher)),
            AppendEntriesResponse::Conflict | AppendEntriesResponse::PartialSuccess(_) => {
                self.network.peer_logs.forget(self.target);
                Ok(None)
            }
        }
    }
}

/// Appends of more entries than this are encoded on a blocking thread, so the
/// heartbeats due meanwhile leave on time; fewer (an entry holds at most 1 MiB
/// of messages: ~1.5 ms to encode) are encoded in place, which spares the
/// usual one- or two-entry append two thread hand-offs.
const ENCODE_APART_ENTRIES: usize = 2;

/// The append and its body.
async fn encode_append(
    seams: &Seams,
    request: AppendEntriesRequest<TypeConfig>,
) -> RpcResult<(AppendEntriesRequest<TypeConfig>, Vec<u8>)> {
    let (request, body) = if request.entries.len() <= ENCODE_APART_ENTRIES {
        let body = codec::encode(&request);
        (request, body)
    } else {
        seams
            .blocking(move || {
                let body = codec::encode(&request);
                (request, body)
            })
            .await
            .map_err(|error| RPCError::Network(NetworkError::new(&error)))?
    };
    let body = body.map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
    Ok((request, body))
}

/// POSTs an encoded body to a peer's `/raft/{path}` and decodes its answer.
async fn post<Resp, Err>(
    network: &Network,
    target: NodeId,
    target_node: &PeerNode,
    path: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> RpcResult<Resp, Err>
where
    Resp: DeserializeOwned,
    Err: std::error::Error + DeserializeOwned,
{
    let request = network
        .request(target_node, path, body, timeout)
        .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
    let response = network.transport.send(request).await.map_err(unsent)?;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        return Err(RPCError::Network(NetworkError::new(&Refused(status))));
    }
    let bytes = permitd_transport::collect(response.into_body())
        .await
        .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
    let answer: Result<Resp, Err> =
        codec::decode(&bytes).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
    answer.map_err(|error| {
        RPCError::RemoteError(RemoteError::new_with_node(
            target,
            target_node.clone(),
            error,
        ))
    })
}

impl AppendSender for Network {
    /// Encodes here (at most [`EARLY_ENTRIES_MAX`] entries) and sends in a
    /// task of its own; `None` if the append cannot go.
    fn start_append(
        &self,
        target: NodeId,
        target_node: &PeerNode,
        request: AppendEntriesRequest<TypeConfig>,
    ) -> Option<AppendInFlight> {
        debug_assert!(request.entries.len() <= EARLY_ENTRIES_MAX);
        let body = codec::encode(&request).ok()?;
        self.spawn_append(target, target_node, &request, body).ok()
    }
}

impl Network {
    /// Sends `request`, encoded as `body`, to `target` in its own task, under
    /// a deadline that fits its size. A body over [`MAX_APPEND_BYTES`] with
    /// more than one entry is not sent: the error is how many entries fit.
    fn spawn_append(
        &self,
        target: NodeId,
        target_node: &PeerNode,
        request: &AppendEntriesRequest<TypeConfig>,
        body: Vec<u8>,
    ) -> Result<AppendInFlight, u64> {
        let last_log_id = *request
            .entries
            .last()
            .map(|entry| &entry.log_id)
            .expect("an append with entries");
        if body.len() > MAX_APPEND_BYTES && request.entries.len() > 1 {
            let fitting = request.entries.len() * MAX_APPEND_BYTES / body.len();
            return Err(fitting.max(1) as u64);
        }
        let timeout = append_timeout(self.rpc_timeout, body.len());
        let (network, node) = (self.clone(), target_node.clone());
        let bytes = body.len();
        let task = crate::seams::spawn(async move {
            let started = tokio::time::Instant::now();
            let result = post(&network, target, &node, "append", body, timeout).await;
            let elapsed_ms = started.elapsed().as_millis() as u64;
            match &result {
                Ok(_) => tracing::debug!(target, bytes, elapsed_ms, "append sent"),
                Err(error) => {
                    tracing::warn!(target, bytes, elapsed_ms, %error, "append failed");
                }
            }
            result
        });
        Ok(AppendInFlight {
            vote: request.vote,
            prev_log_id: request.prev_log_id,
            leader_commit: request.leader_commit,
            last_log_id,
            task,
        })
    }

    /// A `POST` of `body` to a peer's `/raft/{path}` (this network's shard in
    /// the query), with the peer secret and a deadline of `timeout`.
    fn request(
        &self,
        target_node: &PeerNode,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Request<Bytes>, axum::http::Error> {
        let (scheme, addr) = (self.scheme, &target_node.raft_addr);
        let url = match self.shard {
            0 => format!("{scheme}://{addr}/raft/{path}"),
            shard => format!("{scheme}://{addr}/raft/{path}?shard={shard}"),
        };
        let mut request = Request::post(url)
            .header(SECRET_HEADER, bearer(self.secret.expose()))
            .header(headers::SENDER, self.id)
            .header(header::CONTENT_TYPE, codec::CONTENT_TYPE)
            .body(Bytes::from(body))?;
        request.extensions_mut().insert(Deadline(timeout));
        Ok(request)
    }

    /// Whether a peer's process is there at all: a call whose answer, any
    /// answer, shows it listens, or a refused connection, which shows it is
    /// gone (the election guard's look at a silent leader).
    pub async fn reach(
        &self,
        target_node: &PeerNode,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Reach {
        let Ok(request) = self.request(target_node, path, body, timeout) else {
            return Reach::Unknown;
        };
        match self.transport.send(request).await {
            Ok(_) => Reach::Answered,
            Err(error) if error.is_refused() => Reach::Refused,
            Err(_) => Reach::Unknown,
        }
    }
}

/// What [`Network::reach`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The peer answered: its process runs, however slow its Raft.
    Answered,
    /// Nothing listens at its address: its process is gone.
    Refused,
    /// No answer and no refusal (a timeout, a cut, a reset connection).
    Unknown,
}

/// A call that got no answer: `Unreachable` when no connection could be
/// made (openraft backs off before the next call), else a `NetworkError`.
fn unsent<Err: std::error::Error>(error: TransportError) -> RPCError<NodeId, PeerNode, Err> {
    if error.is_connect() {
        RPCError::Unreachable(Unreachable::new(&error))
    } else {
        RPCError::Network(NetworkError::new(&error))
    }
}

/// A peer answered with an HTTP error (its secret check, its body limit)
/// instead of its Raft's answer.
#[derive(Debug, thiserror::Error)]
#[error("the peer answered HTTP {0}")]
struct Refused(StatusCode);

impl RaftNetwork<TypeConfig> for Connection {
    /// openraft 0.9 waits 500 ms by default before it calls an unreachable
    /// peer again, heartbeats included. A node restarted within that pause
    /// hears nothing from the leader, stands for election on its stale log
    /// and loses; openraft then remembers that it saw a greater log and adds
    /// `2 × election_timeout_max` to its next election timeout, so a later
    /// failover that needs this node took ~850 ms instead of ~450 (the
    /// bench's failover samples, before this). A refused connection costs
    /// nothing, so the peer is called again after one heartbeat interval.
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(self.network.retry_unreachable))
    }

    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        lock(&self.follower).asked(&request);
        if self
            .ride
            .holds(&request, self.append.is_some(), tokio::time::Instant::now())
        {
            metrics::counter!(COMMIT_NOTICES_HELD).increment(1);
            return Ok(AppendEntriesResponse::Success);
        }
        let covered = commit_ride::covered(&request);
        let answer = self.deliver(request, &option).await;
        if matches!(answer, Ok(AppendEntriesResponse::Success)) {
            self.ride.answered(covered, tokio::time::Instant::now());
        }
        answer
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.send("snapshot", &SnapshotChunk::from(request), &option)
            .await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        let answer: VoteResponse<NodeId> = self.send("vote", &request, &option).await?;
        if let Some(end) = answer.last_log_id {
            self.network.peer_logs.ends_at(self.target, end);
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use openraft::{CommittedLeaderId, Vote};

    use super::*;

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(2, 1), index)
    }

    #[test]
    fn an_answer_covers_the_entries_both_appends_carry() {
        use AppendEntriesResponse::{Conflict, PartialSuccess, Success};
        // Asked for more than was sent: only what was sent is matched.
        assert_eq!(
            cover(Success, log_id(5), log_id(8)),
            PartialSuccess(Some(log_id(5)))
        );
        // Asked for less, or the same: all of it is matched.
        assert_eq!(cover(Success, log_id(5), log_id(3)), Success);
        assert_eq!(cover(Success, log_id(5), log_id(5)), Success);
        let partial = || PartialSuccess(Some(log_id(4)));
        assert_eq!(cover(partial(), log_id(5), log_id(8)), partial());
        assert_eq!(cover(partial(), log_id(5), log_id(4)), Success);
        assert_eq!(cover(Conflict, log_id(5), log_id(8)), Conflict);
    }

    fn option() -> RPCOption {
        RPCOption::new(Duration::from_secs(1))
    }

    /// A peer nobody listens on: nothing here may reach it.
    /// Through the production transport, as the node builds it.
    fn nowhere() -> Connection {
        let rpc_timeout = Duration::from_secs(1);
        let client = client(rpc_timeout, None, None).expect("client builds");
        let network = Network::new(
            1,
            Secret::from("secret"),
            (rpc_timeout, Duration::from_millis(40)),
            "http",
            Arc::new(permitd_transport::ReqwestTransport::new(client)),
        );
        let node = PeerNode {
            api_addr: "127.0.0.1:9".into(),
            raft_addr: "127.0.0.1:9".into(),
        };
        Connection {
            follower: Follower::new(Arc::new(network.clone()), 2, node.clone()),
            network,
            target: 2,
            target_node: node,
            append: None,
            commit_sent: None,
            ride: CommitRide::default(),
        }
    }

    #[test]
    fn only_an_empty_append_that_repeats_the_commit_index_waits_for_the_others() {
        let mut connection = nowhere();
        let empty = |commit: Option<u64>| AppendEntriesRequest {
            leader_commit: commit.map(log_id),
            ..append_of(0, 0)
        };
        assert!(
            !connection.coalesces(&empty(Some(3))),
            "the first goes at once"
        );
        connection.commit_sent = Some(Some(log_id(3)));
        assert!(connection.coalesces(&empty(Some(3))), "a heartbeat");
        assert!(!connection.coalesces(&empty(Some(4))), "a new commit index");
        assert!(!connection.coalesces(&append_of(1, 8)), "entries");
    }

    fn append_of(entries: u64, bytes_each: usize) -> AppendEntriesRequest<TypeConfig> {
        let entries = (1..=entries)
            .map(|index| openraft::Entry {
                log_id: log_id(index),
                payload: openraft::EntryPayload::Normal(
                    permitd_storage::EncodedCommand::new(permitd_storage::Command::Reclaim {
                        now_ms: 0,
                        keys: vec!["k".repeat(bytes_each)],
                    })
                    .expect("a command encodes"),
                ),
            })
            .collect();
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: None,
            leader_commit: None,
            entries,
        }
    }

    #[tokio::test]
    async fn a_run_of_entries_too_large_is_answered_with_how_many_fit() {
        let mut connection = nowhere();
        let request = append_of(4, 3 * 1024 * 1024);
        let Err(RPCError::PayloadTooLarge(too_large)) =
            connection.send_entries(request, &option()).await
        else {
            panic!("12 MiB of entries are not sent");
        };
        assert_eq!(too_large.entries_hint(), 2, "8 MiB holds two of them");
        assert!(connection.append.is_none(), "nothing is under way");
    }

    #[tokio::test]
    async fn one_entry_always_goes_however_large() {
        let mut connection = nowhere();
        let request = append_of(1, MAX_APPEND_BYTES + 1);
        let answer = connection.send_entries(request, &option()).await;
        assert!(
            matches!(answer, Err(RPCError::Unreachable(_))),
            "sent (nobody answers): {answer:?}"
        );
    }

    /// A peer whose `/raft/append` answers `Success` after `delay`, counting calls.
    async fn slow_peer(delay: Duration) -> (Connection, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let router = axum::Router::new().route(
            "/raft/append",
            axum::routing::post(move || {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    let answer: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> =
                        Ok(AppendEntriesResponse::Success);
                    codec::encode(&answer).expect("encodes")
                }
            }),
        );
        (connection_to(router).await, calls)
    }

    /// A connection to a peer served by `router` on loopback.
    async fn connection_to(router: axum::Router) -> Connection {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, router).await });
        let mut connection = nowhere();
        connection.target_node.raft_addr = addr;
        connection.follower = Follower::new(
            Arc::new(connection.network.clone()),
            connection.target,
            connection.target_node.clone(),
        );
        connection
    }

    /// An append of the leader's entries `from..=to` after entry `from - 1`,
    /// with commit index `commit`.
    fn append_after(from: u64, to: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        let all = append_of(to, 10);
        AppendEntriesRequest {
            prev_log_id: (from > 1).then(|| log_id(from - 1)),
            leader_commit: Some(log_id(commit)),
            entries: all.entries[(from - 1) as usize..].to_vec(),
            ..all
        }
    }

    /// Waits until the peer has seen `count` appends.
    async fn seen_count(seen: &Mutex<Vec<(u64, usize, u64)>>, count: usize) {
        while seen.lock().unwrap().len() < count {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A connection whose follower answered openraft's append of entries 1–2
    /// (commit index 1): idle, its last entry known.
    async fn follower_holding_entry_2() -> (Connection, Arc<Mutex<Vec<(u64, usize, u64)>>>) {
        let (mut connection, seen) = peer_holding(10).await;
        let answer = connection
            .append_entries(append_after(1, 2, 1), option())
            .await;
        assert_eq!(answer.expect("answered"), AppendEntriesResponse::Success);
        (connection, seen)
    }

    #[tokio::test]
    async fn new_entries_leave_for_an_idle_follower_as_written_and_openraft_joins_that_send() {
        let (mut connection, seen) = follower_holding_entry_2().await;
        // Entry 3 is being written: it leaves at once, after the follower's
        // last entry (2), with openraft's last commit index (1).
        let next = append_after(3, 3, 1);
        let early = connection.network.early_appends();
        assert_eq!(early.send(&next.entries), 1, "sent early");
        seen_count(&seen, 2).await;
        assert_eq!(seen.lock().unwrap()[1], (2, 1, 1));
        // openraft asks for the same append after the leader's sync: joined.
        let answer = connection.append_entries(next, option()).await;
        assert_eq!(answer.expect("answered"), AppendEntriesResponse::Success);
        assert_eq!(seen.lock().unwrap().len(), 2, "not sent again");
        // Entry 4 follows entry 3, as the joined answer showed.
        assert_eq!(early.send(&append_after(4, 4, 3).entries), 1);
    }

    #[tokio::test]
    async fn an_append_openraft_asks_differently_is_sent_and_the_early_one_finishes_alone() {
        let (mut connection, seen) = follower_holding_entry_2().await;
        let early = connection.network.early_appends();
        assert_eq!(early.send(&append_after(3, 3, 1).entries), 1);
        seen_count(&seen, 2).await;
        // Entry 2 committed meanwhile: openraft's append carries commit 2.
        let answer = connection
            .append_entries(append_after(3, 3, 2), option())
            .await;
        assert_eq!(answer.expect("answered"), AppendEntriesResponse::Success);
        assert_eq!(seen.lock().unwrap()[2], (2, 1, 2), "sent as asked");
    }

    #[tokio::test]
    async fn no_early_append_goes_to_a_follower_being_sent_to_or_of_unknown_log() {
        let (mut connection, seen) = slow_peer(Duration::from_millis(200)).await;
        let early = connection.network.early_appends();
        // Before any answer the follower's log is unknown.
        assert_eq!(early.send(&append_after(1, 1, 0).entries), 0);
        let sending = tokio::time::timeout(
            Duration::from_millis(20),
            connection.append_entries(append_after(1, 1, 0), option()),
        )
        .await;
        assert!(
            sending.is_err(),
            "openraft stopped waiting; the send goes on"
        );
        assert_eq!(
            early.send(&append_after(2, 2, 0).entries),
            0,
            "one append at a time"
        );
        let answer = connection
            .append_entries(append_after(1, 1, 0), option())
            .await;
        assert_eq!(answer.expect("answered"), AppendEntriesResponse::Success);
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        // Idle now, after entry 1: but not three entries, not entries that do
        // not follow entry 1, not another leader's.
        assert_eq!(early.send(&append_after(2, 4, 1).entries), 0);
        assert_eq!(early.send(&append_after(3, 3, 1).entries), 0);
        let mut other = append_after(2, 2, 1);
        other.entries[0].log_id = LogId::new(CommittedLeaderId::new(3, 2), 2);
        assert_eq!(early.send(&other.entries), 0);
        assert_eq!(early.send(&append_after(2, 2, 1).entries), 1);
    }

    #[tokio::test]
    async fn an_append_asked_again_joins_the_send_under_way() {
        let (mut connection, calls) = slow_peer(Duration::from_millis(300)).await;
        // openraft gives up after its heartbeat interval...
        let first = tokio::time::timeout(
            Duration::from_millis(20),
            connection.send_entries(append_of(2, 10), &option()),
        )
        .await;
        assert!(first.is_err(), "cut off by the caller");
        // ...and asks again, for more entries: the send under way answers.
        let again = connection.send_entries(append_of(3, 10), &option()).await;
        assert_eq!(
            again.expect("answered"),
            AppendEntriesResponse::PartialSuccess(Some(log_id(2)))
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "sent once");
        // The rest goes in a new send.
        let rest = connection.send_entries(append_of(3, 10), &option()).await;
        assert_eq!(rest.expect("answered"), AppendEntriesResponse::Success);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// A peer whose log holds entries 1 to `held` as the leader has them: an
    /// append is answered as openraft's follower would; every append is recorded
    /// as (previous index, entries carried, commit index).
    async fn peer_holding(held: u64) -> (Connection, Arc<Mutex<Vec<(u64, usize, u64)>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let router = axum::Router::new().route(
            "/raft/append",
            axum::routing::post(move |body: axum::body::Bytes| {
                let recorded = recorded.clone();
                async move {
                    let request: AppendEntriesRequest<TypeConfig> =
                        codec::decode(&body).expect("an append");
                    let index = |id: Option<LogId<NodeId>>| id.map_or(0, |id| id.index);
                    let prev = index(request.prev_log_id);
                    let commit = index(request.leader_commit);
                    recorded
                        .lock()
                        .unwrap()
                        .push((prev, request.entries.len(), commit));
                    let answer = if prev <= held {
                        AppendEntriesResponse::<NodeId>::Success
                    } else {
                        AppendEntriesResponse::Conflict
                    };
                    let answer: Result<_, RaftError<NodeId>> = Ok(answer);
                    codec::encode(&answer).expect("encodes")
                }
            }),
        );
        (connection_to(router).await, seen)
    }

    #[tokio::test]
    async fn a_run_the_follower_said_it_holds_is_probed_not_sent() {
        let (mut connection, seen) = peer_holding(10).await;
        connection.network.peer_logs.ends_at(2, log_id(10));
        let answer = connection.send_entries(append_of(3, 10), &option()).await;
        assert_eq!(answer.expect("answered"), AppendEntriesResponse::Success);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(3, 0, 0)],
            "one empty probe at entry 3"
        );
    }

    #[tokio::test]
    async fn a_run_the_follower_does_not_hold_is_sent_after_a_failed_probe() {
        let (mut connection, seen) = peer_holding(1).await;
        // It said its log reached entry 10, but holds only entry 1 now.
        connection.network.peer_logs.ends_at(2, log_id(10));
        let answer = connection.send_entries(append_of(3, 10), &option()).await;
        assert_eq!(answer.expect("answered"), AppendEntriesResponse::Success);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(3, 0, 0), (0, 3, 0)],
            "probe, then the run"
        );
        // Proved wrong once: the next run goes without a probe.
        seen.lock().unwrap().clear();
        let _ = connection.send_entries(append_of(3, 10), &option()).await;
        assert_eq!(*seen.lock().unwrap(), vec![(0, 3, 0)]);
    }

    #[tokio::test]
    async fn a_run_past_the_follower_log_end_is_sent_without_a_probe() {
        let (mut connection, seen) = peer_holding(2).await;
        connection.network.peer_logs.ends_at(2, log_id(2));
        let _ = connection.send_entries(append_of(3, 10), &option()).await;
        assert_eq!(*seen.lock().unwrap(), vec![(0, 3, 0)]);
    }

    #[tokio::test]
    async fn a_commit_notice_right_after_an_answer_is_not_sent_and_the_next_heartbeat_carries_it() {
        let (mut connection, seen) = peer_holding(10).await;
        let with_commit = |mut request: AppendEntriesRequest<TypeConfig>, prev, commit| {
            request.prev_log_id = (prev > 0).then(|| log_id(prev));
            request.leader_commit = (commit > 0).then(|| log_id(commit));
            request
        };
        let entries = with_commit(append_of(3, 10), 0, 0);
        let notice = with_commit(append_of(0, 0), 3, 3);
        let heartbeat = with_commit(append_of(0, 0), 3, 3);
        for request in [entries, notice, heartbeat] {
            let answer = connection.append_entries(request, option()).await;
            assert_eq!(answer.expect("answered"), AppendEntriesResponse::Success);
        }
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(0, 3, 0), (3, 0, 3)],
            "the entries, then the heartbeat with the new commit index; no notice"
        );
    }

    #[test]
    fn an_append_deadline_grows_with_its_size() {
        let rpc = Duration::from_millis(500);
        assert_eq!(append_timeout(rpc, 100), rpc);
        assert_eq!(
            append_timeout(rpc, 4 * 1024 * 1024),
            Duration::from_millis(500 + 4_096)
        );
    }
}
