//! What a node proves itself with and checks others against: the peer secret
//! and the admin token ([`secret`], [`admin`]) and the TLS identity ([`tls`]).
//!
//! They sit below both the HTTP edge and the Raft transport, which use them
//! alike, and below the node that is started with them (`app.rs`), so neither
//! side has to import the other to reach them.

pub mod admin;
pub mod secret;
pub mod tls;

pub use admin::AuthSettings;
pub use secret::{random_hex, write_private_file, Secret};
