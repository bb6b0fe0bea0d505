//! `POST /v1/batch` against a real three-node cluster.
//!
//! The checks:
//! - every item is answered on its own, in order, with its own status: a bad
//!   item (a broken limit, an empty key, an unknown message type) fails alone
//!   and changes nothing, its neighbours are granted and synced;
//! - a `request` item's `requestId` replays its answer when the batch is sent
//!   again;
//! - a follower forwards the batch as one call: the leader handles every item,
//!   the follower none (at several shards: each item is handled once, by its
//!   shard's leader, one sub-batch per shard);
//! - the envelope's limits fail the whole call (items, distinct keys);
//! - a runner token is checked item by item (its keys and clientIds), a reader
//!   may not post a batch at all, and no token is 401;
//! - `SemaphoreClient::batch` returns each item's answer or error.

use permitd_client::{BatchItem, ClientConfig, ClientError, ErrorCode, SemaphoreClient};
use permitd_core::contract::protocol::{
    Demand, PermitRequest, PermitSync, SemaphoreRequest, SemaphoreResponse, V1,
};
use permitd_core::limits::{MAX_BATCH_ITEMS, MAX_BATCH_KEYS};
use permitd_tests::{granted, request, Answer, Cluster, Settings};
use reqwest::Method;
use serde_json::{json, Value};

fn item(key: &str, message: Value) -> Value {
    json!({"key": key, "message": message})
}

fn sync(client: &str) -> Value {
    json!({"type": "sync", "v": 1, "clientId": client})
}

fn batch(items: Vec<Value>) -> Value {
    json!({"v": 1, "items": items})
}

fn statuses(answer: &Answer) -> Vec<u64> {
    answer.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["status"].as_u64().expect("status"))
        .collect()
}

/// Lines of node `id`'s `/metrics` that contain every one of `parts`, summed.
async fn metric_sum(cluster: &Cluster, id: u64, parts: &[&str]) -> f64 {
    let url = format!("{}/metrics", cluster.node(id).url());
    let answer = cluster.http.get(url).send().await.expect("metrics");
    let text = answer.text().await.expect("metrics text");
    text.lines()
        .filter(|line| !line.starts_with('#') && parts.iter().all(|part| line.contains(part)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_item_is_answered_alone_and_a_follower_forwards_the_batch_whole() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let mut with_id = request("eu-1", &[("g", 1, 1)]);
    with_id["requestId"] = json!("r-1");
    let mut too_many = request("eu-1", &[("g", 1, 1)]);
    too_many["demand"][0]["count"] = json!(u64::MAX);
    let body = batch(vec![
        item("acct-1", with_id),
        item("acct-2", request("eu-1", &[("g", 2, 1)])),
        item("acct-1", sync("eu-1")),
        item("acct-3", too_many),
        item("", sync("eu-1")),
        item(
            "acct-3",
            json!({"type": "nope", "v": 1, "clientId": "eu-1"}),
        ),
    ]);
    let answer = cluster.post(follower, "/v1/batch", &body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        statuses(&answer),
        [200, 200, 200, 400, 400, 400],
        "{}",
        answer.body
    );
    let items = &answer.body["items"];
    assert_eq!(granted(&items[0]["answer"]), 1, "{}", answer.body);
    assert_eq!(granted(&items[1]["answer"]), 2, "{}", answer.body);
    assert_eq!(items[2]["answer"]["type"], "synced");
    assert_eq!(items[3]["error"]["field"], "demand.count");
    assert_eq!(items[4]["error"]["field"], "key");
    assert_eq!(items[5]["error"]["code"], "bad_request");
    // The bad items changed nothing: acct-3 has no state at all.
    let keys = cluster.get(leader, "/v1/semaphores").await;
    let names: Vec<&str> = keys.body["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .filter_map(|key| key["key"].as_str())
        .collect();
    assert_eq!(names, ["acct-1", "acct-2"], "{}", keys.body);

    // Sent again, the request with a requestId replays its grant.
    let again = cluster.post(leader, "/v1/batch", &body).await;
    assert_eq!(again.body["items"][0]["answer"], items[0]["answer"]);
    assert_ne!(again.body["items"][1]["answer"], items[1]["answer"]);

    // Every item reached exactly one handler: its shard's leader's (a bad
    // item's, the meta shard's leader, which answers its error). At one
    // shard the follower forwarded its batch as one call: the leader handled
    // all six items of each, the follower none.
    let item_shards: Vec<u32> = [
        Some("acct-1"),
        Some("acct-2"),
        Some("acct-1"),
        None,
        None,
        None,
    ]
    .iter()
    .map(|key| key.map_or(0, |key| cluster.shard_of_key(key)))
    .collect();
    let mut leaders = Vec::new();
    for shard in 0..cluster.shard_count() {
        leaders.push(cluster.shard_leader(shard).await);
    }
    let nodes: Vec<u64> = cluster.nodes.iter().map(|node| node.id).collect();
    for node in nodes {
        let handled = item_shards
            .iter()
            .filter(|shard| leaders[**shard as usize] == node)
            .count();
        assert_eq!(
            metric_sum(&cluster, node, &["permitd_batch_items_total"]).await,
            2.0 * handled as f64,
            "node {node}: each batch's items of the shards it leads"
        );
    }
    let leader_calls = ["permitd_http_requests_total", "/v1/batch", "status=\"200\""];
    let calls = if cluster.shard_count() == 1 {
        // The batch sent to the leader, and the follower's forwarded one.
        2
    } else {
        // The batch sent to it, and one sub-batch per shard of the items it
        // leads, per batch (the node called covers every shard by HTTP).
        let led: std::collections::BTreeSet<u32> = item_shards
            .iter()
            .copied()
            .filter(|shard| leaders[*shard as usize] == leader)
            .collect();
        1 + 2 * led.len()
    };
    assert_eq!(
        metric_sum(&cluster, leader, &leader_calls).await,
        calls as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envelope_and_its_limits_fail_the_whole_call() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let over: Vec<Value> = (0..=MAX_BATCH_ITEMS)
        .map(|_| item("k", sync("c")))
        .collect();
    let answer = cluster.post(leader, "/v1/batch", &batch(over)).await;
    assert_eq!(
        (answer.status, &answer.body["error"]["field"]),
        (400, &json!("items"))
    );
    let keys: Vec<Value> = (0..=MAX_BATCH_KEYS)
        .map(|i| item(&format!("k{i}"), sync("c")))
        .collect();
    let answer = cluster.post(leader, "/v1/batch", &batch(keys)).await;
    assert_eq!(
        (answer.status, &answer.body["error"]["field"]),
        (400, &json!("items.key"))
    );
    let answer = cluster.post(leader, "/v1/batch", &batch(vec![])).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    let answer = cluster
        .post(
            leader,
            "/v1/batch",
            &json!({"v": 2, "items": [item("k", sync("c"))]}),
        )
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    // Nothing was applied by any refused call.
    let keys = cluster.get(leader, "/v1/semaphores").await;
    assert_eq!(keys.body["keys"], json!([]), "{}", keys.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_token_is_checked_item_by_item() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let spec =
        json!({"name": "runner", "role": "runner", "keys": ["acct-*"], "clientIds": ["eu-*"]});
    let runner = cluster.post(follower, "/v1/tokens", &spec).await;
    let runner = runner.body["token"].as_str().expect("token").to_owned();
    let reader = cluster
        .post(
            follower,
            "/v1/tokens",
            &json!({"name": "r", "role": "reader"}),
        )
        .await;
    let reader = reader.body["token"].as_str().expect("token").to_owned();
    let body = batch(vec![
        item("acct-1", request("eu-1", &[("g", 1, 1)])),
        item("other", request("eu-1", &[("g", 1, 1)])),
        item("acct-1", sync("us-1")),
        item("acct-2", sync("eu-2")),
    ]);
    let as_runner = cluster
        .call_as(
            Some(&runner),
            follower,
            Method::POST,
            "/v1/batch",
            Some(&body),
        )
        .await;
    assert_eq!(as_runner.status, 200, "{}", as_runner.body);
    assert_eq!(
        statuses(&as_runner),
        [200, 403, 403, 200],
        "{}",
        as_runner.body
    );
    assert_eq!(granted(&as_runner.body["items"][0]["answer"]), 1);
    assert_eq!(as_runner.body["items"][1]["error"]["code"], "forbidden");
    let as_reader = cluster
        .call_as(
            Some(&reader),
            follower,
            Method::POST,
            "/v1/batch",
            Some(&body),
        )
        .await;
    assert_eq!(as_reader.status, 403, "{}", as_reader.body);
    let anonymous = cluster
        .call_as(None, follower, Method::POST, "/v1/batch", Some(&body))
        .await;
    assert_eq!(anonymous.status, 401, "{}", anonymous.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_returns_each_items_answer_or_error() {
    let cluster = Cluster::start(Settings::default()).await;
    let urls: Vec<String> = cluster.nodes.iter().map(|node| node.url()).collect();
    let mut config = ClientConfig::new(urls);
    config.token = Some(permitd_tests::ADMIN_TOKEN.to_owned());
    let client = SemaphoreClient::new(config).expect("client");
    let demand = |count| {
        SemaphoreRequest::Request(PermitRequest {
            v: V1,
            client_id: "eu-1".into(),
            request_id: None,
            demand: vec![Demand {
                group: "g".into(),
                count,
                oldest_at_ms: 1,
            }],
            grants: vec![],
            leases: None,
            wait_ms: None,
        })
    };
    let items = vec![
        BatchItem {
            key: "acct-1".into(),
            message: demand(1),
        },
        BatchItem {
            key: "acct-2".into(),
            message: demand(u64::MAX),
        },
        BatchItem {
            key: "acct-2".into(),
            message: SemaphoreRequest::Sync(PermitSync {
                v: V1,
                client_id: "eu-1".into(),
                grants: vec![],
                leases: None,
            }),
        },
    ];
    let results = client.batch(items).await.expect("batch");
    assert_eq!(results.len(), 3);
    match &results[0] {
        Ok(SemaphoreResponse::Grant(grant)) => assert_eq!(grant.grants[0].permits, 1),
        other => panic!("expected a grant, got {other:?}"),
    }
    match &results[1] {
        Err(error @ ClientError::Rejected { status: 400, .. }) => {
            assert_eq!(error.code(), Some(ErrorCode::BadRequest));
            assert_eq!(error.field(), Some("demand.count"));
        }
        other => panic!("expected a 400, got {other:?}"),
    }
    assert!(
        matches!(results[2], Ok(SemaphoreResponse::Synced(_))),
        "{:?}",
        results[2]
    );
    // The grant's nextRequestAt was remembered for its key, as `request` does.
    assert!(client.next_request_at_ms("acct-1").is_some());
}
