//! The production transport: a pooled `reqwest::Client`.

use bytes::Bytes;

use crate::{boxed, Deadline, HttpTransport, Sending};

/// Sends through a `reqwest::Client` its owner built (TLS, connect timeout,
/// keep-alive and the other socket options stay the owner's choice). A
/// [`Deadline`] becomes reqwest's per-request timeout, which covers the body.
#[derive(Debug, Clone)]
pub struct ReqwestTransport {
    client: reqwest::Client,
}

impl ReqwestTransport {
    pub fn new(client: reqwest::Client) -> Self {
        Self { client }
    }
}

impl HttpTransport for ReqwestTransport {
    fn send(&self, request: http::Request<Bytes>) -> Sending {
        let client = self.client.clone();
        Box::pin(async move {
            let deadline = request.extensions().get::<Deadline>().copied();
            let mut request = reqwest::Request::try_from(request)?;
            if let Some(Deadline(timeout)) = deadline {
                *request.timeout_mut() = Some(timeout);
            }
            let response = client.execute(request).await?;
            Ok(http::Response::from(response).map(boxed))
        })
    }
}

impl From<reqwest::Client> for ReqwestTransport {
    fn from(client: reqwest::Client) -> Self {
        Self::new(client)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{collect, TransportErrorKind};

    async fn serve(router: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}")
    }

    fn transport() -> ReqwestTransport {
        ReqwestTransport::new(reqwest::Client::new())
    }

    #[tokio::test]
    async fn a_request_and_its_answer_cross_unchanged() {
        let router = axum::Router::new().route(
            "/echo",
            axum::routing::post(
                |body: Bytes| async move { (axum::http::StatusCode::CREATED, body) },
            ),
        );
        let base = serve(router).await;
        let request = http::Request::post(format!("{base}/echo"))
            .header("content-type", "application/msgpack")
            .body(Bytes::from_static(b"\x01\x02"))
            .unwrap();
        let response = transport().send(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::CREATED);
        assert_eq!(
            collect(response.into_body()).await.unwrap(),
            &b"\x01\x02"[..]
        );
    }

    #[tokio::test]
    async fn a_deadline_covers_a_body_that_never_ends() {
        let router = axum::Router::new().route(
            "/stall",
            axum::routing::get(|| async {
                let forever = futures_stream();
                axum::body::Body::from_stream(forever)
            }),
        );
        let base = serve(router).await;
        let mut request = http::Request::get(format!("{base}/stall"))
            .body(Bytes::new())
            .unwrap();
        request
            .extensions_mut()
            .insert(Deadline(Duration::from_millis(200)));
        let response = transport().send(request).await.unwrap();
        let error = collect(response.into_body()).await.unwrap_err();
        assert_eq!(error.kind, TransportErrorKind::Timeout, "{error}");
    }

    /// One chunk, then nothing: a body that never ends.
    fn futures_stream() -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
        use futures_util::StreamExt;
        futures_util::stream::iter([Ok(Bytes::from_static(b"x"))])
            .chain(futures_util::stream::pending())
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let request = http::Request::get(format!("http://{addr}/"))
            .body(Bytes::new())
            .unwrap();
        let error = transport().send(request).await.unwrap_err();
        assert_eq!(error.kind, TransportErrorKind::Connect, "{error}");
        assert!(error.is_refused(), "{error:?}");
    }

    #[tokio::test]
    async fn an_answer_or_a_timeout_is_not_a_refusal() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Accepts and never answers: the call times out.
        let _held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let mut request = http::Request::get(format!("http://{addr}/"))
            .body(Bytes::new())
            .unwrap();
        request
            .extensions_mut()
            .insert(crate::Deadline(std::time::Duration::from_millis(50)));
        let error = transport().send(request).await.unwrap_err();
        assert!(!error.is_refused(), "{error:?}");
    }
}
