//! Network namespaces: each node of a cluster on a host of its own, so a test
//! can cut one direction of one path while every other path stays up.
//!
//! A [`Lan`] is one Linux bridge in the test's own namespace, with an address
//! of its own (the test reaches the nodes through it), and one namespace per
//! node joined to the bridge by a veth pair: node `i` is `10.A.B.i`, the bridge
//! `10.A.B.254`, where `A.B` is drawn from the test's process id and a counter
//! so that tests running side by side never share a subnet. Node processes
//! run in their namespace through `ip netns exec` ([`Lan::command`]).
//!
//! A one-way cut ([`Lan::cut_calls`]) drops, on the bridge's port towards the
//! receiving node, every packet the other node sends it, except those sent
//! from the listed ports of the sender: the answers on connections the
//! receiver opened. The packets leave the sender and vanish on the way, as in
//! a real network fault: the sender's kernel sees no error and no reset, just
//! silence. Only iproute2 is needed (`ip`, `tc`): an HTB qdisc whose filters
//! (u32) send the cut traffic to a class that holds a `pfifo` of length 0,
//! which drops all it gets (this kernel has no `gact` drop action, and
//! nftables' userland is not installed).
//!
//! Creating namespaces needs root (`CAP_NET_ADMIN`); [`Lan::create`] says why
//! it could not, and a test skips with that message. Everything a `Lan` made
//! is deleted on `Drop`, and what a killed test process left behind is swept
//! by the next `Lan` created.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Prefix of every namespace, bridge and veth this module makes, followed by
/// the maker's process id (so a sweep can tell which are orphans).
const PREFIX: &str = "pd";
/// The last octet of the bridge's own address.
const BRIDGE_HOST: u8 = 254;

/// Nodes on a bridge, each in a network namespace of its own.
#[derive(Debug)]
pub struct Lan {
    /// `pd<pid>l<counter>`: the bridge's name and the namespaces' prefix.
    tag: String,
    /// The first two octets after `10.`.
    subnet: [u8; 2],
    ids: Vec<u64>,
}

impl Lan {
    /// A bridge and one namespace per id in `ids` (1 to 253). `Err` says why
    /// not (not root, no `ip`, no namespaces in this kernel or container).
    pub fn create(ids: &[u64]) -> Result<Self, String> {
        sweep_orphans();
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let counter = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let mixed = pid.wrapping_mul(31).wrapping_add(counter) % (250 * 256);
        let lan = Self {
            tag: format!("{PREFIX}{pid}l{counter}"),
            subnet: [(mixed / 256) as u8 + 1, (mixed % 256) as u8],
            ids: ids.to_vec(),
        };
        assert!(ids
            .iter()
            .all(|id| (1..u64::from(BRIDGE_HOST)).contains(id)));
        lan.build().map_err(|error| {
            format!("cannot create network namespaces (they need root, CAP_NET_ADMIN): {error}")
        })?;
        Ok(lan)
    }

    fn build(&self) -> Result<(), String> {
        let bridge = &self.tag;
        let bridge_addr = format!("{}/24", self.address(u64::from(BRIDGE_HOST)));
        run(&["ip", "link", "add", bridge, "type", "bridge"])?;
        run(&["ip", "link", "set", bridge, "up"])?;
        run(&["ip", "addr", "add", &bridge_addr, "dev", bridge])?;
        for id in &self.ids {
            let (namespace, veth) = (self.namespace(*id), self.veth(*id));
            let addr = format!("{}/24", self.ip(*id));
            run(&["ip", "netns", "add", &namespace])?;
            run(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", "lan0", "netns",
                &namespace,
            ])?;
            run(&["ip", "link", "set", &veth, "master", bridge, "up"])?;
            run(&["ip", "-n", &namespace, "addr", "add", &addr, "dev", "lan0"])?;
            run(&["ip", "-n", &namespace, "link", "set", "lan0", "up"])?;
            run(&["ip", "-n", &namespace, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// The address of node `id`.
    pub fn ip(&self, id: u64) -> Ipv4Addr {
        self.address(id)
    }

    fn address(&self, host: u64) -> Ipv4Addr {
        let host = u8::try_from(host).expect("a host octet");
        Ipv4Addr::new(10, self.subnet[0], self.subnet[1], host)
    }

    /// The namespace node `id` runs in.
    pub fn namespace(&self, id: u64) -> String {
        format!("{}n{id}", self.tag)
    }

    /// The bridge's end of node `id`'s veth pair (in the test's namespace).
    fn veth(&self, id: u64) -> String {
        format!("{}v{id}", self.tag)
    }

    /// `program` to be run inside node `id`'s namespace.
    pub fn command(&self, id: u64, program: &Path) -> Command {
        command_in(&self.namespace(id), program)
    }

    /// Cuts what node `from` sends to node `to`, but for packets sent from
    /// `from`'s ports `answers_from` (its answers on connections `to` opened,
    /// e.g. to its Raft listener). Everything `to` sends still arrives.
    pub fn cut_calls(&self, from: u64, to: u64, answers_from: &[u16]) -> Result<(), String> {
        let dev = self.veth(to);
        let source = format!("{}/32", self.ip(from));
        self.heal(to);
        run(&[
            "tc", "qdisc", "add", "dev", &dev, "root", "handle", "1:", "htb", "default", "1",
        ])?;
        for class in ["1:1", "1:2"] {
            run(&[
                "tc", "class", "add", "dev", &dev, "parent", "1:", "classid", class, "htb", "rate",
                "10gbit", "quantum", "200000",
            ])?;
        }
        // Class 1:2 drops: its queue holds no packet at all.
        run(&[
            "tc", "qdisc", "add", "dev", &dev, "parent", "1:2", "handle", "20:", "pfifo", "limit",
            "0",
        ])?;
        for port in answers_from {
            run(&[
                "tc",
                "filter",
                "add",
                "dev",
                &dev,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                "1",
                "u32",
                "match",
                "ip",
                "src",
                &source,
                "match",
                "ip",
                "sport",
                &port.to_string(),
                "0xffff",
                "flowid",
                "1:1",
            ])?;
        }
        run(&[
            "tc", "filter", "add", "dev", &dev, "parent", "1:", "protocol", "ip", "prio", "2",
            "u32", "match", "ip", "src", &source, "flowid", "1:2",
        ])
    }

    /// Lifts every cut towards node `to`.
    pub fn heal(&self, to: u64) {
        let _ = run(&["tc", "qdisc", "del", "dev", &self.veth(to), "root"]);
    }

    /// Packets dropped by the cuts towards node `to` so far.
    pub fn dropped(&self, to: u64) -> u64 {
        let output = Command::new("tc")
            .args(["-s", "qdisc", "show", "dev", &self.veth(to)])
            .output();
        let text = output.map(|output| String::from_utf8_lossy(&output.stdout).into_owned());
        // `qdisc pfifo 20: … Sent 0 bytes 0 pkt (dropped N, …`
        text.unwrap_or_default()
            .split("qdisc pfifo 20:")
            .nth(1)
            .and_then(|rest| rest.split("dropped ").nth(1))
            .and_then(|rest| rest.split(',').next())
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for id in &self.ids {
            // Deleting one end deletes the pair now; a namespace's own
            // deletion (and its veth's) waits for the kernel's cleanup.
            let _ = run(&["ip", "link", "del", &self.veth(*id)]);
            let _ = run(&["ip", "netns", "del", &self.namespace(*id)]);
        }
        let _ = run(&["ip", "link", "del", &self.tag]);
    }
}

/// `program` to be run inside `namespace` (`ip netns exec` execs it: the
/// child's process id is the program's).
pub fn command_in(namespace: &str, program: &Path) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", namespace]).arg(program);
    command
}

/// Why this process cannot make network namespaces, or `None` if it can.
pub fn unavailable() -> Option<String> {
    Lan::create(&[1]).err()
}

/// Runs one `ip` or `tc` command; `Err` carries its stderr.
fn run(args: &[&str]) -> Result<(), String> {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|error| format!("{}: {error}", args.join(" ")))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(format!("{}: {}", args.join(" "), stderr.trim()))
}

/// Deletes the namespaces, bridges and veths of test processes that are gone.
fn sweep_orphans() {
    let orphan = |name: &str| {
        let digits: String = name
            .strip_prefix(PREFIX)
            .unwrap_or_default()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        !digits.is_empty() && !Path::new("/proc").join(&digits).exists()
    };
    let listed = |args: &[&str]| -> Vec<String> {
        let output = Command::new(args[0]).args(&args[1..]).output();
        let text = output.map(|output| String::from_utf8_lossy(&output.stdout).into_owned());
        text.unwrap_or_default()
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            // A veth is listed as `name@peer`.
            .filter_map(|name| name.split('@').next().map(str::to_owned))
            .collect()
    };
    for namespace in listed(&["ip", "netns", "list"]) {
        if orphan(&namespace) {
            let _ = run(&["ip", "netns", "del", &namespace]);
        }
    }
    for link in listed(&["ip", "-o", "-br", "link", "show"]) {
        if orphan(&link) {
            let _ = run(&["ip", "link", "del", &link]);
        }
    }
}
