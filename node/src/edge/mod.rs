//! The HTTP edge: everything between a socket and the node.
//!
//! - [`serve`]: the accept loop of both listeners (connection limit, waiting
//!   for the open connections when stopped);
//! - [`connection`]: one accepted connection of any stream type, a TCP one or
//!   the simulator's (TLS handshake, timeouts, graceful stop): [`sniff`] tells
//!   its protocol, [`http2`] serves HTTP/2 connections and [`peer_stream`]
//!   peers' streams of Raft calls; all serve the router wrapped as
//!   `service.rs` builds it;
//! - [`api`]: the public and internal routers and their handlers, including
//!   forwarding to the leader ([`api::forward`]);
//! - [`auth`]: who may call what (tokens and roles), checked on the leader;
//! - [`error`]: the one mapping of every failure to an HTTP answer;
//! - [`raft_inbound`]: the `/raft/*` endpoints peers call.
//!
//! The edge sits above the node it serves (`app.rs`): handlers share its
//! [`crate::app::App`], and nothing below the edge imports it. What the edge and
//! the Raft transport both need (TLS, the peer secret) lives in
//! [`crate::credentials`].

pub mod api;
pub mod auth;
pub mod connection;
pub mod error;
pub mod http2;
#[cfg(test)]
mod in_memory;
pub mod peer_stream;
pub mod raft_inbound;
pub mod serve;
mod service;
pub mod sniff;
