//! The files under `deploy/` work with the real binary: the systemd unit passes
//! `systemd-analyze verify`, and a node started the way the unit and the compose
//! file start it (settings from `PERMITD_*` variables over a cluster file) serves.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use permitd_tests::{eventually, free_port, permitd_bin};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Kills the node on drop, whatever the test did.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_systemd_unit_verifies() {
    let Ok(probe) = Command::new("systemd-analyze").arg("--version").output() else {
        println!("skipped: systemd-analyze is not installed");
        return;
    };
    assert!(probe.status.success(), "systemd-analyze --version failed");
    let unit = std::fs::read_to_string(repository().join("deploy/systemd/permitd.service"))
        .expect("the unit file");
    assert!(unit.contains("ExecStart=/usr/local/bin/permitd "), "{unit}");
    // verify checks that the command exists: point it at the binary under test.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("permitd.service");
    let local = unit.replace(
        "/usr/local/bin/permitd",
        &permitd_bin().display().to_string(),
    );
    std::fs::write(&path, local).expect("unit copy");
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && !stderr.contains("permitd.service:"),
        "systemd-analyze verify: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_the_compose_cluster_file_serves_with_environment_overrides() {
    let data = tempfile::tempdir().expect("temp dir");
    let api = format!("127.0.0.1:{}", free_port());
    let raft = format!("127.0.0.1:{}", free_port());
    // As the unit and the compose file do: everything from the environment.
    let child = Command::new(permitd_bin())
        .args(["--log-format", "json", "serve"])
        .env(
            "PERMITD_CONFIG",
            repository().join("deploy/cluster.compose.toml"),
        )
        .env("PERMITD_ID", "1")
        .env("PERMITD_SECRET", "a-secret-from-the-environment-0123")
        .env("PERMITD_NODE_1_API_ADDR", &api)
        .env("PERMITD_NODE_1_RAFT_ADDR", &raft)
        .env("PERMITD_NODE_1_DATA_DIR", data.path())
        .env("PERMITD_RAFT_RPC_TIMEOUT_MS", "700")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("permitd starts");
    let _guard = Guard(child);
    let http = reqwest::Client::new();
    let healthy = eventually(Duration::from_secs(20), || async {
        http.get(format!("http://{api}/healthz"))
            .send()
            .await
            .is_ok_and(|answer| answer.status().is_success())
    })
    .await;
    assert!(healthy, "the node listens on the overridden address");
    // The secret from the environment guards /cluster/, not the file's.
    let status = |secret: &'static str| {
        let http = http.clone();
        let url = format!("http://{api}/cluster/status");
        async move {
            http.get(url)
                .bearer_auth(secret)
                .send()
                .await
                .expect("status answers")
                .status()
                .as_u16()
        }
    };
    assert_eq!(status("a-secret-from-the-environment-0123").await, 200);
    assert_eq!(status("set-PERMITD_SECRET-instead-of-this").await, 401);
    assert!(
        std::fs::read_dir(data.path())
            .expect("data dir")
            .next()
            .is_some(),
        "the node keeps its data in the overridden data_dir"
    );
}
