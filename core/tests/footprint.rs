//! Memory the core keeps per idle key: a key holding one live, unclaimed grant
//! of one permit (what the bench's scale section creates 100,000 of).
//!
//! Measured as this process's resident memory before and after creating
//! 100,000 such keys (a counting allocator would need `unsafe`, which the
//! workspace forbids); the bench measures the whole leader on top of it.
//! `cargo test --release -p permitd-core --test footprint -- --nocapture`
//! prints the figure.

use permitd_core::contract::protocol::{Demand, PermitRequest, V1};
use permitd_core::{IdAllocator, KeyConfig, Semaphores};

/// This process's resident memory, from `/proc/self/status`.
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|value| value.parse().ok())
        .expect("VmRSS in kB");
    kib * 1024
}

const KEYS: usize = 100_000;

fn one_permit(client_id: &str) -> PermitRequest {
    PermitRequest {
        v: V1,
        client_id: client_id.to_owned(),
        request_id: None,
        demand: vec![Demand {
            group: "g".into(),
            count: 1,
            oldest_at_ms: 1,
        }],
        grants: Vec::new(),
        leases: None,
        wait_ms: None,
    }
}

/// Bytes per key held after `KEYS` keys each took one permit.
fn bytes_per_idle_key(request: &PermitRequest) -> f64 {
    let defaults = KeyConfig {
        grant_timeout_ms: 3_600_000,
        ..KeyConfig::default()
    };
    let names: Vec<String> = (0..KEYS).map(|index| format!("scale-{index}")).collect();
    let before = rss_bytes();
    let mut semaphores = Semaphores::new(defaults).expect("valid defaults");
    for (index, key) in names.iter().enumerate() {
        let mut ids = IdAllocator::new(index as u64 + 1);
        semaphores.round(key, &mut ids, 1_000, std::slice::from_ref(request));
        semaphores.take_changes();
    }
    let after = rss_bytes();
    drop(semaphores);
    (after - before) as f64 / KEYS as f64
}

/// The leader's budget is 1 KiB of RSS per idle key (issue 11); the core's
/// state must leave room in it for the node's own per-key maps.
const MAX_BYTES_PER_IDLE_KEY: f64 = 1_024.0;

#[test]
fn an_idle_key_holds_little() {
    let bytes = bytes_per_idle_key(&one_permit("scale"));
    println!("core: {bytes:.0} bytes of RSS per idle key");
    assert!(
        bytes <= MAX_BYTES_PER_IDLE_KEY,
        "{bytes:.0} bytes per idle key, budget {MAX_BYTES_PER_IDLE_KEY}"
    );
}
