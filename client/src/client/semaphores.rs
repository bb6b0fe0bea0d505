//! The runner's calls: `request` (wait for a round), `sync` (reports only),
//! `batch` (many of both, for many keys, in one call) and `usage`.
//!
//! Every `request` leaves with a `requestId` (a fresh UUID v4 when the caller
//! set none) that stays the same across the call's attempts, so a retry of a
//! round the holder already committed is answered with the original grant
//! instead of being granted twice. A grant's `nextRequestAt` is remembered for
//! the key's next `request` (`next_request.rs`).

use http::Method;
use permitd_core::contract::batch::{BatchItem, BatchItemAnswer, BatchRequest, BatchResponse};
use permitd_core::contract::paths;
use permitd_core::contract::protocol::{
    PermitGrant, PermitRequest, PermitSync, PermitSyncResult, SemaphoreRequest, SemaphoreResponse,
    V1,
};
use permitd_core::Usage;
use tokio::time::Instant;

use super::handle::SemaphoreClient;
use crate::error::ClientError;

/// One batch item's answer, or the error its own call would have had.
pub type ItemResult = Result<SemaphoreResponse, ClientError>;

impl SemaphoreClient {
    /// Sends a `request` for `key` and waits for its round. Sets a `requestId`
    /// when the caller set none; waits for the key's `nextRequestAt` first,
    /// inside the call's deadline: when `nextRequestAt` falls after it, the
    /// call fails at once with [`ClientError::DeadlineExceeded`] instead of
    /// sleeping past it.
    ///
    /// `request` and [`Self::sync`] are independent calls on a cloneable
    /// client: a caller driving the protocol itself sends claims and releases
    /// with `sync` while a `request` waits for its round, as the queue does
    /// (one of each in flight per key; reports are cumulative, so their
    /// answers may come in either order).
    pub async fn request(
        &self,
        key: &str,
        mut request: PermitRequest,
    ) -> Result<PermitGrant, ClientError> {
        self.with_request_id(&mut request);
        let deadline = Instant::now() + self.inner.config.call_timeout;
        self.wait_for_next_request_at(key, deadline).await?;
        let path = paths::segments(paths::SEMAPHORE, &[key]);
        let message = SemaphoreRequest::Request(request);
        let answer = self
            .call_until(Method::POST, &path, &[], Some(&message), deadline)
            .await?;
        match answer {
            SemaphoreResponse::Grant(grant) => {
                self.remember_next_request_at(key, grant.next_request_at_ms);
                Ok(grant)
            }
            SemaphoreResponse::Synced(_) => Err(unexpected(key, "a synced answer to a request")),
        }
    }

    /// Sends a `sync` (reports only) for `key`; applied without waiting for a round.
    pub async fn sync(&self, key: &str, sync: PermitSync) -> Result<PermitSyncResult, ClientError> {
        let path = paths::segments(paths::SEMAPHORE, &[key]);
        let message = SemaphoreRequest::Sync(sync);
        match self.call(Method::POST, &path, Some(&message)).await? {
            SemaphoreResponse::Synced(result) => Ok(result),
            SemaphoreResponse::Grant(_) => Err(unexpected(key, "a grant answer to a sync")),
        }
    }

    /// Sends many `request`s and `sync`s, for many keys, in one call
    /// (`POST /v1/batch`, at most `MAX_BATCH_ITEMS` items and `MAX_BATCH_KEYS`
    /// keys), and returns each item's own answer or error, in order: an item's
    /// error ([`ClientError::Rejected`], with the status its own call would have
    /// had) never fails its neighbours. `request` items get a `requestId` when
    /// they have none, so a retried call replays them. The call is answered
    /// when its slowest item is (a `request` when its key's round runs); unlike
    /// [`Self::request`] it does not wait for a key's `nextRequestAt` first.
    pub async fn batch(&self, mut items: Vec<BatchItem>) -> Result<Vec<ItemResult>, ClientError> {
        for item in &mut items {
            if let SemaphoreRequest::Request(request) = &mut item.message {
                self.with_request_id(request);
            }
        }
        let path = paths::segments(paths::BATCH, &[]);
        let body = BatchRequest { v: V1, items };
        let answer: BatchResponse = self.call(Method::POST, &path, Some(&body)).await?;
        if answer.items.len() != body.items.len() {
            return Err(ClientError::UnexpectedAnswer {
                url: paths::BATCH.to_owned(),
                reason: format!(
                    "{} answers to {} items",
                    answer.items.len(),
                    body.items.len()
                ),
            });
        }
        let results = body.items.iter().zip(answer.items);
        Ok(results
            .map(|(item, answer)| self.item_result(item, answer))
            .collect())
    }

    /// The key's linearizable usage.
    pub async fn usage(&self, key: &str) -> Result<Usage, ClientError> {
        self.get(&paths::segments(paths::USAGE, &[key])).await
    }

    /// One batch item's answer as its own call's result; a grant's
    /// `nextRequestAt` is remembered as [`Self::request`] would.
    fn item_result(&self, item: &BatchItem, answer: BatchItemAnswer) -> ItemResult {
        let status = answer.status;
        let result = answer.into_result().map_err(|error| ClientError::Rejected {
            status,
            code: error.code,
            message: error.message,
            field: error.field,
        });
        if let Ok(SemaphoreResponse::Grant(grant)) = &result {
            self.remember_next_request_at(&item.key, grant.next_request_at_ms);
        }
        result
    }
}

impl SemaphoreClient {
    /// Gives `request` a fresh `requestId` when the caller set none, before the
    /// first attempt, so every retry carries the same one.
    fn with_request_id(&self, request: &mut PermitRequest) {
        if request.request_id.is_none() {
            request.request_id = Some(self.new_uuid().to_string());
        }
    }
}

/// The error of an answer of the wrong kind for the message sent.
fn unexpected(key: &str, reason: &str) -> ClientError {
    ClientError::UnexpectedAnswer {
        url: paths::SEMAPHORE.replace("{key}", key),
        reason: reason.to_string(),
    }
}
