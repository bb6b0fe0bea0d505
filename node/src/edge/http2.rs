//! HTTP/2 on the edge: telling it from HTTP/1.1 on a cleartext connection,
//! and bounding an HTTP/2 connection's idle time as HTTP/1.1's header-read
//! timeout bounds it.
//!
//! Over TLS the handshake's ALPN says which protocol a connection speaks. In
//! cleartext a client that wants HTTP/2 sends its connection preface first
//! ("prior knowledge"); [`sniff`] reads up to the preface's length, under the
//! header-read timeout, so a connection that sends nothing is dropped like an
//! HTTP/1.1 one whose header never comes.
//!
//! hyper's HTTP/2 server has no idle timeout: a client could open a connection
//! and keep it without a request, holding one of the listener's connection
//! permits for ever. [`serve`] counts the requests in flight (until their
//! response body ends) and, after a header-read timeout with none, sends GOAWAY;
//! a peer that still holds the connection one timeout later is dropped.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http2;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use super::service::EdgeService;
use crate::shutdown::Shutdown;

/// What an HTTP/2 client sends before anything else (RFC 9113, section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Which protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// Reads a cleartext connection's first bytes, just enough to tell the HTTP/2
/// preface from an HTTP/1.1 request line, and hands back the stream with those
/// bytes put back in front. `None` when they do not arrive within `timeout`.
pub async fn sniff<S>(mut stream: S, timeout: Duration) -> Option<(Protocol, Prefixed<S>)>
where
    S: AsyncRead + Unpin,
{
    let mut seen = Vec::with_capacity(PREFACE.len());
    let read = tokio::time::timeout(timeout, read_preface(&mut stream, &mut seen)).await;
    match read {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::debug!(%error, "reading a connection's first bytes");
            return None;
        }
        Err(_) => {
            tracing::debug!("a connection sent no request in time");
            return None;
        }
    }
    let protocol = if seen == PREFACE {
        Protocol::Http2
    } else {
        Protocol::Http1
    };
    Some((protocol, Prefixed::new(seen, stream)))
}

/// Reads while what came so far may still be the preface. Never past it: the
/// rest belongs to the protocol's own parser.
async fn read_preface<S: AsyncRead + Unpin>(stream: &mut S, seen: &mut Vec<u8>) -> io::Result<()> {
    let mut chunk = [0u8; PREFACE.len()];
    while seen.len() < PREFACE.len() && PREFACE.starts_with(seen) {
        let read = stream
            .read(&mut chunk[..PREFACE.len() - seen.len()])
            .await?;
        if read == 0 {
            break;
        }
        seen.extend_from_slice(&chunk[..read]);
    }
    Ok(())
}

/// A stream whose first bytes were already read: they are read again first.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    consumed: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self {
            prefix,
            consumed: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let rest = &this.prefix[this.consumed..];
        if rest.is_empty() {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let len = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..len]);
        this.consumed += len;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The HTTP/2 connection settings of a listener.
pub fn builder() -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder.timer(hyper_util::rt::TokioTimer::new());
    builder
}

/// Serves one HTTP/2 connection until it closes, `stop` fires (GOAWAY, then
/// the requests in flight finish) or it sits idle for `idle_timeout`.
pub async fn serve<T>(
    builder: &http2::Builder<TokioExecutor>,
    stream: T,
    service: EdgeService,
    stop: Shutdown,
    idle_timeout: Duration,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::default();
    let service = Tracked {
        inner: service,
        activity: activity.clone(),
    };
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            ended = connection.as_mut() => {
                // As for HTTP/1.1: how a connection ends is the client's business.
                if let Err(error) = ended {
                    tracing::debug!(%error, "HTTP/2 connection ended");
                }
                return;
            }
            () = stop.wait(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = activity.idle_for(idle_timeout) => {
                if closing {
                    // GOAWAY was sent a timeout ago and the peer neither
                    // closed nor asked anything: drop it.
                    return;
                }
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// The requests in flight on one connection, and how many ever started.
#[derive(Debug, Clone, Copy, Default)]
struct Load {
    in_flight: usize,
    started: u64,
}

/// A connection's [`Load`], watched by its idle timer.
#[derive(Debug, Clone, Default)]
struct Activity(Arc<watch::Sender<Load>>);

impl Activity {
    /// Counts a request in flight until the returned guard drops.
    fn start(&self) -> InFlight {
        self.0.send_modify(|load| {
            load.in_flight += 1;
            load.started += 1;
        });
        InFlight(Arc::clone(&self.0))
    }

    /// Resolves once no request has been in flight for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        let mut load = self.0.subscribe();
        loop {
            // The sender lives as long as `self`, so the waits cannot fail.
            let started = match load.wait_for(|load| load.in_flight == 0).await {
                Ok(idle) => idle.started,
                Err(_) => return,
            };
            let next = load.wait_for(|load| load.started != started);
            if tokio::time::timeout(timeout, next).await.is_err() {
                return;
            }
        }
    }
}

/// One request in flight.
#[derive(Debug)]
struct InFlight(Arc<watch::Sender<Load>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|load| load.in_flight -= 1);
    }
}

/// A service that counts its requests in [`Activity`], each until its
/// response body ends (an event stream stays in flight while it streams).
#[derive(Debug, Clone)]
struct Tracked {
    inner: EdgeService,
    activity: Activity,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<TrackedBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Tracked {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let in_flight = self.activity.start();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| TrackedBody {
                body,
                _in_flight: in_flight,
            }))
        })
    }
}

/// A response body that keeps its request counted until it is dropped.
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sniffed(bytes: &[u8]) -> (Protocol, Vec<u8>) {
        let (protocol, mut stream) = sniff(bytes, Duration::from_secs(1)).await.unwrap();
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.unwrap();
        (protocol, all)
    }

    #[tokio::test]
    async fn the_preface_means_http2_and_every_byte_is_read_again() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0");
        assert_eq!(sniffed(&bytes).await, (Protocol::Http2, bytes));
    }

    #[tokio::test]
    async fn anything_else_is_http1() {
        for request in [
            &b"POST /v1/batch HTTP/1.1\r\n"[..],
            b"PRI * HTTP/1.1\r\n\r\n",
            b"",
        ] {
            assert_eq!(sniffed(request).await, (Protocol::Http1, request.to_vec()));
        }
    }

    #[tokio::test]
    async fn a_silent_connection_is_dropped_after_the_timeout() {
        let (_client, server) = tokio::io::duplex(64);
        assert!(sniff(server, Duration::from_millis(50)).await.is_none());
    }

    #[tokio::test]
    async fn idle_means_nothing_in_flight_for_the_whole_timeout() {
        let activity = Activity::default();
        let timeout = Duration::from_millis(50);
        let request = activity.start();
        let while_busy = tokio::time::timeout(timeout * 4, activity.idle_for(timeout)).await;
        assert!(while_busy.is_err(), "idle with a request in flight");
        drop(request);
        let once_done = tokio::time::timeout(timeout * 40, activity.idle_for(timeout)).await;
        assert!(once_done.is_ok(), "never idle after the request ended");
    }
}
