//! HTTP/2 on the edge: bounding an HTTP/2 connection's idle time as
//! HTTP/1.1's header-read timeout bounds it. (Telling HTTP/2 from HTTP/1.1 on
//! a connection is `sniff.rs`.)
//!
//! hyper's HTTP/2 server has no idle timeout: a client could open a connection
//! and keep it without a request, holding one of the listener's connection
//! permits for ever. [`serve`] counts the requests in flight (until their
//! response body ends) and, after a header-read timeout with none, sends GOAWAY;
//! a peer that still holds the connection one timeout later is dropped.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http2;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::service::EdgeService;
use crate::shutdown::Shutdown;

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
