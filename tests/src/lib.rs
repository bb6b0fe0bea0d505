//! End-to-end tests that start real `permitd` processes.
//!
//! [`Cluster`] writes a `cluster.toml` with ephemeral loopback ports, short Raft
//! timings and small round timings into a temporary directory, starts one
//! `permitd serve --config … --id N` process per node, initialises the cluster
//! and kills every process on `Drop`. Tests talk to it over real HTTP.
//!
//! # Which binary runs
//!
//! [`permitd_bin`] looks, in order, for:
//! 1. `PERMITD_BIN`, if set;
//! 2. `permitd` next to the test executable's `deps/` folder, i.e.
//!    `$CARGO_TARGET_DIR/debug/permitd` (or `target/debug/permitd`).
//!
//! `cargo test --workspace` builds that binary (the `permitd` package has an
//! integration test, so cargo builds its binary first). With `cargo test -p
//! permitd-tests` alone, run `cargo build -p permitd` first; if the binary is
//! missing the harness runs that build itself.
//!
//! Set `PERMITD_KEEP_DIRS=1` to keep the temporary directories (node logs are in
//! `node-N.log` there).
//!
//! # Auth and TLS
//!
//! Every cluster runs with auth on: the cluster file carries [`ADMIN_TOKEN`] and
//! [`Cluster::call`] sends it (use [`Cluster::call_as`] to call with another
//! token or none). [`Settings::tls`] generates a CA and node certificates
//! ([`certs`]) and turns on `[tls]` with mTLS on the Raft port; node URLs are
//! then `https://` and the harness's HTTP client trusts only that CA.
//!
//! # Modules
//!
//! [`process`] finds the binaries, hands out ports and runs one node's process;
//! [`cluster`] is the [`Cluster`]; [`config_file`] writes its `cluster.toml`;
//! [`http`] holds the HTTP client and JSON helpers; [`wait`] waits on
//! conditions ([`eventually`], [`wait_for_pending`]), never for fixed times;
//! [`netns`] puts each node in a network namespace of its own
//! ([`Settings::namespaces`]) so a test can cut one direction of one path.
//! Every public name is also here at the root.

use std::time::Duration;

pub mod bench;
pub mod certs;
pub mod chaos;
pub mod cluster;
pub mod config_file;
pub mod ctl;
pub mod disks;
pub mod http;
pub mod netns;
pub mod power_loss;
pub mod process;
pub mod wait;

pub use cluster::{shipped_cluster_file, Cluster, Settings};
pub use config_file::{
    node_of_source_ip, peer_source_ip, write_cluster_file, ELECTION_TIMEOUT_MAX_MS,
    ELECTION_TIMEOUT_MIN_MS, HEARTBEAT_INTERVAL_MS, SNAPSHOT_EVERY_LOGS,
};
pub use http::{granted, request, Answer};
pub use process::{child_commands, free_port, permitctl_bin, permitd_bin, Node};
pub use wait::{eventually, eventually_seen, wait_for_pending};

/// The peer secret every test cluster uses (opens `/raft/*` only).
pub const SECRET: &str = "permitd-test-secret-0123456789";
/// The admin token every test cluster uses.
pub const ADMIN_TOKEN: &str = "permitd-test-admin-token-0123456789";
/// How long a node may take to answer `/healthz`, or a cluster to elect.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(30);
pub(crate) const POLL: Duration = Duration::from_millis(50);
