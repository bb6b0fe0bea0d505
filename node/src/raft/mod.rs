//! openraft wiring: the Raft handle type, Raft's own runtime ([`runtime`]), the
//! outbound network over HTTP ([`network`]) and the commit notices it need not
//! send ([`commit_ride`]), pre-vote ([`election_guard`]),
//! where each peer's log ends ([`peer_logs`]), quiet shards and the liveness
//! calls that stand for their heartbeats ([`quiescence`], [`liveness`]), the
//! metrics that show a stall ([`stall_probe`]) and the node's one clock of its
//! stalls, read by every shard's guard ([`stall_clock`]). The inbound `/raft/*` endpoints the peers call are in the
//! edge, which serves both listeners (`edge/raft_inbound.rs`).
//!
//! Peers talk HTTP with MessagePack bodies ([`wire`]), every call to a peer on
//! one connection as a frame (`permitd_transport::StreamTransport`, opened by
//! [`peer_connector`]). Every request carries the
//! cluster secret; every answer is an encoded `Result<Response, RaftError>` so that a remote Raft error
//! reaches the caller as a [`openraft::error::RemoteError`], distinct from a peer
//! that cannot be reached or a connection that broke.

pub mod commit_ride;
pub mod early_appends;
pub mod election_guard;
pub mod heartbeats;
pub mod leader_view;
pub mod liveness;
pub mod network;
pub mod peer_connector;
pub mod peer_logs;
pub mod quiescence;
pub mod runtime;
pub mod stall_clock;
pub mod stall_probe;
pub mod wire;

use permitd_storage::TypeConfig;

/// The Raft group this node takes part in. Passed around as a value, never a
/// global, so that several groups could live in one process later.
pub type Raft = openraft::Raft<TypeConfig>;

/// The entry of node `id` in `raft`'s current membership.
pub fn member(raft: &Raft, id: permitd_storage::NodeId) -> Option<permitd_storage::PeerNode> {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    metrics
        .membership_config
        .membership()
        .get_node(&id)
        .cloned()
}

/// The header that carries the cluster secret, as `Bearer <secret>`.
pub const SECRET_HEADER: &str = "authorization";

/// The header value for a secret.
pub fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}
