//! The README's Rust example, run as a new user runs it: the example binary
//! against a three-node cluster with auth on, as `permitd up` starts it. It
//! must configure its key (an admin call), hold a permit and finish; an example
//! that cannot authenticate fails here rather than on a newcomer's screen.
//! (The Python example runs in `client/python/run-tests.sh`.)

use std::path::PathBuf;
use std::process::Command;

use permitd_tests::{Cluster, Settings, ADMIN_TOKEN};

/// `target/<profile>/examples/with_permit`, which `cargo test` builds beside
/// this test (`target/<profile>/deps/<test>`).
fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    let profile_dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("the test runs from target/<profile>/deps");
    profile_dir.join("examples").join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_rust_example_runs_against_a_cluster_with_auth() {
    let bin = example_bin("with_permit");
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .args(["build", "-p", "permitd-client", "--example", "with_permit"])
            .status()
            .expect("cargo runs");
        assert!(built.success(), "the example builds");
    }
    let cluster = Cluster::start(Settings::default()).await;
    let endpoints: Vec<String> = cluster.nodes.iter().map(|node| node.url()).collect();
    let output = tokio::process::Command::new(&bin)
        .env("PERMITD_ENDPOINTS", endpoints.join(","))
        .env("PERMITD_TOKEN", ADMIN_TOKEN)
        .output()
        .await
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the example failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("holding 1 permit of acct-42"), "{stdout}");
    assert!(stdout.contains("report done: 1234 rows"), "{stdout}");
}
