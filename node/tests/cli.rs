//! The binary's command line. Besides checking it, this test makes `cargo test
//! --workspace` build `target/debug/permitd`, which the end-to-end tests in the
//! `permitd-tests` package run.

use std::process::Command;

#[test]
fn help_names_both_subcommands() {
    let output = Command::new(env!("CARGO_BIN_EXE_permitd"))
        .arg("--help")
        .output()
        .expect("permitd runs");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("serve") && help.contains("up"), "{help}");
}

#[test]
fn serve_with_an_unknown_node_id_fails_cleanly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        r#"secret = "0123456789abcdef0123"
[auth]
admin_token = "0123456789abcdef0123"
[[node]]
id = 1
api_addr = "127.0.0.1:1"
raft_addr = "127.0.0.1:2"
data_dir = "d""#,
    )
    .expect("config written");
    let output = Command::new(env!("CARGO_BIN_EXE_permitd"))
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--id", "7"])
        .output()
        .expect("permitd runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("node 7 is not in the cluster file"));
}

#[test]
fn serve_refuses_a_missing_or_short_admin_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("cluster.toml");
    let node = "[[node]]\nid = 1\napi_addr = \"127.0.0.1:1\"\nraft_addr = \"127.0.0.1:2\"\ndata_dir = \"d\"\n";
    for (auth, expected) in [
        ("", "admin_token"),
        ("[auth]\nadmin_token = \"short\"\n", "at least 16 bytes"),
    ] {
        let text = format!("secret = \"0123456789abcdef0123\"\n{auth}{node}");
        std::fs::write(&config, text).expect("config written");
        let output = Command::new(env!("CARGO_BIN_EXE_permitd"))
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--id", "1"])
            .env_remove("PERMITD_ADMIN_TOKEN")
            .output()
            .expect("permitd runs");
        assert!(!output.status.success(), "{auth}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{auth}: {stderr}");
    }
}
