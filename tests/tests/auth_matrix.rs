//! Who may call what, against a real three-node cluster: every route × every
//! kind of caller, with the exact status; every refusal leaves the log as it
//! was (`lastLogIndex` unchanged). Calls go through a follower, which forwards
//! the caller's own token: the leader decides.
//!
//! Then revocation: a revoked token is refused by every node as soon as each
//! has applied the revocation, and still after a restart.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use permitd_tests::{eventually, request, Cluster, Settings};

/// The callers of the matrix, in column order.
const CALLERS: [&str; 8] = [
    "none",
    "unknown",
    "runner",
    "runner_other_key",
    "runner_foreign_client",
    "reader",
    "admin",
    "revoked",
];

/// One route and the status each caller gets, in [`CALLERS`] order.
struct Row {
    method: Method,
    /// `{key}` and `{client}` are the caller's key and clientId.
    path: &'static str,
    body: Option<Value>,
    expected: [u16; 8],
}

fn row(method: Method, path: &'static str, body: Option<Value>, expected: [u16; 8]) -> Row {
    Row {
        method,
        path,
        body,
        expected,
    }
}

/// The table as built (README "Security" documents the same).
fn table(throwaway_token: u64) -> Vec<Row> {
    let sync = json!({"type": "sync", "v": 1, "clientId": "{client}"});
    let group = json!({"limit": 5, "permitted": true});
    let token = json!({"name": "t", "role": "reader"});
    // Leaked into a static path: the matrix runs once per process.
    let revoke_path: &'static str =
        Box::leak(format!("/v1/tokens/{throwaway_token}").into_boxed_str());
    //                                                        none unkn run  rkey rcli read admn revk
    vec![
        row(
            Method::POST,
            "/v1/semaphores/{key}",
            Some(request("{client}", &[("g", 1, 1)])),
            [401, 401, 200, 403, 403, 403, 200, 401],
        ),
        row(
            Method::POST,
            "/v1/semaphores/{key}",
            Some(sync.clone()),
            [401, 401, 200, 403, 403, 403, 200, 401],
        ),
        // A batch's call needs a role that may post; its items are decided one
        // by one inside it (tests/tests/batch.rs checks those statuses).
        row(
            Method::POST,
            "/v1/batch",
            Some(json!({"v": 1, "items": [{"key": "{key}", "message": sync}]})),
            [401, 401, 200, 200, 200, 403, 200, 401],
        ),
        row(
            Method::GET,
            "/v1/semaphores/{key}/usage",
            None,
            [401, 401, 200, 403, 200, 200, 200, 401],
        ),
        row(
            Method::GET,
            "/v1/semaphores/{key}/config",
            None,
            [401, 401, 403, 403, 403, 200, 200, 401],
        ),
        row(
            Method::PUT,
            "/v1/semaphores/{key}/config",
            Some(json!({"limit": 50})),
            [401, 401, 403, 403, 403, 403, 200, 401],
        ),
        row(
            Method::PUT,
            "/v1/semaphores/{key}/groups/g",
            Some(group),
            [401, 401, 403, 403, 403, 403, 200, 401],
        ),
        row(
            Method::DELETE,
            "/v1/semaphores/{key}/groups/g",
            None,
            [401, 401, 403, 403, 403, 403, 204, 401],
        ),
        // Deleting a key: admins only. The posts above left grants on it, so
        // without `force` the admin passes auth and gets 409 `key_in_use`.
        row(
            Method::DELETE,
            "/v1/semaphores/{key}",
            None,
            [401, 401, 403, 403, 403, 403, 409, 401],
        ),
        row(
            Method::GET,
            "/v1/semaphores",
            None,
            [401, 401, 403, 403, 403, 200, 200, 401],
        ),
        row(
            Method::POST,
            "/v1/tokens",
            Some(token),
            [401, 401, 403, 403, 403, 403, 201, 401],
        ),
        row(
            Method::GET,
            "/v1/tokens",
            None,
            [401, 401, 403, 403, 403, 403, 200, 401],
        ),
        row(
            Method::DELETE,
            revoke_path,
            None,
            [401, 401, 403, 403, 403, 403, 204, 401],
        ),
        row(
            Method::GET,
            "/metrics",
            None,
            [401, 401, 403, 403, 403, 200, 200, 401],
        ),
        // Passing auth, the stream opens (from the first event: this node
        // holds every event since the cluster began): 200.
        row(
            Method::GET,
            "/v1/events?key={key}&from=0",
            None,
            [401, 401, 200, 403, 200, 200, 200, 401],
        ),
        // Every key's events: not for a runner, whose tokens name keys.
        row(
            Method::GET,
            "/v1/events?from=0",
            None,
            [401, 401, 403, 403, 403, 200, 200, 401],
        ),
        row(
            Method::GET,
            "/ui",
            None,
            [200, 200, 200, 200, 200, 200, 200, 200],
        ),
        row(
            Method::GET,
            "/ui/app.js",
            None,
            [200, 200, 200, 200, 200, 200, 200, 200],
        ),
        // Who holds a key's permits: read-only, for readers too.
        row(
            Method::GET,
            "/v1/semaphores/{key}/holders",
            None,
            [401, 401, 403, 403, 403, 200, 200, 401],
        ),
        // Dropping a client's footprint: admins only (a client holding nothing
        // gets zeros).
        row(
            Method::POST,
            "/v1/semaphores/{key}/clients/{client}/release",
            None,
            [401, 401, 403, 403, 403, 403, 200, 401],
        ),
        row(
            Method::DELETE,
            "/v1/semaphores/{key}?force=true",
            None,
            [401, 401, 403, 403, 403, 403, 200, 401],
        ),
        row(
            Method::GET,
            "/cluster/snapshot",
            None,
            [401, 401, 403, 403, 403, 403, 200, 401],
        ),
        // Not a backup: the admin passes auth and gets the validation error.
        row(
            Method::POST,
            "/cluster/restore",
            Some(json!({})),
            [401, 401, 403, 403, 403, 403, 400, 401],
        ),
        row(
            Method::GET,
            "/cluster/status",
            None,
            [401, 401, 403, 403, 403, 403, 200, 401],
        ),
        // Initialised already: the admin passes auth and gets the conflict.
        row(
            Method::POST,
            "/cluster/init",
            Some(json!({})),
            [401, 401, 403, 403, 403, 403, 409, 401],
        ),
        row(
            Method::PUT,
            "/cluster/defaults",
            Some(json!({"limit": 100, "roundWaitMs": 20,
            "roundPeriodMs": 20, "grantTimeoutMs": 60000})),
            [401, 401, 403, 403, 403, 403, 200, 401],
        ),
        // No voters: the admin passes auth and gets the validation error.
        row(
            Method::POST,
            "/cluster/members",
            Some(json!({"action": "changeMembership", "voters": []})),
            [401, 401, 403, 403, 403, 403, 400, 401],
        ),
        row(
            Method::GET,
            "/healthz",
            None,
            [200, 200, 200, 200, 200, 200, 200, 200],
        ),
        row(
            Method::GET,
            "/readyz",
            None,
            [200, 200, 200, 200, 200, 200, 200, 200],
        ),
        // The API's description is as public as docs/openapi.json.
        row(
            Method::GET,
            "/openapi.json",
            None,
            [200, 200, 200, 200, 200, 200, 200, 200],
        ),
    ]
}

/// Creates a token with the admin token; answers `(id, secret)`.
async fn create_token(cluster: &Cluster, node: u64, spec: Value) -> (u64, String) {
    let answer = cluster.post(node, "/v1/tokens", &spec).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let id = answer.body["id"].as_u64().expect("id");
    let token = answer.body["token"].as_str().expect("token").to_owned();
    (id, token)
}

fn runner_spec(name: &str) -> Value {
    json!({"name": name, "role": "runner", "keys": ["acct-*"], "clientIds": ["eu-*"]})
}

/// `/metrics` is answered by each node itself, from its own applied registry.
async fn metrics_as(cluster: &Cluster, token: &str, node: u64) -> u16 {
    cluster
        .call_as(Some(token), node, Method::GET, "/metrics", None)
        .await
        .status
}

async fn last_log_index(cluster: &Cluster, leader: u64) -> Value {
    cluster.status(leader).await.expect("status")["lastLogIndex"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_every_caller_exactly() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let (_, runner) = create_token(&cluster, follower, runner_spec("runner")).await;
    let (_, reader) =
        create_token(&cluster, follower, json!({"name": "r", "role": "reader"})).await;
    let (revoked_id, revoked) = create_token(&cluster, follower, runner_spec("gone")).await;
    let revoke = cluster
        .call(
            follower,
            Method::DELETE,
            &format!("/v1/tokens/{revoked_id}"),
            None,
        )
        .await;
    assert_eq!(revoke.status, 204, "{}", revoke.body);
    let (throwaway, _) =
        create_token(&cluster, follower, json!({"name": "x", "role": "reader"})).await;
    let unknown = format!("pmt_{}", "0".repeat(64));
    let admin = permitd_tests::ADMIN_TOKEN.to_owned();
    // (token, key, clientId) of each caller, in CALLERS order.
    let callers: [(Option<&str>, &str, &str); 8] = [
        (None, "acct-1", "eu-1"),
        (Some(&unknown), "acct-1", "eu-1"),
        (Some(&runner), "acct-1", "eu-1"),
        (Some(&runner), "other-1", "eu-1"),
        (Some(&runner), "acct-1", "us-1"),
        (Some(&reader), "acct-1", "eu-1"),
        (Some(&admin), "acct-1", "eu-1"),
        (Some(&revoked), "acct-1", "eu-1"),
    ];

    let mut mismatches = Vec::new();
    for row in table(throwaway) {
        for (column, (token, key, client)) in callers.iter().enumerate() {
            let path = row.path.replace("{key}", key).replace("{client}", client);
            let body = row.body.as_ref().map(|body| {
                let text = body.to_string();
                serde_json::from_str::<Value>(
                    &text.replace("{client}", client).replace("{key}", key),
                )
                .expect("body")
            });
            let before = last_log_index(&cluster, leader).await;
            let answer = cluster
                .call_as(*token, follower, row.method.clone(), &path, body.as_ref())
                .await;
            let expected = row.expected[column];
            if answer.status != expected {
                mismatches.push(format!(
                    "{} {path} as {}: {} (expected {expected}) {}",
                    row.method, CALLERS[column], answer.status, answer.body
                ));
            }
            match answer.status {
                401 => assert_eq!(answer.code(), "unauthorized"),
                403 => assert_eq!(answer.code(), "forbidden"),
                _ => {}
            }
            // `key_in_use` is refused before anything is proposed, too.
            if answer.status == 401 || answer.status == 403 || answer.status == 409 {
                let after = last_log_index(&cluster, leader).await;
                assert_eq!(
                    before, after,
                    "{} {path} as {} changed the log",
                    row.method, CALLERS[column]
                );
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));

    // The list never shows a secret or a hash.
    let list = cluster.get(follower, "/v1/tokens").await;
    let text = list.body.to_string();
    assert!(!text.contains(&runner) && !text.contains("hash"), "{text}");
    assert_eq!(
        list.body["tokens"].as_array().map(Vec::len),
        Some(3),
        "runner, reader and the one the matrix created: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_holds_on_every_node_and_across_restarts() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let (_, kept) = create_token(&cluster, leader, json!({"name": "kept", "role": "reader"})).await;
    let (id, revoked) =
        create_token(&cluster, leader, json!({"name": "gone", "role": "reader"})).await;
    let ids: Vec<u64> = cluster.nodes.iter().map(|node| node.id).collect();
    for &node in &ids {
        let seen = eventually(Duration::from_secs(10), || async {
            metrics_as(&cluster, &revoked, node).await == 200
        })
        .await;
        assert!(seen, "node {node} knows the new token");
    }
    let revoke = cluster
        .call(leader, Method::DELETE, &format!("/v1/tokens/{id}"), None)
        .await;
    assert_eq!(revoke.status, 204);
    for &node in &ids {
        let refused = eventually(Duration::from_secs(10), || async {
            metrics_as(&cluster, &revoked, node).await == 401
        })
        .await;
        assert!(refused, "node {node} applied the revocation");
        assert_eq!(metrics_as(&cluster, &kept, node).await, 200, "node {node}");
    }
    // A second revocation of the same id is a 404 and changes nothing.
    let again = cluster
        .call(leader, Method::DELETE, &format!("/v1/tokens/{id}"), None)
        .await;
    assert_eq!(again.status, 404);

    let follower = cluster.follower_of(leader);
    cluster.stop(follower);
    cluster.restart(follower);
    cluster.wait_healthy().await;
    let kept_after = eventually(Duration::from_secs(15), || async {
        metrics_as(&cluster, &kept, follower).await == 200
    })
    .await;
    assert!(kept_after, "the kept token works after a restart");
    assert_eq!(metrics_as(&cluster, &revoked, follower).await, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_token_specs_are_refused_and_change_nothing() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let before = last_log_index(&cluster, leader).await;
    for (spec, what) in [
        (
            json!({"name": "r", "role": "runner", "keys": ["a"]}),
            "runner without clientIds",
        ),
        (json!({"name": "", "role": "reader"}), "empty name"),
        (
            json!({"name": "n".repeat(129), "role": "reader"}),
            "long name",
        ),
        (json!({"name": "r", "role": "root"}), "unknown role"),
        (
            json!({"name": "r", "role": "reader", "keys": vec!["k"; 65]}),
            "too many patterns",
        ),
        (
            json!({"name": "r", "role": "reader", "secret": "x"}),
            "unknown field",
        ),
    ] {
        let answer = cluster.post(leader, "/v1/tokens", &spec).await;
        assert_eq!(answer.status, 400, "{what}: {}", answer.body);
    }
    assert_eq!(before, last_log_index(&cluster, leader).await);
}
