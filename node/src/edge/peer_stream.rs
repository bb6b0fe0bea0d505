//! Serving a peer's stream of Raft calls ([`permitd_transport::frames`]) on
//! the Raft listener: each request frame is a call to the internal router,
//! exactly as if it had come as HTTP/1.1 (the same routes, peer-secret check,
//! body limit, metrics and trace layers), answered by a frame with its id as
//! soon as it is done, in whatever order the calls finish.
//!
//! Limits:
//! - the first frame must come within the header-read timeout, as an HTTP/1.1
//!   request's header must;
//! - a call answered 401 (no peer secret) closes the stream once its answer is
//!   written: only a peer keeps a stream open while it sends nothing;
//! - at most [`CALLS_IN_FLIGHT`] calls of one stream run at once; the next
//!   frame is read only when one ends;
//! - a frame over [`permitd_transport::frames::MAX_FRAME_BYTES`] or one that
//!   does not parse closes the stream.
//!
//! Once `stop` fires, no frame is read any more, the calls under way finish
//! and their answers are written, and the stream closes.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::Router;
use permitd_transport::frames::{self, read_frame, write_frames, MAX_FRAME_BYTES, PREFACE};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, Notify, Semaphore};
use tower::ServiceExt;

use crate::shutdown::Shutdown;

/// Calls of one stream running at once.
pub const CALLS_IN_FLIGHT: usize = 256;

/// Serves one peer stream (its preface not yet read) until the peer closes
/// it, it breaks a limit above, or `stop` fires.
pub async fn serve<S>(stream: S, router: Router, first_frame_timeout: Duration, stop: Shutdown)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (read, write) = tokio::io::split(stream);
    let mut read = frames::frame_reader(read);
    let mut preface = [0u8; PREFACE.len()];
    let opened = tokio::time::timeout(first_frame_timeout, read.read_exact(&mut preface)).await;
    if !matches!(opened, Ok(Ok(_))) || preface != PREFACE {
        return;
    }
    let (answers, queued) = mpsc::channel(CALLS_IN_FLIGHT);
    let writer = tokio::spawn(write_frames(write, queued));
    let calls = Arc::new(Semaphore::new(CALLS_IN_FLIGHT));
    // Set when a call is refused as unauthorised: the stream then closes.
    let refused = Arc::new(Notify::new());
    let mut first = true;
    loop {
        let next = async {
            if first {
                tokio::time::timeout(first_frame_timeout, read_frame(&mut read))
                    .await
                    .unwrap_or(Ok(None))
            } else {
                read_frame(&mut read).await
            }
        };
        let frame = tokio::select! {
            frame = next => frame,
            () = stop.wait() => break,
            () = refused.notified() => break,
        };
        first = false;
        let request = match frame {
            Ok(Some(rest)) => match frames::decode_request(rest) {
                Ok(request) => request,
                Err(error) => {
                    tracing::debug!(%error, "a peer stream sent a bad frame");
                    break;
                }
            },
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%error, "a peer stream ended");
                break;
            }
        };
        let Ok(permit) = calls.clone().acquire_owned().await else {
            break;
        };
        let (router, answers, refused) = (router.clone(), answers.clone(), refused.clone());
        tokio::spawn(async move {
            let answer = call(router, request.request).await;
            if answer.status() == StatusCode::UNAUTHORIZED {
                refused.notify_one();
            }
            match frames::encode_answer(request.id, &answer) {
                Ok(frame) => {
                    let _ = answers.send(frame).await;
                }
                Err(error) => tracing::warn!(%error, "a peer call's answer does not fit a frame"),
            }
            drop(permit);
        });
    }
    // The calls under way finish and their answers go out; then the writer,
    // its queue's last sender gone, flushes and closes.
    let all = u32::try_from(CALLS_IN_FLIGHT).expect("a small constant");
    let _ = calls.acquire_many(all).await;
    drop(answers);
    if let Ok(Err(error)) = writer.await {
        tracing::debug!(%error, "writing to a peer stream failed");
    }
}

/// One call through the router, its answer's body read whole (a Raft answer
/// is small; one that would not fit a frame is a 500).
async fn call(router: Router, request: axum::http::Request<Bytes>) -> axum::http::Response<Bytes> {
    let answer = match router.oneshot(request.map(Body::from)).await {
        Ok(answer) => answer,
        Err(infallible) => match infallible {},
    };
    let (parts, body) = answer.into_parts();
    match axum::body::to_bytes(body, MAX_FRAME_BYTES / 2).await {
        Ok(bytes) => axum::http::Response::from_parts(parts, bytes),
        Err(error) => {
            tracing::warn!(%error, "a peer call's answer could not be read");
            let mut answer = axum::http::Response::new(Bytes::new());
            *answer.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            answer
        }
    }
}
