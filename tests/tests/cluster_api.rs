//! The v1 API on every node of a three-node cluster: forwarding, linearizable
//! usage, the error shapes, health and metrics.

use permitd_tests::{granted, request, Cluster, Settings, ADMIN_TOKEN, SECRET};
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_usage_through_a_follower_agree_on_every_node() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let answer = cluster
        .post(
            follower,
            "/v1/semaphores/shared",
            &request("c1", &[("g", 30, 1)]),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.leader, Some(leader));
    assert_eq!(granted(&answer.body), 30);
    let sync = json!({"type": "sync", "v": 1, "clientId": "c1", "grants": [
        {"grantId": answer.body["grants"][0]["grantId"], "claimed": 30, "released": 5}]});
    assert_eq!(
        cluster
            .post(follower, "/v1/semaphores/shared", &sync)
            .await
            .status,
        200
    );
    let usages: Vec<_> = futures_usage(&cluster, "shared").await;
    for usage in &usages {
        assert_eq!(usage, &usages[0], "every node reads the same usage");
    }
    assert_eq!(usages[0]["granted"], 25);
    assert_eq!(usages[0]["available"], 75);

    let list = cluster.get(follower, "/v1/semaphores").await;
    assert_eq!(list.status, 200);
    assert_eq!(list.body["keys"][0]["key"], "shared");
    let config = cluster.get(follower, "/v1/semaphores/shared/config").await;
    assert_eq!(config.body["roundWaitMs"], 20, "defaults from cluster.toml");
    // An unconfigured key is no error: defaults and zero usage.
    let fresh = cluster.usage(follower, "never-seen").await;
    assert_eq!(fresh["granted"], 0);
    assert_eq!(fresh["limit"], 100);

    // Every shard and its leader, as the leader and a follower see it (the
    // follower forwarded the call above, so knows the key's shard's leader).
    let count = permitd_tests::cluster::shards_from_env().unwrap_or(1) as usize;
    let key_shard = permitd_core::shard::shard_of("shared", count as u32).unwrap() as usize;
    for node in [leader, follower] {
        let map = cluster.get(node, "/cluster/shards").await;
        assert_eq!(map.status, 200, "{}", map.body);
        assert_eq!(map.body["id"], node);
        let shards = map.body["shards"].as_array().expect("a list of shards");
        assert_eq!(shards.len(), count, "{}", map.body);
        assert_eq!(shards[key_shard]["shard"], key_shard);
        assert_eq!(shards[key_shard]["leader"], answer.leader.unwrap());
        assert_eq!(shards[key_shard]["members"], json!([1, 2, 3]));
        assert!(shards[key_shard]["appliedIndex"].as_u64().unwrap_or(0) > 0);
    }
}

async fn futures_usage(cluster: &Cluster, key: &str) -> Vec<serde_json::Value> {
    let mut usages = Vec::new();
    for node in [1, 2, 3] {
        usages.push(cluster.usage(node, key).await);
    }
    usages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_answer_json_errors_and_change_nothing() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let before = cluster.status(leader).await.unwrap()["lastLogIndex"].clone();
    bad_messages_answer_400_naming_the_field(&cluster, leader, follower).await;
    bodies_of_the_wrong_type_or_size_are_refused(&cluster, follower).await;
    a_bad_configuration_names_its_field(&cluster, leader).await;
    unknown_routes_and_methods_answer_json(&cluster, leader).await;
    let after = cluster.status(leader).await.unwrap()["lastLogIndex"].clone();
    assert_eq!(before, after, "no rejected call reached the log");
    assert_eq!(cluster.usage(leader, "strict").await["granted"], 0);
}

const REJECTED_PATH: &str = "/v1/semaphores/strict";

/// On the leader and through a follower alike.
async fn bad_messages_answer_400_naming_the_field(cluster: &Cluster, leader: u64, follower: u64) {
    let path = REJECTED_PATH;
    for (body, what, field) in [
        (
            json!({"type": "request", "v": 2, "clientId": "c"}),
            "version",
            None,
        ),
        (
            json!({"type": "grab", "v": 1, "clientId": "c"}),
            "type",
            None,
        ),
        (
            request("c", &[("g", 1, 1)])
                .as_object()
                .map(|m| {
                    let mut m = m.clone();
                    m["demand"][0]["count"] = json!(-1);
                    serde_json::Value::Object(m)
                })
                .unwrap(),
            "negative count",
            None,
        ),
        (
            json!({"type": "request", "v": 1, "clientId": ""}),
            "empty client",
            Some("clientId"),
        ),
        (
            json!({"type": "request", "v": 1, "clientId": "c", "demand": [
            {"group": "g", "count": 1, "oldestAt": 1}, {"group": "g", "count": 1, "oldestAt": 1}]}),
            "duplicate group",
            Some("demand.group"),
        ),
    ] {
        for node in [leader, follower] {
            let answer = cluster.post(node, path, &body).await;
            assert_eq!(answer.status, 400, "{what}: {}", answer.body);
            assert_eq!(answer.code(), "bad_request", "{what}");
            assert_eq!(answer.body["error"]["field"].as_str(), field, "{what}");
        }
    }
}

async fn bodies_of_the_wrong_type_or_size_are_refused(cluster: &Cluster, follower: u64) {
    let url = format!("{}{REJECTED_PATH}", cluster.node(follower).url());
    let not_json = cluster.http.post(&url).body("{}").send().await.unwrap();
    assert_eq!(not_json.status(), 415);
    let broken = cluster
        .http
        .post(&url)
        .header("content-type", "application/json")
        .body("{\"type\":")
        .send()
        .await
        .unwrap();
    assert_eq!(broken.status(), 400);
    let huge = cluster
        .http
        .post(&url)
        .header("content-type", "application/json")
        .body(vec![b' '; 2 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), 413);
}

async fn a_bad_configuration_names_its_field(cluster: &Cluster, leader: u64) {
    let bad_config = cluster
        .put(
            leader,
            "/v1/semaphores/strict/config",
            &json!({"roundWaitMs": 0}),
        )
        .await;
    assert_eq!(bad_config.status, 400, "{}", bad_config.body);
    assert_eq!(bad_config.body["error"]["field"], "roundWaitMs");
}

async fn unknown_routes_and_methods_answer_json(cluster: &Cluster, leader: u64) {
    let unknown = cluster.get(leader, "/v2/nothing").await;
    assert_eq!((unknown.status, unknown.code()), (404, "not_found"));
    // A key answers POST (messages) and DELETE (an admin's delete), not PUT.
    let method = cluster.call(leader, Method::PUT, REJECTED_PATH, None).await;
    assert_eq!(method.status, 405);
    assert!(method.body["error"]["message"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_secret_opens_raft_only_and_health_and_metrics_answer() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let node = cluster.node(leader);
    let vote = format!("http://{}/raft/vote", node.raft_addr);
    let answer = cluster
        .http
        .post(&vote)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 401);
    let wrong = cluster
        .http
        .get(format!("{}/cluster/status", node.url()))
        .bearer_auth("not-the-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let init_again = cluster
        .post_admin(leader, "/cluster/init", &json!({}))
        .await;
    assert_eq!(init_again.0, 409, "{}", init_again.1);
    // The peer secret is no admin token, and the Raft listener serves /raft only.
    let with_secret = cluster
        .http
        .get(format!("{}/cluster/status", node.url()))
        .bearer_auth(SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(with_secret.status(), 401);
    let on_raft_port = cluster
        .http
        .get(format!("http://{}/cluster/status", node.raft_addr))
        .bearer_auth(SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(
        on_raft_port.status(),
        404,
        "the raft listener serves /raft (and /cluster/restore) only"
    );

    for path in ["/healthz", "/readyz"] {
        assert_eq!(cluster.get(leader, path).await.status, 200, "{path}");
    }
    // Every node serves the checked-in OpenAPI document, without a token.
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
    let checked_in: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    for node in &cluster.nodes {
        let served = cluster
            .call_as(None, node.id, Method::GET, "/openapi.json", None)
            .await;
        assert_eq!(served.status, 200, "node {}", node.id);
        assert!(
            served.body == checked_in,
            "node {} serves another document",
            node.id
        );
    }
    let round = cluster
        .post(
            leader,
            "/v1/semaphores/metered",
            &request("c", &[("g", 1, 1)]),
        )
        .await;
    assert_eq!(round.status, 200);
    let metrics = cluster
        .http
        .get(format!("{}/metrics", node.url()))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "permitd_rounds_total",
        "permitd_round_duration_seconds_bucket",
        "permitd_key_granted{key=\"metered\"} 1",
        "permitd_key_available{key=\"metered\"} 99",
        "permitd_leader_changes_total",
        "permitd_pending_requests",
    ] {
        assert!(metrics.contains(name), "{name} missing from\n{metrics}");
    }
}
