//! A `requestId` replay: a runner sends a request with its own `requestId`
//! over the bare transport (so it holds the answer's bytes, not the client's
//! reading of them), and sends the same bytes again after the answer; half
//! the time the first answer is lost first (the call dropped after 1–30 ms,
//! which may be before or after its round committed), and the bytes are sent
//! until answered. The leader must answer a repeated `requestId` with the
//! remembered answer, byte for byte, while its grants are unclaimed and
//! inside their claim window (docs/protocol.md, "Fences, retries and the
//! clock"); [`crate::checker::writes::check_replays`] compares them. Then the
//! grant is claimed, worked under and released like any other.

use std::time::Duration;

use bytes::Bytes;
use permitd_core::contract::protocol::{
    Demand, PermitRequest, SemaphoreRequest, SemaphoreResponse, V1,
};
use permitd_transport::HttpTransport;
use rand::Rng;

use super::runner::Runner;
use super::{now, PLAIN_GROUP, REPLAY_SUFFIX};
use crate::history::{Ask, AskOutcome, Replay};
use crate::net::SimTransport;

/// How long a replay keeps sending its bytes before it gives up.
const REPLAY_PATIENCE: Duration = Duration::from_secs(10);
/// The pause between two sends that got no answer.
const RESEND_AFTER: Duration = Duration::from_millis(50);

impl Runner {
    pub(super) async fn replay_job(&mut self, client_id: &str) {
        let key = self.any_key();
        let client_id = format!("{client_id}{REPLAY_SUFFIX}");
        let request = PermitRequest {
            v: V1,
            client_id: client_id.clone(),
            request_id: Some(format!("{client_id}-request")),
            demand: vec![Demand {
                group: PLAIN_GROUP.to_owned(),
                count: 1,
                oldest_at_ms: self.client.now_ms(),
            }],
            grants: vec![],
            leases: None,
            wait_ms: Some(self.rng.random_range(100..1_500)),
        };
        let body = serde_json::to_vec(&SemaphoreRequest::Request(request.clone()))
            .expect("a request serialises");
        let body = Bytes::from(body);
        let sent = now();
        let index = self.shared.history.ask(Ask::waiting(
            &key.name,
            PLAIN_GROUP,
            &client_id,
            1,
            sent,
            Duration::from_millis(request.wait_ms.unwrap_or(0)),
        ));
        let mut first = None;
        if self.rng.random_bool(0.5) {
            let lost_after = Duration::from_millis(self.rng.random_range(1..30));
            match tokio::time::timeout(lost_after, self.send(&key.name, body.clone())).await {
                Ok(Some(answer)) => first = Some(answer),
                _ => self.event(format_args!("loses the answer for {}", key.name)),
            }
        }
        let first = match first {
            Some(answer) => Some(answer),
            None => self.send_until_answered(&key.name, &body).await,
        };
        let Some(first) = first else {
            let at = now();
            self.event(format_args!("replay of {} got no answer", key.name));
            self.shared
                .history
                .update_ask(index, |ask| ask.outcome = AskOutcome::Failed { at });
            return;
        };
        let grants = match serde_json::from_slice::<SemaphoreResponse>(&first) {
            Ok(SemaphoreResponse::Grant(grant)) => grant.grants,
            _ => vec![],
        };
        self.answered(index, &key.name, &grants);
        if !grants.is_empty() {
            let repeated = now();
            if let Some(again) = self.send_until_answered(&key.name, &body).await {
                let at = now();
                if again == first {
                    self.event(format_args!("replayed {}: the same answer", key.name));
                } else {
                    self.event(format_args!(
                        "replayed {}: another answer: {} then {}",
                        key.name,
                        String::from_utf8_lossy(&first),
                        String::from_utf8_lossy(&again)
                    ));
                    self.return_another(&key.name, &client_id, &again, repeated)
                        .await;
                }
                self.shared.history.lock().replays.push(Replay {
                    key: key.name.clone(),
                    client_id: client_id.clone(),
                    sent,
                    answered: at,
                    first: first.to_vec(),
                    again: again.to_vec(),
                });
            }
        }
        let hold = self.hold();
        self.work_under(&client_id, vec![(key.name.clone(), index, grants)], hold)
            .await;
    }

    /// A repeat answered with other grants (the leader forgot the
    /// `requestId`: its claim window had passed by the leader's clock) was
    /// granted anew: those grants are recorded as a request of their own and
    /// returned at once.
    async fn return_another(&mut self, key: &str, client_id: &str, again: &[u8], sent: Duration) {
        let Ok(SemaphoreResponse::Grant(grant)) = serde_json::from_slice(again) else {
            return;
        };
        let index = self.shared.history.ask(Ask::waiting(
            key,
            PLAIN_GROUP,
            client_id,
            1,
            sent,
            Duration::ZERO,
        ));
        self.answered(index, key, &grant.grants);
        self.work_under(
            client_id,
            vec![(key.to_owned(), index, grant.grants)],
            Duration::ZERO,
        )
        .await;
    }

    /// Sends `body` until a node answers it with success.
    async fn send_until_answered(&mut self, key: &str, body: &Bytes) -> Option<Bytes> {
        let started = now();
        while now() < started + REPLAY_PATIENCE {
            if let Some(answer) = self.send(key, body.clone()).await {
                return Some(answer);
            }
            tokio::time::sleep(RESEND_AFTER).await;
        }
        None
    }

    /// One `POST /v1/semaphores/{key}` of `body` to a drawn node; the body
    /// of a success, `None` for anything else.
    async fn send(&mut self, key: &str, body: Bytes) -> Option<Bytes> {
        let endpoints = &self.shared.spec.endpoints;
        let endpoint = endpoints[self.rng.random_range(0..endpoints.len())].clone();
        let request = http::Request::post(format!("http://{endpoint}/v1/semaphores/{key}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .expect("a well-formed request");
        let answer = tokio::time::timeout(Duration::from_secs(5), SimTransport.send(request));
        let response = answer.await.ok()?.ok()?;
        if response.status() != http::StatusCode::OK {
            return None;
        }
        permitd_transport::collect(response.into_body()).await.ok()
    }
}
