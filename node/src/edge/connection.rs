//! Serving one accepted connection: the TLS handshake, telling HTTP/2 from
//! HTTP/1.1, the router with its timeouts, and the graceful stop.
//!
//! [`Connections::serve`] is the one way a connection is served: the accept
//! loop of a listener ([`super::serve`]) calls it for every TCP connection, and
//! the deterministic simulator for every connection its simulated listener
//! accepts, so both run the same layers, limits and protocol sniffing. Only
//! what belongs to a listener (the connection limit, waiting for the open
//! connections when it stops) stays in the accept loop.
//!
//! - With TLS, the handshake runs in the connection's own task, bounded by the
//!   header-read timeout (a handshake is the first thing a client sends), so a
//!   silent client can neither stall the accept loop nor hold a connection for
//!   long.
//! - HTTP/1.1 and HTTP/2 ([`super::http2`]): over TLS as ALPN agrees, in
//!   cleartext HTTP/2 by prior knowledge (its preface read under the same
//!   header-read timeout, so a connection that sends nothing still closes).
//! - HTTP/1.1 closes a connection whose request header does not arrive within
//!   the header-read timeout (hyper's own timer, which also runs while a
//!   kept-alive connection sits idle, so it is the idle timeout too); an
//!   HTTP/2 connection idle for that timeout gets GOAWAY.
//! - A body that pauses longer than the body-read timeout between parts is
//!   refused (`service.rs`).
//! - Once the stop signal fires, a connection finishes the requests it has
//!   begun and closes (HTTP/1.1: after the response under way; HTTP/2: GOAWAY).

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;

use super::service::{edge_service, EdgeService};
use super::sniff::{sniff, Protocol};
use crate::config::EdgeLimits;
use crate::shutdown::Shutdown;

/// What every connection of one listener is served with. Cloned for each
/// connection (a few reference counts).
#[derive(Clone)]
pub struct Connections {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    service: EdgeService,
    /// The router unwrapped, which peer streams call (`peer_stream.rs`).
    router: Router,
    /// Whether peer streams are taken: on the Raft listener only; elsewhere a
    /// peer stream's preface is just a bad HTTP/1.1 request.
    peer_streams: bool,
    /// HTTPS when set.
    tls: Option<TlsAcceptor>,
    /// The header-read timeout: also bounds a TLS handshake, the HTTP/2
    /// preface and an HTTP/2 connection's idle time.
    timeout: Duration,
    stop: Shutdown,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("tls", &self.tls.is_some())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Connections {
    /// Serves `router` (the public or the internal one, `edge::api`) within
    /// `limits`' timeouts, over TLS when `tls` is set, until `stop` fires.
    pub fn new(
        router: Router,
        limits: &EdgeLimits,
        tls: Option<TlsAcceptor>,
        stop: Shutdown,
    ) -> Self {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout);
        Self {
            http1,
            http2: super::http2::builder(),
            service: edge_service(router.clone(), limits.body_read_timeout),
            router,
            peer_streams: false,
            tls,
            timeout: limits.header_read_timeout,
            stop,
        }
    }

    /// Also takes peer streams (the Raft listener), whose calls go to the
    /// same router.
    pub fn with_peer_streams(mut self) -> Self {
        self.peer_streams = true;
        self
    }

    /// Serves one accepted connection until it closes, times out, or the stop
    /// signal has let its requests finish. Any stream will do: a TCP
    /// connection, or the simulator's. How a connection ends is the client's
    /// business, not an error of the node's: it is logged at DEBUG.
    pub async fn serve<S>(self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match self.tls.clone() {
            None => self.cleartext(stream).await,
            Some(acceptor) => self.over_tls(&acceptor, stream).await,
        }
    }

    /// A cleartext connection: HTTP/2 when it opens with the preface.
    async fn cleartext<S>(self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let sniffed = self
            .unless_stopping(sniff(stream, self.timeout, self.peer_streams))
            .await;
        if let Some((protocol, stream)) = sniffed.flatten() {
            self.speak(protocol, stream).await;
        }
    }

    /// A TLS connection: the handshake, then the protocol ALPN agreed on, or,
    /// without ALPN's HTTP/2 where peer streams are taken, the preface.
    async fn over_tls<S>(self, acceptor: &TlsAcceptor, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let handshaken = self.unless_stopping(handshake(acceptor, stream, self.timeout));
        let Some(stream) = handshaken.await.flatten() else {
            return;
        };
        if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
            return self.speak(Protocol::Http2, stream).await;
        }
        if !self.peer_streams {
            return self.speak(Protocol::Http1, stream).await;
        }
        let sniffed = self.unless_stopping(sniff(stream, self.timeout, true));
        if let Some((protocol, stream)) = sniffed.await.flatten() {
            self.speak(protocol, stream).await;
        }
    }

    /// `step`, or `None` once the server stops. A connection that has not
    /// sent its first bytes (or finished its TLS handshake) is not served yet,
    /// so no graceful stop closes it: the stop waited out the header-read
    /// timeout for it (10 s, in which a stopping leader went on reclaiming
    /// grants: the `serve_without_config` test saw its grant reclaimed).
    async fn unless_stopping<F: Future>(&self, step: F) -> Option<F::Output> {
        tokio::select! {
            done = step => Some(done),
            () = self.stop.wait() => None,
        }
    }

    async fn speak<T>(self, protocol: Protocol, stream: T)
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match protocol {
            Protocol::Http1 => {
                http1_until_stopped(&self.http1, stream, self.service, &self.stop).await
            }
            Protocol::Http2 => {
                let timeout = self.timeout;
                super::http2::serve(&self.http2, stream, self.service, self.stop, timeout).await;
            }
            Protocol::PeerStream => {
                super::peer_stream::serve(stream, self.router, self.timeout, self.stop).await;
            }
        }
    }
}

/// One HTTP/1.1 connection's requests, until it closes or `stop` fires; then
/// the response under way is finished and the connection closed.
async fn http1_until_stopped<T>(
    builder: &http1::Builder,
    stream: T,
    service: EdgeService,
    stop: &Shutdown,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(error) = ended {
                    tracing::debug!(%error, "connection ended");
                }
                return;
            }
            () = stop.wait(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// The TLS handshake, dropped after `timeout`; `None` when it fails.
async fn handshake<S>(
    acceptor: &TlsAcceptor,
    stream: S,
    timeout: Duration,
) -> Option<tokio_rustls::server::TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            tracing::debug!(%error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            None
        }
    }
}

#[cfg(test)]
mod peer_stream_tests;

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::get;

    use super::*;

    fn connections(stop: &Shutdown) -> Connections {
        let router = Router::new().route("/healthz", get(|| async { "ok" }));
        Connections::new(router, &EdgeLimits::default(), None, stop.clone())
    }

    /// One connection over an in-memory pipe, no socket: served as a TCP
    /// one is, answered over HTTP/1.1, and closed once the stop signal fires.
    #[tokio::test]
    async fn a_connection_of_any_stream_is_served_and_stopped() {
        let stop = Shutdown::default();
        let (client, server) = tokio::io::duplex(64 * 1024);
        let served = tokio::spawn(connections(&stop).serve(server));
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .expect("handshake");
        let connection = tokio::spawn(connection);
        let request = Request::get("/healthz")
            .header("host", "node")
            .body(Body::empty())
            .unwrap();
        let response = sender.send_request(request).await.expect("answered");
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(Body::new(response.into_body()), 1024);
        assert_eq!(body.await.unwrap(), "ok");

        // Kept alive and idle: the stop closes it at once.
        stop.trigger();
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("the connection closed on stop")
            .unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
    }

    /// A connection that never sends a byte is closed at the header-read timeout.
    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_header_read_timeout() {
        let router = Router::new();
        let limits = EdgeLimits {
            header_read_timeout: Duration::from_millis(50),
            ..EdgeLimits::default()
        };
        let connections = Connections::new(router, &limits, None, Shutdown::default());
        let (_client, server) = tokio::io::duplex(1024);
        tokio::time::timeout(Duration::from_secs(5), connections.serve(server))
            .await
            .expect("closed");
    }
}
