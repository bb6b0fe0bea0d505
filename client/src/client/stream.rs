//! Long-lived `GET`s (the event stream): no call deadline and no retry loop,
//! since the body may flow for hours; the endpoints are tried in order until
//! one answers.

use permitd_transport::Body;
use url::Url;

use super::handle::SemaphoreClient;
use super::http::{is_retryable, rejected, url_of};
use crate::error::ClientError;
use crate::outgoing::Outgoing;

impl SemaphoreClient {
    /// Opens a streamed `GET` (no deadline on the body) on the first endpoint,
    /// in order, that answers; a refusal (4xx) is final, an unreachable or
    /// unavailable node passes the call to the next endpoint. Answers the URL
    /// that answered and the body, to be read as it arrives.
    pub(crate) async fn open_stream(
        &self,
        path: &[String],
        query: &[(&str, String)],
    ) -> Result<(Url, Body), ClientError> {
        let endpoints = self.tracker().endpoints().to_vec();
        let token = self.inner.config.token.as_deref();
        let mut last = String::from("no endpoint answered");
        for endpoint in &endpoints {
            let url = url_of(endpoint, path, query);
            let sent = Outgoing::get(&url)
                .bearer(token)
                .send(&self.inner.transport)
                .await;
            let response = match sent {
                Ok(response) => response,
                Err(error) => {
                    last = format!("{}: {error}", endpoint.as_str());
                    continue;
                }
            };
            let status = response.status();
            if status.is_success() {
                return Ok((url, response.into_body()));
            }
            let body = permitd_transport::collect(response.into_body())
                .await
                .unwrap_or_default();
            let error = rejected(status, &body);
            if !is_retryable(status) {
                return Err(error);
            }
            last = error.to_string();
        }
        Err(ClientError::DeadlineExceeded {
            deadline: self.inner.config.connect_timeout,
            attempts: u32::try_from(endpoints.len()).unwrap_or(u32::MAX),
            last,
        })
    }
}
