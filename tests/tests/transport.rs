//! HTTP/2 between clients and nodes (docs/operations.md, "HTTP/2"), against
//! real clusters.
//!
//! The checks:
//! - the API listener speaks HTTP/2 by prior knowledge in cleartext and by
//!   ALPN over TLS, and HTTP/1.1 to every client that asks for it;
//! - a `SemaphoreClient` with `http2` is answered over both, through a
//!   follower (which forwards to the leader) as through the leader, and the
//!   default client still is over HTTP/1.1.

use permitd_client::{BatchItem, ClientConfig, SemaphoreClient};
use permitd_core::contract::paths;
use permitd_core::contract::protocol::{
    Demand, PermitRequest, PermitSync, SemaphoreRequest, SemaphoreResponse, V1,
};
use permitd_tests::{certs, Cluster, Settings, ADMIN_TOKEN};
use reqwest::Version;

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
