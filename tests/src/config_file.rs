//! The cluster file (`cluster.toml`) the harness writes: short Raft timings,
//! the test secret and admin token, one `[[node]]` per node.

use std::path::{Path, PathBuf};

use crate::cluster::Settings;
use crate::process::{free_port, Node};
use crate::{certs, disks, ADMIN_TOKEN, SECRET};

/// Raft heartbeat of every test cluster, in ms (the `cluster.toml` values).
pub const HEARTBEAT_INTERVAL_MS: u64 = 40;
/// Shortest election timeout of every test cluster, in ms.
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 120;
/// Longest election timeout of every test cluster, in ms; openraft 0.9 also
/// uses it as the leader lease, so a follower elects after up to twice this.
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 240;
/// Log entries between two snapshots in a test cluster (the shipped
/// `cluster.toml` says 5,000).
pub const SNAPSHOT_EVERY_LOGS: u64 = 500;

/// Writes a cluster file of `count` nodes on free loopback ports into `dir`, for
/// tests that start the nodes some other way (`permitd up`). Returns the file and
/// the nodes' API URLs.
pub fn write_cluster_file(dir: &Path, count: u64) -> (PathBuf, Vec<String>) {
    let path = dir.join("cluster.toml");
    let nodes: Vec<Node> = (1..=count)
        .map(|id| Node {
            id,
            api_addr: format!("127.0.0.1:{}", free_port()),
            raft_addr: format!("127.0.0.1:{}", free_port()),
            advertise_raft_addr: None,
            scheme: "http",
            config: path.clone(),
            working_dir: None,
            worker_threads: None,
            namespace: None,
            child: None,
        })
        .collect();
    let text = cluster_toml(&nodes, &Settings::default(), None);
    std::fs::write(&path, text).expect("config");
    (path, nodes.iter().map(Node::url).collect())
}

/// The loopback address node `id` sends Raft RPCs from with
/// [`Settings::distinct_source_ips`]: `127.0.0.(id + 1)`.
pub fn peer_source_ip(id: u64) -> std::net::Ipv4Addr {
    let last = u8::try_from(id + 1).expect("at most 254 test nodes");
    std::net::Ipv4Addr::new(127, 0, 0, last)
}

/// The node that sends from `ip` under [`Settings::distinct_source_ips`].
pub fn node_of_source_ip(ip: std::net::IpAddr) -> Option<u64> {
    match ip {
        std::net::IpAddr::V4(v4) if v4.octets()[..3] == [127, 0, 0] && v4.octets()[3] >= 2 => {
            Some(u64::from(v4.octets()[3]) - 1)
        }
        _ => None,
    }
}

pub(crate) fn cluster_toml(
    nodes: &[Node],
    settings: &Settings,
    certs: Option<&certs::TestCerts>,
) -> String {
    let Settings {
        defaults,
        extra_toml,
        auth,
        raft_toml,
        snapshot_every_logs,
        ..
    } = settings;
    let (heartbeat, election_min, election_max) = settings.raft_timings_ms.unwrap_or((
        HEARTBEAT_INTERVAL_MS,
        ELECTION_TIMEOUT_MIN_MS,
        ELECTION_TIMEOUT_MAX_MS,
    ));
    let rpc_timeout = settings.rpc_timeout_ms.unwrap_or(500);
    let mut text = format!(
        "secret = \"{SECRET}\"\n\n[auth]\nenabled = {auth}\nadmin_token = \"{ADMIN_TOKEN}\"\n\n\
         [raft]\nheartbeat_interval_ms = {heartbeat}\n\
         election_timeout_min_ms = {election_min}\n\
         election_timeout_max_ms = {election_max}\n\
         rpc_timeout_ms = {rpc_timeout}\nsnapshot_every_logs = {snapshot_every_logs}\n{raft_toml}\n[defaults]\n{defaults}\n{extra_toml}\n"
    );
    if let Some(shards) = settings.shards {
        text.push_str(&format!("[cluster]\nshards = {shards}\n\n"));
    }
    if let Some(certs) = certs {
        text.push_str(&format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\nca_file = {:?}\npeer_client_auth = true\n\n",
            certs.cert_file, certs.key_file, certs.ca_file
        ));
    }
    for node in nodes {
        text.push_str(&format!(
            "[[node]]\nid = {}\napi_addr = \"{}\"\nraft_addr = \"{}\"\ndata_dir = \"{}\"\n",
            node.id,
            node.api_addr,
            node.raft_addr,
            disks::relative_data_dir(node.id)
        ));
        if let Some(addr) = &node.advertise_raft_addr {
            text.push_str(&format!("advertise_raft_addr = \"{addr}\"\n"));
        }
        if settings.distinct_source_ips {
            text.push_str(&format!(
                "peer_source_ip = \"{}\"\n",
                peer_source_ip(node.id)
            ));
        }
        text.push('\n');
    }
    text
}
