//! The node's side of a peer stream (`peer_stream.rs`), served by
//! [`Connections`] as the Raft listener serves it, called through the
//! production [`StreamTransport`] over in-memory pipes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use permitd_transport::{
    collect, Connecting, Connector, Deadline, HttpTransport, PeerIo, StreamTransport,
    TransportErrorKind,
};

use super::*;

/// Hands each connection to `connections` over an in-memory pipe and counts
/// them.
#[derive(Debug)]
struct Piped {
    connections: Mutex<Connections>,
    opened: AtomicUsize,
}

impl Connector for Piped {
    fn connect(&self, _peer: &axum::http::uri::Authority) -> Connecting {
        self.opened.fetch_add(1, Ordering::Relaxed);
        let (client, server) = tokio::io::duplex(64 * 1024);
        let connections = self.connections.lock().unwrap().clone();
        tokio::spawn(connections.serve(server));
        Box::pin(async move { Ok(Box::new(client) as Box<dyn PeerIo>) })
    }
}

/// `/echo` answers its query and body after `delay` ms (a header); only
/// calls with `authorization: peer` pass.
fn router() -> Router {
    async fn echo(request: Request) -> Response {
        let delay: u64 = request
            .headers()
            .get("delay")
            .map_or(0, |value| value.to_str().unwrap().parse().unwrap());
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let query = request.uri().query().unwrap_or_default().to_owned();
        let body = axum::body::to_bytes(request.into_body(), 1024)
            .await
            .unwrap();
        let text = format!("{query} {}", String::from_utf8_lossy(&body));
        (StatusCode::CREATED, text).into_response()
    }
    async fn peers_only(request: Request, next: Next) -> Response {
        match request.headers().get("authorization") {
            Some(value) if value == "peer" => next.run(request).await,
            _ => StatusCode::UNAUTHORIZED.into_response(),
        }
    }
    Router::new()
        .route("/echo", post(echo))
        .route_layer(middleware::from_fn(peers_only))
}

fn client(connections: Connections) -> (StreamTransport, Arc<Piped>) {
    let piped = Arc::new(Piped {
        connections: Mutex::new(connections),
        opened: AtomicUsize::new(0),
    });
    let larger = Arc::new(permitd_transport::ReqwestTransport::new(
        reqwest::Client::new(),
    ));
    (StreamTransport::new(piped.clone(), larger), piped)
}

fn raft_listener(stop: &Shutdown) -> Connections {
    Connections::new(router(), &EdgeLimits::default(), None, stop.clone()).with_peer_streams()
}

fn call(body: &str, secret: &str, delay_ms: u64) -> axum::http::Request<Bytes> {
    axum::http::Request::post("http://peer:7001/echo?shard=2")
        .header("authorization", secret)
        .header("delay", delay_ms)
        .body(Bytes::from(body.to_owned()))
        .unwrap()
}

async fn answered(
    transport: &StreamTransport,
    request: axum::http::Request<Bytes>,
) -> (StatusCode, String) {
    let answer = transport.send(request).await.expect("answered");
    let status = answer.status();
    let body = collect(answer.into_body()).await.unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn calls_reach_the_router_with_their_query_headers_and_body_on_one_connection() {
    let (transport, piped) = client(raft_listener(&Shutdown::default()));
    let calls = (0..8).map(|index| {
        let delay = 40 - 5 * index;
        answered(&transport, call(&format!("call {index}"), "peer", delay))
    });
    let answers = futures_util::future::join_all(calls).await;
    for (index, answer) in answers.into_iter().enumerate() {
        assert_eq!(
            answer,
            (StatusCode::CREATED, format!("shard=2 call {index}"))
        );
    }
    assert_eq!(piped.opened.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_call_without_the_secret_is_answered_401_and_its_stream_closed() {
    let (transport, piped) = client(raft_listener(&Shutdown::default()));
    let refused = answered(&transport, call("who?", "stranger", 0)).await;
    assert_eq!(refused.0, StatusCode::UNAUTHORIZED);
    // The stream closes after the 401: the next call needs a new one.
    let mut reopened = false;
    for _ in 0..100 {
        let (status, _) = answered(&transport, call("again", "peer", 0)).await;
        assert_eq!(status, StatusCode::CREATED);
        if piped.opened.load(Ordering::Relaxed) == 2 {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reopened, "the refused stream was closed");
}

#[tokio::test]
async fn a_stop_lets_the_calls_under_way_finish_then_closes_the_stream() {
    let stop = Shutdown::default();
    let (transport, _) = client(raft_listener(&stop));
    let slow = answered(&transport, call("slow", "peer", 200));
    let stopping = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.trigger();
    };
    let (answer, ()) = tokio::join!(slow, stopping);
    assert_eq!(answer, (StatusCode::CREATED, "shard=2 slow".to_owned()));
    let mut request = call("after the stop", "peer", 0);
    request
        .extensions_mut()
        .insert(Deadline(Duration::from_secs(5)));
    let error = transport
        .send(request)
        .await
        .expect_err("the stream closed");
    assert_eq!(error.kind, TransportErrorKind::Exchange, "{error}");
}

#[tokio::test]
async fn the_public_listener_takes_no_peer_streams() {
    let public = Connections::new(router(), &EdgeLimits::default(), None, Shutdown::default());
    let (transport, _) = client(public);
    let mut request = call("hello", "peer", 0);
    request
        .extensions_mut()
        .insert(Deadline(Duration::from_secs(5)));
    assert!(transport.send(request).await.is_err());
}
