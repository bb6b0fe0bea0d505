//! Header names the cluster adds to calls and answers (lower case, as HTTP/2
//! sends them). `Authorization: Bearer <secret>` and `Retry-After` are the
//! standard headers and keep their standard names.

/// On every v1 answer: the id of the node that leads (or that the answering node
/// believes leads, on a 503 `not_leader`). Clients use it to ask the leader
/// directly and save the forwarding hop.
pub const LEADER: &str = "x-permitd-leader";

/// On a call a follower forwarded to the leader. A node that receives one and
/// does not lead answers `not_leader` instead of forwarding again, so a call
/// takes at most one hop.
pub const FORWARDED: &str = "x-permitd-forwarded";

/// On every Raft RPC: the id of the sending node. For logs and for network
/// fault injection in tests; never used for authorisation.
pub const SENDER: &str = "x-permitd-from";

/// On a call: the one shard it is about, for calls that name no key (a
/// listing, a batch, a client's release, membership, a backup). With it, such
/// a call covers that shard alone and goes to its leader; without it, the node
/// called covers every shard by sending one call per shard with this header
/// and merging the answers. Calls that name a key go to the key's shard
/// whatever this says. On every v1 answer: the shard that answered, when
/// there is one.
pub const SHARD: &str = "x-permitd-shard";

/// On every answer of a cluster of more than one shard: its shard count, so a
/// client can work out a key's shard (`permitd_core::shard::shard_of`) and
/// call that shard's leader directly.
pub const SHARDS: &str = "x-permitd-shards";

/// Every header above.
pub const ALL: [&str; 5] = [LEADER, FORWARDED, SENDER, SHARD, SHARDS];
