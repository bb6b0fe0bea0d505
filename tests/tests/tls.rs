//! A three-node cluster over TLS end to end, with certificates generated for
//! the test: HTTPS on both listeners, peers verifying each other against the
//! test CA with client certificates on the Raft port (mTLS), auth on.

use std::time::Duration;

use permitd_client::{ClientConfig, SemaphoreClient};
use permitd_core::contract::protocol::{Demand, PermitRequest, V1};
use permitd_tests::{certs, granted, request, Cluster, Settings, ADMIN_TOKEN};
use serde_json::json;

fn tls_settings() -> Settings {
    Settings {
        tls: true,
        ..Settings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_elects_replicates_and_forwards() {
    let cluster = Cluster::start(tls_settings()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    assert!(cluster.node(follower).url().starts_with("https://"));

    // Through a follower: forwarded to the leader over TLS, replicated over mTLS.
    let answer = cluster
        .post(
            follower,
            "/v1/semaphores/tls",
            &request("c", &[("g", 3, 1)]),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(granted(&answer.body), 3);
    for node in &cluster.nodes {
        assert_eq!(cluster.usage(node.id, "tls").await["granted"], 3);
    }
    let applied_everywhere = permitd_tests::eventually(Duration::from_secs(10), || async {
        let mut applied = Vec::new();
        for node in &cluster.nodes {
            applied.push(
                cluster
                    .status(node.id)
                    .await
                    .map(|s| s["lastApplied"].clone()),
            );
        }
        applied.windows(2).all(|pair| pair[0] == pair[1])
    })
    .await;
    assert!(applied_everywhere, "every replica applied the same entries");

    // The SemaphoreClient with the CA file and a runner token.
    let created = cluster
        .post(
            leader,
            "/v1/tokens",
            &json!({"name": "r", "role": "runner", "keys": ["tls"], "clientIds": ["runner-*"]}),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let certs = cluster
        .certs
        .clone()
        .expect("a TLS cluster has certificates");
    let mut config = ClientConfig::new(cluster.nodes.iter().map(|node| node.url()));
    config.token = created.body["token"].as_str().map(str::to_owned);
    config.ca_file = Some(certs.ca_file.clone());
    let client = SemaphoreClient::new(config).expect("client");
    let grant = client
        .request(
            "tls",
            PermitRequest {
                v: V1,
                client_id: "runner-1".into(),
                request_id: None,
                demand: vec![Demand {
                    group: "g".into(),
                    count: 2,
                    oldest_at_ms: 1,
                }],
                grants: Vec::new(),
                leases: None,
                wait_ms: None,
            },
        )
        .await
        .expect("a runner's request over TLS");
    assert_eq!(grant.grants.iter().map(|g| g.permits).sum::<u64>(), 2);
    assert_eq!(client.usage("tls").await.expect("usage").granted, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_foreign_cas_and_peers_without_certificates_are_refused() {
    let cluster = Cluster::start(tls_settings()).await;
    let leader = cluster.wait_for_leader().await;
    let node = cluster.node(leader);

    let plain = reqwest::Client::new();
    let http = plain
        .get(format!("http://{}/healthz", node.api_addr))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(
        !http.is_ok_and(|answer| answer.status().is_success()),
        "no plain HTTP"
    );

    let foreign = certs::foreign_ca(cluster.dir.path());
    let pem = std::fs::read(foreign).unwrap();
    let distrustful = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let answer = distrustful
        .get(format!("{}/healthz", node.url()))
        .send()
        .await;
    assert!(
        answer.is_err(),
        "a client trusting another CA refuses the node"
    );

    // The Raft port wants a client certificate from the cluster CA (mTLS): the
    // harness's client has none, so the handshake fails, secret or not.
    let vote = cluster
        .http
        .post(format!("https://{}/raft/vote", node.raft_addr))
        .bearer_auth(permitd_tests::SECRET)
        .json(&json!({}))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(vote.is_err(), "no client certificate, no Raft: {vote:?}");
    // With the cluster's certificate the handshake passes, and then the peer
    // secret decides.
    let certs = cluster.certs.clone().expect("certificates");
    let mut identity = std::fs::read(&certs.cert_file).unwrap();
    identity.extend(std::fs::read(&certs.key_file).unwrap());
    let ca = std::fs::read(&certs.ca_file).unwrap();
    let peer = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .build()
        .unwrap();
    let without_secret = peer
        .post(format!("https://{}/raft/vote", node.raft_addr))
        .json(&json!({}))
        .send()
        .await
        .expect("the handshake passes with a client certificate");
    assert_eq!(without_secret.status(), 401);

    // The API port needs none, but auth still holds.
    let anonymous = cluster
        .call_as(None, leader, reqwest::Method::GET, "/v1/semaphores", None)
        .await;
    assert_eq!(anonymous.status, 401);
    let admin = cluster
        .call_as(
            Some(ADMIN_TOKEN),
            leader,
            reqwest::Method::GET,
            "/v1/semaphores",
            None,
        )
        .await;
    assert_eq!(admin.status, 200);
}
