//! The accept loop of a listener: what belongs to the listener, not to one
//! connection. Each accepted connection is served by [`Connections::serve`]
//! (`connection.rs`: TLS, protocol, timeouts, graceful stop), the one path the
//! simulator's connections take too.
//!
//! `axum::serve` has no header-read timeout, so a client that sends half a
//! request header and stops would hold its connection (and a task) forever;
//! hence this loop and `connection.rs`. Here each listener:
//! - serves at most `max_connections` connections at once; further ones wait in
//!   the kernel's accept queue until one closes (a permit per connection, held
//!   from accept to close, the TLS handshake included);
//! - once stopped, accepts no more and waits until every connection it
//!   accepted has finished its requests and closed: until it has all its
//!   permits back.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::connection::Connections;
use crate::config::EdgeLimits;
use crate::shutdown::Shutdown;

/// How long a failed `accept` (out of file descriptors, say) pauses the loop, so
/// it does not spin while the condition lasts.
const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

/// Which connections a listener takes besides HTTP/1.1 and HTTP/2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    /// HTTP only: the API listener.
    Http,
    /// Peers' streams of Raft calls too (`peer_stream.rs`): the Raft listener.
    HttpAndPeerStreams,
}

/// Serves `router` on `listener` (HTTPS when `tls` is set) until `stop` is
/// triggered, then lets the open connections finish their requests and returns.
pub async fn serve(
    listener: TcpListener,
    (router, takes): (Router, Takes),
    limits: EdgeLimits,
    tls: Option<TlsAcceptor>,
    stop: Shutdown,
) {
    let mut connections = Connections::new(router, &limits, tls, stop.clone());
    if takes == Takes::HttpAndPeerStreams {
        connections = connections.with_peer_streams();
    }
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let accepted = tokio::select! {
            () = stop.wait() => break,
            accepted = accept(&listener, &permits) => accepted,
        };
        let Some((stream, permit)) = accepted else {
            continue;
        };
        let connection = connections.clone().serve(stream);
        tokio::spawn(async move {
            connection.await;
            drop(permit);
        });
    }
    // Every connection holds a permit until it closes; the semaphore is never
    // closed, so this waits for the last of them.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
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
