//! openraft wiring: the Raft handle type, the outbound network over HTTP and the
//! inbound `/raft/*` endpoints.
//!
//! Peers talk HTTP with MessagePack bodies ([`wire`]). Every request carries the
//! cluster secret; every answer is an encoded `Result<Response, RaftError>` so that a remote Raft error
//! reaches the caller as a [`openraft::error::RemoteError`], distinct from a peer
//! that cannot be reached or a connection that broke.

pub mod election_guard;
pub mod network;
pub mod peer_logs;
pub mod runtime;
pub mod stall_probe;
pub mod wire;

use permitd_storage::TypeConfig;

/// The Raft group this node takes part in. Passed around as a value, never a
/// global, so that several groups could live in one process later.
pub type Raft = openraft::Raft<TypeConfig>;

/// The header that carries the cluster secret, as `Bearer <secret>`.
pub const SECRET_HEADER: &str = "authorization";

/// The header value for a secret.
pub fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}
