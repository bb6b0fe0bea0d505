//! `cargo run --release -p permitd-tests --bin bench [-- --quick] [--only a,b]
//! [--grant clients,keys,wait_ms] [--seconds n]`
//!
//! Starts its own three-node cluster on loopback with the release `permitd`
//! (built first unless `PERMITD_BIN` names one), runs the profile, prints the
//! markdown table and writes the JSON under `<target>/bench/`.
//! Sections for `--only`: floor, grant, messages, lease, failover, scale, shards,
//! shard-failover.

use std::path::PathBuf;
use std::process::Command;

use permitd_tests::bench::{self, Profile};

/// The runners' allocator: the same as the `permitd` binary's, so the client
/// side of a run costs what an application using it would pay.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(bench::threads_per_process()))
        .enable_all()
        .build()
        .expect("the bench's runtime")
        .block_on(run());
}

async fn run() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut profile = if args.iter().any(|arg| arg == "--quick") {
        Profile::quick()
    } else {
        Profile::full()
    };
    if let Some(position) = args.iter().position(|arg| arg == "--only") {
        let list = args.get(position + 1).expect("--only takes a list");
        profile.only = list.split(',').map(str::to_owned).collect();
    }
    if let Some(position) = args.iter().position(|arg| arg == "--grant") {
        // One grant-path scenario, `clients,keys,wait_ms` (for profiling).
        let values: Vec<u64> = args
            .get(position + 1)
            .expect("--grant takes clients,keys,wait_ms")
            .split(',')
            .map(|value| value.parse().expect("a number"))
            .collect();
        profile.grant_clients = vec![values[0] as usize];
        profile.grant_keys = vec![values[1] as usize];
        profile.round_waits_ms = vec![values[2]];
    }
    if let Some(position) = args.iter().position(|arg| arg == "--seconds") {
        let seconds: u64 = args[position + 1]
            .parse()
            .expect("--seconds takes a number");
        profile.measure = std::time::Duration::from_secs(seconds);
        profile.lease_measure = profile.measure;
    }
    if std::env::var_os("PERMITD_BIN").is_none() {
        std::env::set_var("PERMITD_BIN", release_permitd());
    }
    eprintln!(
        "bench: profile {}, permitd {}",
        profile.name,
        std::env::var("PERMITD_BIN").unwrap_or_default()
    );
    let report = bench::run(&profile).await;
    println!("{}", report.markdown());
    match report.save(&bench::target_dir()) {
        Ok(path) => eprintln!("bench: JSON written to {}", path.display()),
        Err(error) => eprintln!("bench: cannot write the JSON: {error}"),
    }
}

/// `permitd` next to this executable, (re)built in release mode so it matches
/// the sources.
fn release_permitd() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let dir = exe.parent().expect("the executable's folder");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "-p", "permitd", "--bin", "permitd"])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build --release -p permitd failed");
    dir.join(format!("permitd{}", std::env::consts::EXE_SUFFIX))
}
