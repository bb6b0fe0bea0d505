//! A node whose Raft core stopped is unhealthy, and the watch that ends `serve`
//! fires: a real node (its store in a temp dir, openraft) in this process.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use permitd_core::KeyConfig;
use permitd_node::app::{self, NodeSettings};
use permitd_node::config::EdgeLimits;
use permitd_node::config::RaftTimings;
use permitd_storage::PeerNode;
use tower::ServiceExt;

async fn healthz(app: &app::App) -> StatusCode {
    let router = permitd_node::edge::api::public_router(app.clone());
    let request = Request::get("/healthz").body(Body::empty()).unwrap();
    router.oneshot(request).await.unwrap().status()
}

#[tokio::test]
async fn a_stopped_raft_core_fails_healthz_and_ends_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let peer = PeerNode {
        api_addr: "127.0.0.1:0".into(),
        raft_addr: "127.0.0.1:0".into(),
    };
    let settings = NodeSettings {
        id: 1,
        api_addr: "127.0.0.1:0".into(),
        raft_addr: "127.0.0.1:0".into(),
        data_dir: dir.path().join("data"),
        secret: "0123456789abcdef".into(),
        auth: permitd_node::credentials::AuthSettings::new(
            true,
            Some("admin-token-0123456789".into()),
        ),
        tls: None,
        peer_source_ip: None,
        timings: RaftTimings::default(),
        defaults: KeyConfig::default(),
        initial_members: BTreeMap::from([(1, peer)]),
        initialize_at_start: false,
        rounds: permitd_node::leader::rounds::RoundLimits {
            max_pending_per_key: 10,
            ..Default::default()
        },
        edge: EdgeLimits::default(),
        reclaim_horizon: std::time::Duration::from_millis(
            permitd_node::leader::reclaim::DEFAULT_HORIZON_MS,
        ),
        seams: permitd_node::seams::Seams::production(),
        // The core that stops is shard 1's: one shard's is fatal to the node.
        shards: 2,
    };
    let raft_runtime = permitd_node::raft::runtime::RaftRuntime::start().expect("raft runtime");
    let started = app::start(&settings, &raft_runtime.handle())
        .await
        .expect("node starts");
    let app = started.app;
    assert_eq!(healthz(&app).await, StatusCode::OK);
    assert_eq!(app.stopped(), None);

    let shard = app.shard(1).expect("shard 1");
    shard.raft.shutdown().await.expect("core stops");
    assert_eq!(healthz(&app).await, StatusCode::SERVICE_UNAVAILABLE);
    assert!(app
        .stopped()
        .is_some_and(|reason| reason.starts_with("shard 1")));
    let reason = tokio::time::timeout(Duration::from_secs(5), app.fatal())
        .await
        .expect("the wait ends once the core stopped");
    assert!(!reason.is_empty());
}
