//! The cluster defaults from `cluster.toml` are written even when the write
//! right after `/cluster/init` cannot happen, and survive restarts; defaults an
//! operator set later are never overwritten by the file's.

use std::time::Duration;

use permitd_tests::{eventually, Cluster, Settings, ADMIN_TOKEN};
use serde_json::json;

/// The file's `[defaults]`: a limit no built-in default has.
const FILE_LIMIT: u64 = 7;

fn settings() -> Settings {
    Settings {
        defaults: format!("limit = {FILE_LIMIT}\nroundWaitMs = 20\nroundPeriodMs = 20\n"),
        ..Settings::default()
    }
}

/// The limit a key without its own settings runs with, as node `id` answers.
async fn default_limit(cluster: &Cluster, id: u64) -> Option<u64> {
    let answer = cluster
        .get(id, "/v1/semaphores/never-configured/config")
        .await;
    (answer.status == 200)
        .then(|| answer.body["limit"].as_u64())
        .flatten()
}

async fn every_node_has_limit(cluster: &Cluster, limit: u64) -> bool {
    eventually(Duration::from_secs(20), || async {
        for id in [1, 2, 3] {
            if default_limit(cluster, id).await != Some(limit) {
                return false;
            }
        }
        true
    })
    .await
}

/// Waits until `leader` has decided about the defaults and every running node
/// applied what it then wrote. Its defaults task decides right after its first
/// linearizable read (its term's first entry applied) and would propose at
/// once; two writes of ours answered through it come after that read and
/// give its proposal, if any, the time to be appended before them.
async fn leader_settled(cluster: &Cluster, leader: u64) {
    for n in 0..2 {
        let path = format!("/v1/semaphores/settled-{leader}-{n}/config");
        let written = eventually(Duration::from_secs(20), || async {
            cluster
                .put(leader, &path, &json!({"limit": 1}))
                .await
                .status
                == 200
        })
        .await;
        assert!(written, "leader {leader} takes writes");
    }
    cluster.wait_applied_everywhere(leader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_are_written_after_an_init_whose_write_failed() {
    let mut cluster = Cluster::spawn(settings());
    // Node 1 alone: it initialises the cluster but cannot elect a leader, so
    // the defaults cannot be written while the init call waits.
    cluster.kill(2);
    cluster.kill(3);
    cluster.wait_healthy().await;
    let init = reqwest::Client::new()
        .post(format!("{}/cluster/init", cluster.node(1).url()))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({}))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(init.is_err(), "no quorum, so init cannot answer in 2 s");
    // The node that ran init goes down before any leader exists: nothing of
    // that call is left to finish the write.
    cluster.kill(1);
    for id in [1, 2, 3] {
        cluster.restart(id);
    }
    cluster.wait_healthy().await;
    cluster.wait_for_leader().await;
    assert!(
        every_node_has_limit(&cluster, FILE_LIMIT).await,
        "the file's defaults reach every node"
    );

    // Every node restarted on its data still has them.
    for id in [1, 2, 3] {
        cluster.stop(id);
    }
    for id in [1, 2, 3] {
        cluster.restart(id);
    }
    cluster.wait_healthy().await;
    cluster.wait_for_leader().await;
    assert!(every_node_has_limit(&cluster, FILE_LIMIT).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_set_by_an_operator_survive_restarts_and_leader_changes() {
    let mut cluster = Cluster::start(settings()).await;
    let leader = cluster.wait_for_leader().await;
    assert_eq!(default_limit(&cluster, leader).await, Some(FILE_LIMIT));
    let set = cluster
        .put(leader, "/cluster/defaults", &json!({"limit": 9}))
        .await;
    assert_eq!(set.status, 200, "{}", set.body);
    for id in [1, 2, 3] {
        cluster.stop(id);
    }
    for id in [1, 2, 3] {
        cluster.restart(id);
    }
    cluster.wait_healthy().await;
    let leader = cluster.wait_for_leader().await;
    // A new leader that wrongly took the defaults as missing would write the
    // file's limit again; wait until it has had its chance.
    leader_settled(&cluster, leader).await;
    assert!(
        every_node_has_limit(&cluster, 9).await,
        "the operator's limit stays"
    );
    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader().await;
    leader_settled(&cluster, new_leader).await;
    for id in [1, 2, 3].into_iter().filter(|&id| id != leader) {
        assert_eq!(default_limit(&cluster, id).await, Some(9));
    }
}
