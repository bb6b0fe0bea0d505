//! The simulated network as the node and the client see it: an
//! [`HttpTransport`] over turmoil's TCP. Every call opens its own simulated
//! connection and speaks HTTP/1.1 over it (hyper's client), so the bytes the
//! node's listeners parse are real HTTP; turmoil delays, drops, holds and
//! partitions the segments.
//!
//! One connection per call keeps a call's fate its own: a partition or a
//! crash fails the calls under way, never a later one through a stale pooled
//! connection.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use permitd_transport::{
    boxed, BoxError, Deadline, HttpTransport, Sending, TransportError, TransportErrorKind,
};
use tokio::time::{Instant, Sleep};

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
            let exchange = exchange(request);
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
