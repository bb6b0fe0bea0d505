//! Long-lived `GET`s (the event stream): no call deadline and no retry loop,
//! since the body may flow for hours; the endpoints are tried in order until
//! one answers.

use super::handle::SemaphoreClient;
use super::http::{authorized, is_retryable, rejected, url_of};
use crate::error::ClientError;

impl SemaphoreClient {
    /// Opens a streamed `GET` (no deadline on the body) on the first endpoint,
    /// in order, that answers; a refusal (4xx) is final, an unreachable or
    /// unavailable node passes the call to the next endpoint.
    pub(crate) async fn open_stream(
        &self,
        path: &[String],
        query: &[(&str, String)],
    ) -> Result<reqwest::Response, ClientError> {
        let endpoints = self.tracker().endpoints().to_vec();
        let token = self.inner.config.token.as_deref();
        let mut last = String::from("no endpoint answered");
        for endpoint in &endpoints {
            let request = self.inner.http.get(url_of(endpoint, path, query));
            let response = match authorized(request, token).send().await {
                Ok(response) => response,
                Err(error) => {
                    last = format!("{}: {error}", endpoint.as_str());
                    continue;
                }
            };
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            let body = response.bytes().await.unwrap_or_default();
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
