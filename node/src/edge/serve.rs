//! The HTTP edge: accepting connections and serving a router on them, with every
//! wait bounded.
//!
//! `axum::serve` has no header-read timeout, so a client that sends half a request
//! header and stops holds its connection (and a task) forever. Here each listener:
//! - serves at most `max_connections` connections at once; further ones wait in the
//!   kernel's accept queue until one closes (a permit per connection);
//! - closes a connection whose request header does not arrive within
//!   `header_read_timeout` (hyper's own timer, which also runs while a kept-alive
//!   connection sits idle, so it is the idle timeout too);
//! - refuses a body that pauses longer than `body_read_timeout` between parts
//!   (tower-http's `RequestBodyTimeoutLayer`).
//!
//! - with TLS, runs the handshake in the connection's own task, bounded by the
//!   same `header_read_timeout` (a handshake is the first thing a client sends)
//!   and counted against the same connection permits, so a silent client can
//!   neither stall the accept loop nor hold a connection for long.
//!
//! - speaks HTTP/1.1 and HTTP/2 ([`super::http2`]): over TLS as ALPN agrees, in
//!   cleartext HTTP/2 by prior knowledge (its preface read under the same
//!   header-read timeout, so a connection that sends nothing still closes);
//!   an HTTP/2 connection idle for that timeout gets GOAWAY.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::http2::{sniff, Protocol};
use super::service::{edge_service, EdgeService};
use crate::config::EdgeLimits;
use crate::shutdown::Shutdown;

/// How long a failed `accept` (out of file descriptors, say) pauses the loop, so
/// it does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

/// Serves `router` on `listener` (HTTPS when `tls` is set) until `stop` is
/// triggered, then lets the open connections finish their requests and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: EdgeLimits,
    tls: Option<TlsAcceptor>,
    stop: Shutdown,
) {
    let service = edge_service(router, limits.body_read_timeout);
    let mut http1 = http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let connections = Connections {
        http1,
        http2: super::http2::builder(),
        service,
        timeout: limits.header_read_timeout,
        stop: stop.clone(),
    };
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            () = stop.wait() => break,
            accepted = accept(&listener, &permits) => accepted,
        };
        let Some((stream, permit)) = accepted else {
            continue;
        };
        let (connections, watcher, tls) = (connections.clone(), graceful.watcher(), tls.clone());
        tokio::spawn(async move {
            match tls {
                None => connections.cleartext(stream, watcher).await,
                Some(acceptor) => connections.tls(&acceptor, stream, watcher).await,
            }
            drop(permit);
        });
    }
    graceful.shutdown().await;
}

/// What every connection of a listener is served with.
#[derive(Clone)]
struct Connections {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    service: EdgeService,
    /// The header-read timeout: also bounds a TLS handshake, the HTTP/2
    /// preface and an HTTP/2 connection's idle time.
    timeout: Duration,
    stop: Shutdown,
}

impl Connections {
    /// A cleartext connection: HTTP/2 when it opens with the preface.
    async fn cleartext(self, stream: TcpStream, watcher: Watcher) {
        let sniffed = self.unless_stopping(sniff(stream, self.timeout)).await;
        if let Some((protocol, stream)) = sniffed.flatten() {
            self.serve(protocol, stream, watcher).await;
        }
    }

    /// A TLS connection: the handshake, then the protocol ALPN agreed on.
    async fn tls(self, acceptor: &TlsAcceptor, stream: TcpStream, watcher: Watcher) {
        let handshaken = self.unless_stopping(handshake(acceptor, stream, self.timeout));
        let Some(stream) = handshaken.await.flatten() else {
            return;
        };
        let protocol = match stream.get_ref().1.alpn_protocol() {
            Some(b"h2") => Protocol::Http2,
            _ => Protocol::Http1,
        };
        self.serve(protocol, stream, watcher).await;
    }

    /// `step`, or `None` once the server stops. A connection that has not
    /// sent its first bytes (or finished its TLS handshake) is not served yet,
    /// so no graceful stop closes it: the stop waited out the header-read
    /// timeout for it (10 s, in which a stopping leader went on reclaiming
    /// grants: the `serve_without_config` test saw its grant reclaimed).
    async fn unless_stopping<F: std::future::Future>(&self, step: F) -> Option<F::Output> {
        tokio::select! {
            done = step => Some(done),
            () = self.stop.wait() => None,
        }
    }

    async fn serve<T>(self, protocol: Protocol, stream: T, watcher: Watcher)
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match protocol {
            Protocol::Http1 => serve_connection(&self.http1, stream, self.service, watcher).await,
            Protocol::Http2 => {
                // Watched by hand (the stop signal, the idle timer); holding the
                // watcher keeps the listener's graceful stop waiting for it.
                let timeout = self.timeout;
                super::http2::serve(&self.http2, stream, self.service, self.stop, timeout).await;
                drop(watcher);
            }
        }
    }
}

/// One connection's requests, until it closes or the server stops.
async fn serve_connection<T>(
    builder: &http1::Builder,
    stream: T,
    service: EdgeService,
    watcher: Watcher,
) where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    // A closed or timed-out connection is the client's business, not an error of
    // the node's.
    if let Err(error) = watcher.watch(connection).await {
        tracing::debug!(%error, "connection ended");
    }
}

/// The TLS handshake, dropped after `timeout`; `None` when it fails.
async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    timeout: Duration,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
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

/// Waits for a connection permit, then for a connection. `None` after a failed
/// `accept`, which is logged and paused on.
async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
) -> Option<(TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    let permit = Arc::clone(permits).acquire_owned().await.ok()?;
    match listener.accept().await {
        Ok((stream, _)) => {
            let _ = stream.set_nodelay(true);
            Some((stream, permit))
        }
        Err(error) => {
            tracing::warn!(%error, "accept failed");
            tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
            None
        }
    }
}
