//! The deployment files name only metrics a live node exports: every `permitd_*`
//! name in `deploy/grafana/permitd.json` and `deploy/prometheus/alerts.yml` is
//! found in the `/metrics` of a real three-node cluster after some traffic.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use permitd_tests::{eventually, request, Cluster, Settings};
use serde_json::json;

/// Entries written so that every node builds a snapshot (the harness snapshots
/// every 500 logs).
const ENTRIES_FOR_A_SNAPSHOT: usize = 520;

fn deploy_file(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// Every `permitd_…` metric name a file mentions.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("permitd_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// Whether the exposition has a sample line of `name`, or of the histogram
/// `name` (its `_bucket`, `_sum` or `_count` series).
fn exported(exposition: &str, name: &str) -> bool {
    let sample = |line: &str, name: &str| {
        line.strip_prefix(name)
            .is_some_and(|tail| tail.starts_with('{') || tail.starts_with(' '))
    };
    exposition.lines().any(|line| {
        sample(line, name)
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|suffix| sample(line, &format!("{name}{suffix}")))
    })
}

async fn scrape_all(cluster: &Cluster) -> String {
    let mut text = String::new();
    for node in &cluster.nodes {
        let url = format!("{}/metrics", node.url());
        let answer = cluster.http.get(url).send().await.expect("metrics answer");
        text.push_str(&answer.text().await.expect("metrics text"));
    }
    text
}

#[test]
fn the_deploy_files_name_metrics() {
    let names = metric_names(&deploy_file("deploy/grafana/permitd.json"));
    assert!(names.len() >= 20, "the dashboard names {names:?}");
    let names = metric_names(&deploy_file("deploy/prometheus/alerts.yml"));
    assert!(names.len() >= 8, "the alert rules name {names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_name_is_exported() {
    let cluster = Arc::new(Cluster::start(Settings::default()).await);
    let leader = cluster.wait_for_leader().await;
    let config = json!({"limit": 10});
    let answer = cluster
        .put(leader, "/v1/semaphores/m/config", &config)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let first = cluster
        .post(leader, "/v1/semaphores/m", &request("a", &[("g", 8, 1)]))
        .await;
    assert_eq!(first.status, 200, "{}", first.body);
    // Asks for more than is left: some permits stay queued (blocked).
    let second = cluster
        .post(leader, "/v1/semaphores/m", &request("b", &[("g", 5, 1)]))
        .await;
    assert_eq!(second.status, 200, "{}", second.body);

    // One sync at a time: syncs that arrive together share one log entry, and
    // the snapshot needs entries.
    let sync = json!({"type": "sync", "v": 1, "clientId": "a"});
    for entry in 0..ENTRIES_FOR_A_SNAPSHOT {
        let answer = cluster.post(leader, "/v1/semaphores/m", &sync).await;
        assert_eq!(answer.status, 200, "sync {entry}: {}", answer.body);
    }

    let mut wanted = metric_names(&deploy_file("deploy/grafana/permitd.json"));
    wanted.extend(metric_names(&deploy_file("deploy/prometheus/alerts.yml")));
    let missing = Arc::new(std::sync::Mutex::new(wanted.clone()));
    let all_found = eventually(Duration::from_secs(20), || {
        let (cluster, wanted, missing) = (cluster.clone(), wanted.clone(), missing.clone());
        async move {
            let exposition = scrape_all(&cluster).await;
            let absent: BTreeSet<String> = wanted
                .into_iter()
                .filter(|name| !exported(&exposition, name))
                .collect();
            let done = absent.is_empty();
            *missing.lock().expect("missing lock") = absent;
            done
        }
    })
    .await;
    assert!(all_found, "not exported by any node: {missing:?}");

    // The route label is the template, never the raw path with a key in it.
    let exposition = scrape_all(&cluster).await;
    assert!(
        exposition.contains(r#"route="/v1/semaphores/{key}""#),
        "{exposition}"
    );
    assert!(!exposition.contains(r#"route="/v1/semaphores/m""#));
}
