//! Snapshots on a time budget: a cluster that applies a few entries, far fewer
//! than `snapshot_every_logs`, still snapshots once `snapshot_every_ms` passed.

use std::time::Duration;

use permitd_tests::{eventually, request, Cluster, Settings};

/// `permitd_snapshot_bytes` as node `id` exports it, if it built one.
async fn snapshot_bytes(cluster: &Cluster, id: u64) -> Option<f64> {
    let url = format!("{}/metrics", cluster.node(id).url());
    let text = cluster.http.get(url).send().await.ok()?.text().await.ok()?;
    text.lines()
        .find(|line| line.starts_with("permitd_snapshot_bytes "))
        .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_snapshots_within_its_time_budget() {
    let cluster = Cluster::start(Settings {
        raft_toml: "snapshot_every_ms = 1000\n".into(),
        ..Settings::default()
    })
    .await;
    let leader = cluster.wait_for_leader().await;
    for client in ["a", "b", "c"] {
        let answer = cluster
            .post(
                leader,
                "/v1/semaphores/slow",
                &request(client, &[("g", 1, 1)]),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    // Well under `snapshot_every_logs` (500 in the harness): only the time
    // budget can trigger these. Node 3 waits 1.5 s.
    let all_built = eventually(Duration::from_secs(10), || async {
        for id in [1, 2, 3] {
            if snapshot_bytes(&cluster, id)
                .await
                .is_none_or(|bytes| bytes <= 0.0)
            {
                return false;
            }
        }
        true
    })
    .await;
    assert!(all_built, "every node built a snapshot");
    let index = cluster.status(leader).await.unwrap()["lastLogIndex"]
        .as_u64()
        .unwrap();
    assert!(index < 500, "the entry budget was not reached: {index}");
}
