//! HTTP request metrics: a counter by route, method and status, and a latency
//! histogram by route and method.
//!
//! - `permitd_http_requests_total{listener, route, method, status}`;
//! - `permitd_http_request_duration_seconds{listener, route, method}` (histogram).
//!
//! `route` is the matched route template (`/v1/semaphores/{key}`), never the raw
//! path, so the number of series is bounded by the routes the node serves, not by
//! the keys clients name; calls that match no route count as `unmatched`.
//! `listener` is `api` or `raft`. A `request` waits for its key's round, so the
//! latency of `POST /v1/semaphores/{key}` includes `roundWaitMs`.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

pub const HTTP_REQUESTS: &str = "permitd_http_requests_total";
pub const HTTP_DURATION: &str = "permitd_http_request_duration_seconds";

/// Latency buckets, in seconds: 1 ms to 60 s (a request may be held 15 s plus
/// its key's rounds, and a forwarded one a few seconds more: see
/// `edge/api/forward/deadline.rs`).
pub const HTTP_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The route label of calls that matched no route.
pub const UNMATCHED: &str = "unmatched";

/// Middleware for the public listener.
pub async fn track_api(request: Request, next: Next) -> Response {
    track("api", request, next).await
}

/// Middleware for the peer listener.
pub async fn track_raft(request: Request, next: Next) -> Response {
    track("raft", request, next).await
}

async fn track(listener: &'static str, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| UNMATCHED.to_owned(), |path| path.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!(
        HTTP_DURATION,
        "listener" => listener,
        "route" => route.clone(),
        "method" => method.clone()
    )
    .record(started.elapsed().as_secs_f64());
    metrics::counter!(
        HTTP_REQUESTS,
        "listener" => listener,
        "route" => route,
        "method" => method,
        "status" => status
    )
    .increment(1);
    response
}

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    metrics::describe_counter!(HTTP_REQUESTS, "HTTP calls by route, method and status.");
    metrics::describe_histogram!(
        HTTP_DURATION,
        metrics::Unit::Seconds,
        "HTTP call latency by route and method."
    );
}
