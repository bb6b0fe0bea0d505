//! The seam under every HTTP call a permitd process makes: Raft RPC between
//! peers, a follower forwarding to its leader, and the client libraries
//! calling a node.
//!
//! Production sends through [`ReqwestTransport`] (one pooled `reqwest::Client`,
//! built by each caller with its own TLS, timeouts and socket options). The
//! deterministic simulator (`sim/`) implements [`HttpTransport`] over its
//! simulated network instead, so the same node and client code runs there
//! unchanged. The trait speaks `http` types, not reqwest's, so an
//! implementation needs nothing but an HTTP connection.
//!
//! Why not a connector under reqwest: reqwest takes no custom connector (its
//! connection type is private), and its own types (`Response`, `Error`) would
//! leak into every caller. One small trait costs one boxed future per call.

mod error;
pub mod frames;
mod reqwest_transport;
mod stream_transport;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use error::{TransportError, TransportErrorKind};
pub use reqwest_transport::ReqwestTransport;
pub use stream_transport::{Connecting, Connector, PeerIo, StreamTransport, STREAM_BODY_MAX_BYTES};

/// A response body: streamed (an event feed, a forwarded answer), boxed so
/// that every transport can hand back its own body type.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// Any error a body or a transport can carry.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What [`HttpTransport::send`] returns.
pub type Sending =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, TransportError>> + Send>>;

/// Sends one HTTP request and hands back its response, whose body is read as
/// it arrives. The request's URI is absolute (`http://host:port/path`).
///
/// A request may carry a [`Deadline`] in its extensions: the whole exchange,
/// reading the response body included, fails with
/// [`TransportErrorKind::Timeout`] once it has passed.
pub trait HttpTransport: Send + Sync + std::fmt::Debug + 'static {
    fn send(&self, request: http::Request<Bytes>) -> Sending;
}

/// A shared transport, as the node's and the client's handles hold it.
pub type Transport = Arc<dyn HttpTransport>;

/// How long a request may take, response body included (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Duration);

/// Reads a whole response body, failing on the first body error.
pub async fn collect(body: Body) -> Result<Bytes, TransportError> {
    use http_body_util::BodyExt;
    body.collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(TransportError::from_body)
}

/// Boxes any body whose errors convert into [`BoxError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    use http_body_util::BodyExt;
    body.map_err(Into::into).boxed_unsync()
}
