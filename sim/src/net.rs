//! The simulated network as the node and the client see it: an
//! [`HttpTransport`] over turmoil's TCP. Every call opens its own simulated
//! connection and speaks HTTP/1.1 over it (hyper's client), so the bytes the
//! node's listeners parse are real HTTP; turmoil delays, drops, holds and
//! partitions the segments.
//!
//! One connection per call keeps a call's fate its own: a partition or a
//! crash fails the calls under way, never a later one through a stale pooled
//! connection. Raft calls between nodes go as production sends them instead
//! ([`SimPeerStreams`]): every call to a peer on one connection, as frames,
//! so the simulator checks the stream's own fates too (a partition that
//! leaves it silent, a crashed peer, the reconnect after either).
//!
//! TCP never loses or repeats a byte, so a lost or repeated *message* is
//! injected here, a call at a time, while the nemesis makes the network lossy
//! ([`set_lossy`]): an answer lost after the callee acted on the request (the
//! caller sees an error and retries, with the same `requestId`), or a request
//! delivered twice (a retry by a proxy; the callee must answer both alike).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use permitd_transport::{
    boxed, BoxError, Connecting, Connector, Deadline, HttpTransport, PeerIo, Sending,
    StreamTransport, TransportError, TransportErrorKind,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::{Instant, Sleep};

thread_local! {
    /// The lossy network of the run on this thread: its draws, and whether
    /// it is lossy now. Thread-local: a run and every host in it live on one
    /// thread, and runs on other threads have their own.
    static LOSSY: RefCell<Lossy> = RefCell::new(Lossy::default());
}

#[derive(Default)]
struct Lossy {
    rng: Option<StdRng>,
    on: bool,
}

/// What happens to one call.
enum Fate {
    Delivered,
    AnswerLost,
    Repeated,
}

/// Seeds this thread's draws of lost and repeated messages (a run's start;
/// `None` at its end).
pub fn seed_losses(seed: Option<u64>) {
    LOSSY.with(|lossy| {
        *lossy.borrow_mut() = Lossy {
            rng: seed.map(StdRng::seed_from_u64),
            on: false,
        }
    });
}

/// Makes the network lossy (1 call in 10 loses its answer, 1 in 10 is
/// delivered twice) or healthy again.
pub fn set_lossy(on: bool) {
    LOSSY.with(|lossy| lossy.borrow_mut().on = on);
}

fn fate() -> Fate {
    LOSSY.with(|lossy| {
        let mut lossy = lossy.borrow_mut();
        if !lossy.on {
            return Fate::Delivered;
        }
        let Some(rng) = lossy.rng.as_mut() else {
            return Fate::Delivered;
        };
        match rng.random_range(0..10) {
            0 => Fate::AnswerLost,
            1 => Fate::Repeated,
            _ => Fate::Delivered,
        }
    })
}

/// Sends HTTP over the simulated network, from whichever host calls it.
#[derive(Debug, Clone, Default)]
pub struct SimTransport;

impl HttpTransport for SimTransport {
    fn send(&self, request: http::Request<Bytes>) -> Sending {
        Box::pin(async move {
            let deadline = request
                .extensions()
                .get::<Deadline>()
                .map(|Deadline(timeout)| Instant::now() + *timeout);
            let exchange = async move {
                match fate() {
                    Fate::Delivered => exchange(request).await,
                    Fate::AnswerLost => {
                        exchange(request).await?;
                        Err(TransportError::new(
                            TransportErrorKind::Exchange,
                            "answer lost",
                        ))
                    }
                    Fate::Repeated => {
                        let again = copy(&request);
                        // The first answer is read to its end, then dropped.
                        if let Ok(first) = exchange(request).await {
                            let _ = http_body_util::BodyExt::collect(first.into_body()).await;
                        }
                        exchange(again).await
                    }
                }
            };
            let response = match deadline {
                Some(at) => tokio::time::timeout_at(at, exchange)
                    .await
                    .map_err(|elapsed| {
                        TransportError::new(TransportErrorKind::Timeout, elapsed)
                    })??,
                None => exchange.await?,
            };
            Ok(response.map(|body| boxed(DeadlineBody::new(body, deadline))))
        })
    }
}

/// A node's Raft calls to its peers: production's [`StreamTransport`] over
/// turmoil's TCP (one connection per peer, opened on the first call and again
/// after it breaks), with the same lost answers and repeated calls as
/// [`SimTransport`] while the network is lossy. Calls too large for a stream
/// go through [`SimTransport`], which draws their fate itself.
#[derive(Debug)]
pub struct SimPeerStreams {
    streams: Arc<StreamTransport>,
}

impl Default for SimPeerStreams {
    fn default() -> Self {
        Self {
            streams: Arc::new(StreamTransport::new(
                Arc::new(SimConnector),
                Arc::new(SimTransport),
            )),
        }
    }
}

impl HttpTransport for SimPeerStreams {
    fn send(&self, request: http::Request<Bytes>) -> Sending {
        let streams = self.streams.clone();
        Box::pin(async move {
            match fate() {
                Fate::Delivered => streams.send(request).await,
                Fate::AnswerLost => {
                    streams.send(request).await?;
                    Err(TransportError::new(
                        TransportErrorKind::Exchange,
                        "answer lost",
                    ))
                }
                Fate::Repeated => {
                    let again = copy(&request);
                    let _ = streams.send(request).await;
                    streams.send(again).await
                }
            }
        })
    }
}

/// Opens a peer stream's connection over turmoil's TCP.
#[derive(Debug)]
struct SimConnector;

impl Connector for SimConnector {
    fn connect(&self, peer: &http::uri::Authority) -> Connecting {
        let (host, port) = (peer.host().to_owned(), peer.port_u16().unwrap_or(80));
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
            Ok(Box::new(stream) as Box<dyn PeerIo>)
        })
    }
}

async fn exchange(
    request: http::Request<Bytes>,
) -> Result<http::Response<hyper::body::Incoming>, TransportError> {
    let authority = request
        .uri()
        .authority()
        .ok_or_else(|| TransportError::new(TransportErrorKind::Request, "no host in the URI"))?;
    let (host, port) = (
        authority.host().to_owned(),
        authority.port_u16().unwrap_or(80),
    );
    let stream = turmoil::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|error| TransportError::new(TransportErrorKind::Connect, error))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| TransportError::new(TransportErrorKind::Connect, error))?;
    // The connection task ends when the exchange does (or its peer goes away).
    tokio::spawn(connection);
    let request = with_host_header(request).map(Full::new);
    sender
        .send_request(request)
        .await
        .map_err(|error| TransportError::new(TransportErrorKind::Exchange, error))
}

/// The same request again: method, URI, headers, body and deadline.
fn copy(request: &http::Request<Bytes>) -> http::Request<Bytes> {
    let mut again = http::Request::new(request.body().clone());
    *again.method_mut() = request.method().clone();
    *again.uri_mut() = request.uri().clone();
    *again.headers_mut() = request.headers().clone();
    if let Some(deadline) = request.extensions().get::<Deadline>() {
        again.extensions_mut().insert(*deadline);
    }
    again
}

/// HTTP/1.1 needs a Host header; reqwest adds it from the URI, hyper does not.
fn with_host_header(mut request: http::Request<Bytes>) -> http::Request<Bytes> {
    if let Some(authority) = request.uri().authority().cloned() {
        if let Ok(value) = http::HeaderValue::from_str(authority.as_str()) {
            request
                .headers_mut()
                .entry(http::header::HOST)
                .or_insert(value);
        }
    }
    request
}

/// A response body that fails with a timeout once the call's deadline passes
/// (the production transport's deadline covers the body too).
struct DeadlineBody {
    inner: hyper::body::Incoming,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl DeadlineBody {
    fn new(inner: hyper::body::Incoming, deadline: Option<Instant>) -> Self {
        Self {
            inner,
            sleep: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(sleep) = self.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_ready() {
                let timeout = TransportError::new(TransportErrorKind::Timeout, "deadline passed");
                return Poll::Ready(Some(Err(Box::new(timeout))));
            }
        }
        Pin::new(&mut self.inner).poll_frame(cx).map_err(|error| {
            Box::new(TransportError::new(TransportErrorKind::Exchange, error)) as BoxError
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}
