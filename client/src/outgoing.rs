//! One HTTP request to a node, built as the client's
//! [`Transport`](permitd_transport::Transport) takes it: an absolute URI, the
//! bearer token, a JSON body, and how long it may take (a
//! [`Deadline`](permitd_transport::Deadline), which covers the answer's body).
//!
//! Every call of the crate leaves through here (the call loop, the status and
//! readiness probes, the event stream), so that no caller builds requests of
//! its own and all of them go through the one transport the client was given:
//! production's reqwest client, or a simulated network (issue 34).

use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, Uri};
use permitd_transport::{Body, Deadline, Transport, TransportError, TransportErrorKind};
use url::Url;

/// A request being put together. Nothing is checked until [`Outgoing::send`],
/// where a request that cannot be built (a token no header can carry, a URL
/// too long for a URI) fails as [`TransportErrorKind::Request`], as reqwest's
/// builder errors did: the caller handles every failure in one place.
#[derive(Debug)]
pub(crate) struct Outgoing {
    method: Method,
    url: String,
    token: Option<String>,
    json: Option<Bytes>,
    limit: Option<Duration>,
}

impl Outgoing {
    pub(crate) fn new(method: Method, url: &Url) -> Self {
        Self {
            method,
            url: url.as_str().to_owned(),
            token: None,
            json: None,
            limit: None,
        }
    }

    pub(crate) fn get(url: &Url) -> Self {
        Self::new(Method::GET, url)
    }

    /// Sends `token` as `Authorization: Bearer …` (marked sensitive, so that
    /// no transport logs it), when there is one.
    pub(crate) fn bearer(mut self, token: Option<&str>) -> Self {
        self.token = token.map(str::to_owned);
        self
    }

    /// A JSON body, with its content type.
    pub(crate) fn json(mut self, body: Bytes) -> Self {
        self.json = Some(body);
        self
    }

    /// Fails the exchange, answer body included, once `limit` has passed.
    pub(crate) fn limit(mut self, limit: Duration) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Sends the request and hands back the answer, its body still to read.
    pub(crate) async fn send(
        self,
        transport: &Transport,
    ) -> Result<Response<Body>, TransportError> {
        let request = self.into_request()?;
        transport.send(request).await
    }

    fn into_request(self) -> Result<Request<Bytes>, TransportError> {
        let unbuildable =
            |error: http::Error| TransportError::new(TransportErrorKind::Request, error);
        let uri = Uri::try_from(self.url.as_str()).map_err(|error| unbuildable(error.into()))?;
        let mut builder = Request::builder().method(self.method).uri(uri);
        if let Some(token) = &self.token {
            let mut value = HeaderValue::try_from(format!("Bearer {token}"))
                .map_err(|error| unbuildable(error.into()))?;
            value.set_sensitive(true);
            builder = builder.header(AUTHORIZATION, value);
        }
        let body = match self.json {
            Some(json) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                json
            }
            None => Bytes::new(),
        };
        if let Some(limit) = self.limit {
            builder = builder.extension(Deadline(limit));
        }
        builder.body(body).map_err(unbuildable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn a_request_carries_its_token_body_and_deadline() {
        let request = Outgoing::new(Method::POST, &url("http://n:1/v1/semaphores/a%2Fb"))
            .bearer(Some("pmt_x"))
            .json(Bytes::from_static(b"{}"))
            .limit(Duration::from_millis(250))
            .into_request()
            .unwrap();
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri(), "http://n:1/v1/semaphores/a%2Fb");
        let token = &request.headers()[AUTHORIZATION];
        assert_eq!(token, "Bearer pmt_x");
        assert!(token.is_sensitive());
        assert_eq!(request.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(
            request.extensions().get::<Deadline>(),
            Some(&Deadline(Duration::from_millis(250)))
        );
        assert_eq!(request.body(), &b"{}"[..]);
    }

    #[test]
    fn a_bare_get_has_no_token_body_or_deadline() {
        let request = Outgoing::get(&url("http://n:1/readyz"))
            .bearer(None)
            .into_request()
            .unwrap();
        assert!(request.headers().is_empty());
        assert!(request.extensions().get::<Deadline>().is_none());
        assert!(request.body().is_empty());
    }

    #[test]
    fn a_token_no_header_can_carry_is_a_request_error() {
        let error = Outgoing::get(&url("http://n:1/"))
            .bearer(Some("bad\ntoken"))
            .into_request()
            .unwrap_err();
        assert_eq!(error.kind, TransportErrorKind::Request);
    }
}
