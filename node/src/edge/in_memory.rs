//! Tests only: a transport that hands each call to a node's router in the same
//! process (no socket), and a two-node cluster on it, which proves that every
//! outgoing call of a node (Raft RPC, forwarding to the leader) goes through
//! the transport its settings inject. The simulator's transport does the same
//! over its simulated network.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::Router;
use permitd_core::contract::{headers, paths};
use permitd_core::KeyConfig;
use permitd_storage::{NodeId, PeerNode};
use permitd_transport::{Deadline, HttpTransport, Sending, TransportError, TransportErrorKind};
use tower::ServiceExt;

use crate::app::{self, App, NodeSettings};
use crate::config::{EdgeLimits, RaftTimings};
use crate::credentials::AuthSettings;
use crate::edge::api::{internal_router, public_router};

/// Calls the router served at a URI's `host:port`, in-process
/// (`tower::ServiceExt::oneshot`); a host nobody serves refuses the
/// connection. Records every call as (`host:port`, path).
#[derive(Debug, Default)]
pub struct RouterTransport {
    routers: Mutex<HashMap<String, Router>>,
    calls: Mutex<Vec<(String, String)>>,
}

impl RouterTransport {
    /// Serves `router` at `authority` (`host:port`).
    pub fn serve(&self, authority: &str, router: Router) {
        let mut routers = self.routers.lock().unwrap_or_else(PoisonError::into_inner);
        routers.insert(authority.to_owned(), router);
    }

    /// The router served at `authority`.
    pub fn router(&self, authority: &str) -> Option<Router> {
        let routers = self.routers.lock().unwrap_or_else(PoisonError::into_inner);
        routers.get(authority).cloned()
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<(String, String)> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl HttpTransport for RouterTransport {
    fn send(&self, request: Request<Bytes>) -> Sending {
        let authority = request
            .uri()
            .authority()
            .map_or_else(String::new, ToString::to_string);
        let path = request.uri().path().to_owned();
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((authority.clone(), path));
        let router = self.router(&authority);
        Box::pin(async move {
            let Some(router) = router else {
                let refused = format!("nobody serves {authority}");
                return Err(TransportError::new(TransportErrorKind::Connect, refused));
            };
            let deadline = request.extensions().get::<Deadline>().copied();
            let call = router.oneshot(request.map(Body::from));
            let answered = match deadline {
                Some(Deadline(timeout)) => tokio::time::timeout(timeout, call)
                    .await
                    .map_err(|elapsed| TransportError::new(TransportErrorKind::Timeout, elapsed))?,
                None => call.await,
            };
            let response = answered.unwrap_or_else(|never| match never {});
            Ok(response.map(permitd_transport::boxed))
        })
    }
}

fn members() -> BTreeMap<NodeId, PeerNode> {
    (1..=2)
        .map(|id| {
            let peer = PeerNode {
                api_addr: format!("node{id}:7000"),
                raft_addr: format!("node{id}:7100"),
            };
            (id, peer)
        })
        .collect()
}

/// Node `id` of [`members`], its data in `dir`, calling out through `transport`.
fn settings(id: NodeId, dir: &std::path::Path, transport: &Arc<RouterTransport>) -> NodeSettings {
    let members = members();
    NodeSettings {
        id,
        api_addr: members[&id].api_addr.clone(),
        raft_addr: members[&id].raft_addr.clone(),
        data_dir: dir.join(format!("node{id}")),
        secret: "0123456789abcdef".into(),
        auth: AuthSettings::new(false, None),
        tls: None,
        peer_source_ip: None,
        timings: RaftTimings::default(),
        defaults: KeyConfig::default(),
        initial_members: members,
        initialize_at_start: false,
        rounds: crate::leader::rounds::RoundLimits::default(),
        edge: EdgeLimits::default(),
        reclaim_horizon: Duration::from_millis(crate::leader::reclaim::DEFAULT_HORIZON_MS),
        seams: crate::seams::Seams {
            transport: Some(transport.clone()),
            ..crate::seams::Seams::production()
        },
        shards: 1,
    }
}

/// Waits until both nodes name the same leader: (leader, follower). Wakes on
/// each change of either node's leadership, not on a timer.
async fn leader_and_follower(apps: &[App]) -> (NodeId, NodeId) {
    let [first, second] = apps else {
        panic!("two nodes expected");
    };
    let (mut first, mut second) = (
        first.meta().leadership.clone(),
        second.meta().leadership.clone(),
    );
    let agreed = async {
        loop {
            let named = (
                first.borrow_and_update().leader,
                second.borrow_and_update().leader,
            );
            if let (Some(a), Some(b)) = named {
                if a == b {
                    return (a, 3 - a);
                }
            }
            tokio::select! {
                _ = first.changed() => {}
                _ = second.changed() => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), agreed)
        .await
        .expect("no leader both nodes name within 10 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_rpc_and_forwarded_calls_go_through_the_injected_transport() {
    let dir = tempfile::tempdir().unwrap();
    let transport = Arc::new(RouterTransport::default());
    let members = members();
    let mut apps = Vec::new();
    for id in [1, 2] {
        let settings = settings(id, dir.path(), &transport);
        let app = app::start_unbound(&settings, &tokio::runtime::Handle::current())
            .await
            .expect("node starts");
        transport.serve(&members[&id].api_addr, public_router(app.clone()));
        transport.serve(&members[&id].raft_addr, internal_router(app.clone()));
        apps.push(app);
    }
    crate::edge::api::cluster::initialize(&apps[0])
        .await
        .expect("initialised: votes and appends went through the transport");
    let (leader, follower) = leader_and_follower(&apps).await;

    let list = Request::get(paths::SEMAPHORES).body(Body::empty()).unwrap();
    let follower_api = transport.router(&members[&follower].api_addr);
    let answer = follower_api.expect("served").oneshot(list).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let answered_by = answer.headers()[headers::LEADER].to_str().unwrap();
    assert_eq!(answered_by, leader.to_string(), "answered by the leader");

    let calls = transport.calls();
    let called = |authority: &str, path: &str| {
        calls
            .iter()
            .any(|call| call.0 == authority && call.1 == path)
    };
    let (leader_api, follower_raft) = (&members[&leader].api_addr, &members[&follower].raft_addr);
    assert!(called(follower_raft, "/raft/vote"), "{calls:?}");
    assert!(called(follower_raft, "/raft/append"), "{calls:?}");
    assert!(
        called(leader_api, paths::SEMAPHORES),
        "forwarded: {calls:?}"
    );
    for app in &apps {
        app.shutdown_raft().await;
    }
}
