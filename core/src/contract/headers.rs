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

/// Every header above.
pub const ALL: [&str; 3] = [LEADER, FORWARDED, SENDER];
