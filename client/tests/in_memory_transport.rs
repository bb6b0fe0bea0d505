//! A `SemaphoreClient` given its own `HttpTransport` sends every exchange
//! through it: here a fake that hands each request to an axum `Router` in
//! this process (no sockets), one router per node. It shows what the
//! deterministic simulator (issue 34) relies on: calls, retries, leader
//! finding, readiness probes and the event stream all go through the given
//! transport, and the client reads the answers as it reads a real node's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use permitd_client::{ClientConfig, SemaphoreClient};
use permitd_core::contract::protocol::{
    GrantResult, GrantStatus, GrantedPermits, PermitGrant, PermitSyncResult, SemaphoreRequest,
    SemaphoreResponse, V1,
};
use permitd_core::contract::{headers, paths, ErrorAnswer, ErrorCode, Readiness, ReadyStatus};
use permitd_core::{IdAllocator, LogIndex};
use permitd_transport::{HttpTransport, Sending, TransportError, TransportErrorKind};
use tower::ServiceExt;

const TOKEN: &str = "pmt_in_memory";
/// The log index of the fake leader's one round: every grant's fence.
const FENCE: LogIndex = 7;

/// The fake network: one router per `host:port`; a request to any other
/// address fails as a refused connection would. Every request is logged as
/// `METHOD host:port/path`, so a test can tell which node got what.
#[derive(Debug, Clone, Default)]
struct InProcess {
    nodes: HashMap<String, Router>,
    sent: Arc<Mutex<Vec<String>>>,
}

impl InProcess {
    fn node(mut self, address: &str, router: Router) -> Self {
        self.nodes.insert(address.to_owned(), router);
        self
    }

    fn sent(&self) -> Vec<String> {
        self.sent.lock().unwrap().clone()
    }
}

impl HttpTransport for InProcess {
    fn send(&self, request: http::Request<Bytes>) -> Sending {
        let address = request
            .uri()
            .authority()
            .map(ToString::to_string)
            .unwrap_or_default();
        let line = format!("{} {address}{}", request.method(), request.uri().path());
        self.sent.lock().unwrap().push(line);
        let router = self.nodes.get(&address).cloned();
        Box::pin(async move {
            let Some(router) = router else {
                let refused = format!("nothing listens on {address}");
                return Err(TransportError::new(TransportErrorKind::Connect, refused));
            };
            let request = request.map(axum::body::Body::from);
            let response = router.oneshot(request).await.expect("a router never fails");
            Ok(response.map(permitd_transport::boxed))
        })
    }
}

/// A node that does not lead: every v1 call and its readiness probe answer
/// 503 `not_leader`, naming `leader` (a URL) in the leader header.
fn follower(leader: &'static str) -> Router {
    let not_leader = move || async move {
        let answer = ErrorAnswer::new(ErrorCode::NotLeader, "this node does not lead");
        let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(answer)).into_response();
        response
            .headers_mut()
            .insert(headers::LEADER, leader.parse().unwrap());
        response
    };
    Router::new()
        .route(paths::READYZ, get(not_leader))
        .route(paths::SEMAPHORE, post(not_leader))
}

/// What the leading fake node was sent, in order.
type Received = Arc<Mutex<Vec<SemaphoreRequest>>>;

/// A node that leads (node 2): it grants every request in full at once,
/// confirms every report, and serves one event on the event stream. It
/// answers 401 to a call without the client's token, as a node would.
fn leader(received: Received) -> Router {
    Router::new()
        .route(paths::READYZ, get(ready))
        .route(paths::SEMAPHORE, post(semaphore))
        .route(paths::EVENTS, get(events))
        .with_state(received)
}

async fn ready() -> Json<Readiness> {
    Json(Readiness {
        status: ReadyStatus::Ready,
        leader: 2,
        serving: None,
    })
}

async fn semaphore(
    State(received): State<Received>,
    headers: HeaderMap,
    Json(message): Json<SemaphoreRequest>,
) -> Response {
    let bearer = format!("Bearer {TOKEN}");
    if headers
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        != Some(bearer.as_bytes())
    {
        let answer = ErrorAnswer::new(ErrorCode::Unauthorized, "no token");
        return (StatusCode::UNAUTHORIZED, Json(answer)).into_response();
    }
    received.lock().unwrap().push(message.clone());
    let answer = match message {
        SemaphoreRequest::Request(request) => SemaphoreResponse::Grant(PermitGrant {
            v: V1,
            grants: request
                .demand
                .iter()
                .map(|demand| GrantedPermits {
                    // As the node mints them: from the round's log index.
                    grant_id: IdAllocator::new(FENCE).grant_id(),
                    group: demand.group.clone(),
                    permits: demand.count,
                    fence: FENCE,
                })
                .collect(),
            blocked: Vec::new(),
            grant_results: Vec::new(),
            leases: None,
            contended: false,
            next_request_at_ms: 0,
        }),
        SemaphoreRequest::Sync(sync) => SemaphoreResponse::Synced(PermitSyncResult {
            v: V1,
            grant_results: sync
                .grants
                .iter()
                .map(|report| GrantResult {
                    grant_id: report.grant_id.clone(),
                    claimed: report.claimed,
                    status: GrantStatus::Ok,
                })
                .collect(),
            leases: None,
            contended: false,
        }),
    };
    let mut response = Json(answer).into_response();
    response
        .headers_mut()
        .insert(headers::LEADER, "http://b:2".parse().unwrap());
    response
}

async fn events() -> impl IntoResponse {
    (
        [(http::header::CONTENT_TYPE, "text/event-stream")],
        ": keep-alive\n\nevent: round\nid: 5\ndata: {\"key\":\"k\"}\n\n",
    )
}

fn client(transport: &InProcess, endpoints: &str) -> SemaphoreClient {
    let mut config = ClientConfig::new([endpoints]).with_transport(Arc::new(transport.clone()));
    config.token = Some(TOKEN.into());
    config.call_timeout = Duration::from_secs(5);
    config.backoff_initial_ms = 5;
    config.backoff_max_ms = 20;
    SemaphoreClient::new(config).unwrap()
}

#[tokio::test]
async fn a_permit_is_acquired_on_the_leader_a_follower_names_and_released_there() {
    let received = Received::default();
    let transport = InProcess::default()
        .node("a:1", follower("http://b:2"))
        .node("b:2", leader(received.clone()));
    let client = client(&transport, "http://a:1,http://b:2");

    let permit = client.acquire("k", "g", 3).await.unwrap();
    assert_eq!((permit.count(), permit.fence()), (3, FENCE));
    assert_eq!(client.leader().as_deref(), Some("http://b:2"));
    permit.release().await.unwrap();

    let sent = transport.sent();
    assert_eq!(sent[0], "POST a:1/v1/semaphores/k", "{sent:#?}");
    assert!(
        sent[1..].iter().all(|line| !line.starts_with("POST a:1")),
        "after the follower named the leader, calls go there: {sent:#?}"
    );
    // The retry's readiness probe went through the transport too.
    assert!(sent.contains(&"GET b:2/readyz".to_owned()), "{sent:#?}");
    // Request, claim, release: all on the leader.
    let received = received.lock().unwrap().clone();
    let kinds: Vec<&str> = received
        .iter()
        .map(|message| match message {
            SemaphoreRequest::Request(_) => "request",
            SemaphoreRequest::Sync(_) => "sync",
        })
        .collect();
    assert_eq!(kinds, ["request", "sync", "sync"]);
    let SemaphoreRequest::Sync(release) = &received[2] else {
        unreachable!()
    };
    assert_eq!(release.grants[0].claimed, 3);
    assert_eq!(release.grants[0].released, 3);
}

#[tokio::test]
async fn a_refused_connection_moves_the_call_to_the_next_node() {
    let received = Received::default();
    let transport = InProcess::default().node("b:2", leader(received.clone()));
    let client = client(&transport, "http://c:3,http://b:2");

    let permit = client.acquire("k", "g", 1).await.unwrap();
    permit.release().await.unwrap();

    let sent = transport.sent();
    let calls: Vec<&String> = sent
        .iter()
        .filter(|line| line.starts_with("POST"))
        .collect();
    assert_eq!(
        calls,
        [
            "POST c:3/v1/semaphores/k",
            "POST b:2/v1/semaphores/k",
            "POST b:2/v1/semaphores/k",
            "POST b:2/v1/semaphores/k",
        ],
        "{sent:#?}"
    );
    assert_eq!(received.lock().unwrap().len(), 3);
    assert_eq!(client.leader().as_deref(), Some("http://b:2"));
}

#[tokio::test]
async fn a_call_no_node_answers_reports_the_transport_failure() {
    let transport = InProcess::default();
    let mut config = ClientConfig::new(["http://c:3"]).with_transport(Arc::new(transport.clone()));
    config.call_timeout = Duration::from_millis(200);
    config.backoff_initial_ms = 5;
    config.backoff_max_ms = 20;
    let client = SemaphoreClient::new(config).unwrap();

    let error = client.usage("k").await.unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(error, permitd_client::ClientError::DeadlineExceeded { .. }),
        "{text}"
    );
    assert!(text.contains("nothing listens on c:3"), "{text}");
}

#[tokio::test]
async fn the_event_stream_is_read_from_the_transport_body() {
    let transport = InProcess::default()
        .node("a:1", follower("http://b:2"))
        .node("b:2", leader(Received::default()));
    let client = client(&transport, "http://b:2");

    let mut stream = client.events(Some("k"), Some(5)).await.unwrap();
    let message = stream.next().await.unwrap().unwrap();
    assert_eq!(
        (
            message.event.as_str(),
            message.id,
            message.cursor.as_deref(),
            message.data.as_str()
        ),
        ("round", Some(5), Some("5"), "{\"key\":\"k\"}")
    );
    assert_eq!(stream.next().await.unwrap(), None);
    assert_eq!(transport.sent(), ["GET b:2/v1/events"]);
}
