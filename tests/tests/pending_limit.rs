//! Requests parked for one key's round are bounded: beyond the node's
//! `[limits] max_pending_per_key`, a request gets 429 `too_many_pending` with
//! `Retry-After`, and the ones already parked are not disturbed. So is all the
//! leader holds: beyond `[limits] max_parked_messages`, 503 `overloaded`.
use permitd_tests::{wait_for_pending, Cluster, Settings};
use serde_json::{json, Value};

fn request(client: &str) -> Value {
    json!({"type": "request", "v": 1, "clientId": client,
           "demand": [{"group": "g", "count": 1, "oldestAt": 1}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_pending_bound_get_429_with_retry_after() {
    let settings = Settings {
        extra_toml: "[limits]\nmax_pending_per_key = 2\n".into(),
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let leader = cluster.wait_for_leader().await;
    // A long round wait keeps the first requests parked while the test runs.
    let slow = json!({"limit": 10, "roundWaitMs": 60000, "roundPeriodMs": 60000});
    let answer = cluster
        .put(leader, "/v1/semaphores/slow/config", &slow)
        .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);

    let url = format!("{}/v1/semaphores/slow", cluster.node(leader).url());
    let parked: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|client| {
            let http = cluster.http.clone();
            let (url, body) = (url.clone(), request(client));
            tokio::spawn(async move { http.post(url).json(&body).send().await })
        })
        .collect();
    wait_for_pending(&cluster, leader, 2).await;

    let refused = cluster
        .post(leader, "/v1/semaphores/slow", &request("c"))
        .await;
    assert_eq!(refused.status, 429, "{:?}", refused.body);
    assert_eq!(refused.body["error"]["code"], "too_many_pending");
    assert!(refused.retry_after.is_some(), "429 carries Retry-After");
    // The refusal changed nothing: both parked requests still wait, and another
    // key is not affected by this key's bound.
    wait_for_pending(&cluster, leader, 2).await;
    let other = cluster
        .post(leader, "/v1/semaphores/fast", &request("c"))
        .await;
    assert_eq!(other.status, 200, "{:?}", other.body);
    for task in parked {
        task.abort();
    }
}

/// The leader's bound on everything waiting, all keys together: beyond `[limits]
/// max_parked_messages` a request to any key gets 503 `overloaded` with
/// `Retry-After`, and the ones already waiting are not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_leaders_parked_bound_get_503_overloaded() {
    let settings = Settings {
        extra_toml: "[limits]\nmax_parked_messages = 2\n".into(),
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let leader = cluster.wait_for_leader().await;
    let slow = json!({"limit": 10, "roundWaitMs": 60000, "roundPeriodMs": 60000});
    for key in ["one", "two", "three"] {
        let path = format!("/v1/semaphores/{key}/config");
        let answer = cluster.put(leader, &path, &slow).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
    }
    // One request waits on each of two keys: the leader's bound, not a key's.
    let parked: Vec<_> = ["one", "two"]
        .into_iter()
        .map(|key| {
            let http = cluster.http.clone();
            let url = format!("{}/v1/semaphores/{key}", cluster.node(leader).url());
            let body = request("a");
            tokio::spawn(async move { http.post(url).json(&body).send().await })
        })
        .collect();
    wait_for_pending(&cluster, leader, 2).await;

    let refused = cluster
        .post(leader, "/v1/semaphores/three", &request("b"))
        .await;
    assert_eq!(refused.status, 503, "{:?}", refused.body);
    assert_eq!(refused.body["error"]["code"], "overloaded");
    assert!(refused.retry_after.is_some(), "503 carries Retry-After");
    wait_for_pending(&cluster, leader, 2).await;
    for task in parked {
        task.abort();
    }
}
