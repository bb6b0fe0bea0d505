//! The router as hyper serves it, shared by the HTTP/1.1 and HTTP/2 paths of
//! [`super::serve`] and [`super::http2`]: one definition both import, so
//! neither of them depends on the other for it.

use std::time::Duration;

use axum::Router;
use hyper_util::service::TowerToHyperService;
use tower_http::timeout::{RequestBodyTimeout, RequestBodyTimeoutLayer};

/// The router as hyper serves it: body reads bounded in time.
pub(super) type EdgeService = TowerToHyperService<RequestBodyTimeout<Router>>;

/// Wraps `router` for hyper: a body that pauses longer than
/// `body_read_timeout` between parts is refused.
pub(super) fn edge_service(router: Router, body_read_timeout: Duration) -> EdgeService {
    let service = tower::ServiceBuilder::new()
        .layer(RequestBodyTimeoutLayer::new(body_read_timeout))
        .service(router);
    TowerToHyperService::new(service)
}
