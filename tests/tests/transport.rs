//! HTTP/2 and MessagePack between clients and nodes (docs/operations.md,
//! "HTTP/2 and MessagePack"), against real clusters.
//!
//! The checks:
//! - the API listener speaks HTTP/2 by prior knowledge in cleartext and by
//!   ALPN over TLS, and HTTP/1.1 to every client that asks for it;
//! - a `SemaphoreClient` with `http2` is answered over both, through a
//!   follower (which forwards to the leader) as through the leader;
//! - a MessagePack batch round-trips through `SemaphoreClient` and through a
//!   follower, a malformed item fails alone, the answer is MessagePack only
//!   when `Accept` asks for it, and an envelope error stays a JSON 400.

use permitd_client::{BatchItem, BodyEncoding, ClientConfig, SemaphoreClient};
use permitd_core::batch::BatchResponse;
use permitd_core::batch_msgpack;
use permitd_core::contract::paths;
use permitd_core::protocol::{
    Demand, PermitRequest, PermitSync, SemaphoreRequest, SemaphoreResponse, V1,
};
use permitd_tests::{certs, Cluster, Settings, ADMIN_TOKEN};
use reqwest::Version;
use serde_json::json;

fn one_permit(client_id: &str) -> SemaphoreRequest {
    SemaphoreRequest::Request(PermitRequest {
        v: V1,
        client_id: client_id.into(),
        request_id: None,
        demand: vec![Demand {
            group: "g".into(),
            count: 1,
            oldest_at_ms: 1,
        }],
        grants: vec![],
        leases: None,
        wait_ms: None,
    })
}

fn sync(client_id: &str) -> SemaphoreRequest {
    SemaphoreRequest::Sync(PermitSync {
        v: V1,
        client_id: client_id.into(),
        grants: vec![],
        leases: None,
    })
}

/// A raw client of `cluster` (trusting its CA, if any), configured by `build`.
fn raw_client(
    cluster: &Cluster,
    build: impl FnOnce(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
) -> reqwest::Client {
    let builder = build(reqwest::Client::builder());
    certs::trusting(builder, cluster.certs.as_ref())
        .build()
        .expect("client")
}

/// The HTTP version `http` was answered in by node `id`'s status call.
async fn version_of(cluster: &Cluster, id: u64, http: &reqwest::Client) -> Version {
    let url = format!("{}{}", cluster.node(id).url(), paths::CLUSTER_STATUS);
    let answer = http
        .get(url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("status");
    assert_eq!(answer.status(), 200);
    answer.version()
}

/// A `SemaphoreClient` of `cluster` asking node `id` first.
fn client(
    cluster: &Cluster,
    id: u64,
    configure: impl FnOnce(&mut ClientConfig),
) -> SemaphoreClient {
    let mut config = ClientConfig::new([cluster.node(id).url()]);
    config.token = Some(ADMIN_TOKEN.to_owned());
    config.ca_file = cluster.certs.as_ref().map(|certs| certs.ca_file.clone());
    configure(&mut config);
    SemaphoreClient::new(config).expect("client")
}

/// A request and a batch through `client`, both answered.
async fn is_answered(client: &SemaphoreClient, key: &str) {
    let SemaphoreRequest::Request(request) = one_permit("c-1") else {
        unreachable!()
    };
    let grant = client.request(key, request).await.expect("request");
    assert_eq!(grant.grants.len(), 1, "{grant:?}");
    let items = vec![
        BatchItem {
            key: key.into(),
            message: one_permit("c-2"),
        },
        BatchItem {
            key: key.into(),
            message: sync("c-1"),
        },
    ];
    let answers = client.batch(items).await.expect("batch");
    assert!(
        matches!(&answers[0], Ok(SemaphoreResponse::Grant(grant)) if grant.grants.len() == 1),
        "{answers:?}"
    );
    assert!(
        matches!(&answers[1], Ok(SemaphoreResponse::Synced(_))),
        "{answers:?}"
    );
}

/// Both protocols on every node's API listener, and an HTTP/2 client answered
/// through a follower and the leader.
async fn both_protocols_are_served(cluster: &Cluster) {
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let http2 = raw_client(cluster, reqwest::ClientBuilder::http2_prior_knowledge);
    let http1 = raw_client(cluster, reqwest::ClientBuilder::http1_only);
    for node in &cluster.nodes {
        assert_eq!(version_of(cluster, node.id, &http2).await, Version::HTTP_2);
        assert_eq!(version_of(cluster, node.id, &http1).await, Version::HTTP_11);
    }
    for (id, key) in [(follower, "h2-follower"), (leader, "h2-leader")] {
        is_answered(&client(cluster, id, |config| config.http2 = true), key).await;
    }
    // The default client stays on HTTP/1.1.
    is_answered(&client(cluster, follower, |_| {}), "h1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleartext_nodes_speak_http2_by_prior_knowledge_and_http1() {
    let cluster = Cluster::start(Settings::default()).await;
    both_protocols_are_served(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_nodes_offer_http2_in_alpn_and_keep_http1() {
    let cluster = Cluster::start(Settings {
        tls: true,
        ..Settings::default()
    })
    .await;
    both_protocols_are_served(&cluster).await;
    // A client that offers both in ALPN gets HTTP/2.
    let leader = cluster.wait_for_leader().await;
    let offers_both = raw_client(&cluster, |builder| builder);
    assert_eq!(
        version_of(&cluster, leader, &offers_both).await,
        Version::HTTP_2
    );
}

/// Posts `body` as a MessagePack batch to node `id`, with `accept`.
async fn post_msgpack(
    cluster: &Cluster,
    id: u64,
    body: Vec<u8>,
    accept: &str,
) -> reqwest::Response {
    let url = format!("{}{}", cluster.node(id).url(), paths::BATCH);
    cluster
        .http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, batch_msgpack::MEDIA_TYPE)
        .header(reqwest::header::ACCEPT, accept)
        .body(body)
        .send()
        .await
        .expect("batch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_msgpack_batch_round_trips_and_a_bad_item_fails_alone() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let msgpack = client(&cluster, follower, |config| {
        config.batch_encoding = BodyEncoding::MsgPack;
    });
    is_answered(&msgpack, "mp").await;

    let item = |key: &str, message: &SemaphoreRequest| json!({"key": key, "message": message});
    let body = batch_msgpack::encode(&json!({"v": 1, "items": [
        item("mp-raw", &one_permit("c-1")),
        {"key": "mp-raw", "message": {"type": "nope", "v": 1, "clientId": "c-1"}},
        7,
        item("", &sync("c-1")),
        item("mp-raw", &sync("c-1")),
    ]}));
    let answer = post_msgpack(&cluster, follower, body.clone(), batch_msgpack::MEDIA_TYPE).await;
    assert_eq!(answer.status(), 200);
    let media_type = answer.headers()[reqwest::header::CONTENT_TYPE].clone();
    assert_eq!(media_type, batch_msgpack::MEDIA_TYPE);
    let bytes = answer.bytes().await.expect("answer");
    let answers: BatchResponse = batch_msgpack::decode(&bytes).expect("a MessagePack answer");
    let statuses: Vec<u16> = answers.items.iter().map(|item| item.status).collect();
    assert_eq!(statuses, [200, 400, 400, 400, 200]);

    // Without `Accept: application/msgpack` the answer is JSON.
    let answer = post_msgpack(&cluster, leader, body, "application/json").await;
    assert_eq!(answer.status(), 200);
    let answers: BatchResponse = answer.json().await.expect("a JSON answer");
    assert_eq!(answers.items.len(), 5);

    // The envelope fails the call, with the JSON error body of every error.
    let broken = batch_msgpack::encode(&json!({"v": 1, "items": [], "more": 1}));
    let answer = post_msgpack(&cluster, follower, broken, batch_msgpack::MEDIA_TYPE).await;
    assert_eq!(answer.status(), 400);
    let error: serde_json::Value = answer.json().await.expect("a JSON error");
    assert_eq!(error["error"]["code"], "bad_request", "{error}");
}
