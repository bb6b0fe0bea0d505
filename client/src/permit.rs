//! Permits as guards: [`SemaphoreClient::acquire`] and [`SemaphoreClient::with_permit`].
//!
//! The queue ([`crate::SemaphoreQueue`]) suits a runner with many items; this
//! is the other common shape: "run this one piece of work under `count`
//! permits of `key`". One acquisition is:
//! 1. a `request` with demand `{group, count, oldestAt}` (its `oldestAt` stays
//!    the first ask's time, so the caller keeps its place in line), repeated
//!    at the key's `nextRequestAt` until enough is granted;
//! 2. every grant is claimed at once with a `sync` (the holder reclaims a grant
//!    not claimed by its claim deadline); a round may grant part of the count,
//!    so grants accumulate until they cover it;
//! 3. the [`Permit`] guard holds the claimed grants. Claimed grants do not
//!    expire: a permit held for hours keeps nothing alive that could run out
//!    under it, and needs no heartbeat (leases do; this path never asks for
//!    them). Its [`Permit::fence`] is the newest grant's fence (the log index of
//!    its round), strictly increasing per key, so a downstream resource can
//!    refuse work admitted under an older permit;
//! 4. the release is a `sync` reporting every claimed permit released: awaited
//!    by [`Permit::release`], or sent from a spawned task when the guard drops.
//!
//! # Cancellation
//!
//! Giving up an acquisition (dropping its future, a timeout, a
//! [cancel](SemaphoreClient::acquire_until), an error) never strands a permit:
//! - grants already received (claimed, or with a claim in flight) are
//!   released: awaited before a timeout, cancel or error returns, from a
//!   spawned task when the future is dropped (a report of them claimed and
//!   released in full: cumulative, so harmless if the claim never landed);
//! - a `request` in flight runs as its own task: its answer is awaited in the
//!   background and whatever it granted is released at once;
//! - only if the process dies with a request in flight is that request's
//!   grant left to the holder, which reclaims it at its claim deadline
//!   (`grantTimeoutMs` after its round), as for any lost answer.
//!
//! A dropped [`Permit`] releases from a task spawned on the runtime it was
//! acquired on; a process about to exit should `release().await` instead, since
//! a runtime shutting down does not run new tasks.

use std::future::Future;
use std::time::Duration;

use permitd_core::contract::protocol::{
    Demand, GrantReport, GrantStatus, PermitGrant, PermitRequest, PermitSync, V1,
};
use tokio::task::JoinHandle;

use crate::client::SemaphoreClient;
use crate::error::{AcquireError, ClientError};

/// Prefix of the `clientId` an acquisition uses when the caller names none.
pub const DEFAULT_CLIENT_ID_PREFIX: &str = "permit-";

/// How [`SemaphoreClient::acquire_with`] asks.
#[derive(Debug, Clone, Default)]
pub struct AcquireOptions {
    /// The `clientId` the grants belong to; a fresh `permit-{uuid}` when `None`.
    /// Name one when a token only allows some client ids.
    pub client_id: Option<String>,
    /// Give up waiting after this long (whatever was granted is released);
    /// `None` waits until granted or the cluster fails a call.
    pub timeout: Option<Duration>,
}

/// One grant a permit holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldGrant {
    pub grant_id: String,
    /// Permits claimed (and to release).
    pub claimed: u64,
    pub fence: u64,
}

/// Claimed permits of one key; released when dropped or by [`Permit::release`].
#[derive(Debug)]
pub struct Permit {
    held: Held,
    group: String,
}

impl Permit {
    pub fn key(&self) -> &str {
        &self.held.key
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// The `clientId` the grants belong to.
    pub fn client_id(&self) -> &str {
        &self.held.client_id
    }

    /// Permits held.
    pub fn count(&self) -> u64 {
        self.held.count()
    }

    /// The newest grant's fence: strictly increasing per key across rounds.
    pub fn fence(&self) -> u64 {
        self.held
            .grants
            .iter()
            .map(|grant| grant.fence)
            .max()
            .unwrap_or(0)
    }

    /// The grants behind this permit.
    pub fn grants(&self) -> &[HeldGrant] {
        &self.held.grants
    }

    /// Reports every permit released and waits for the holder to take it
    /// (retrying within the client's call deadline). If that fails the
    /// permits stay held: claimed grants never expire.
    pub async fn release(mut self) -> Result<(), ClientError> {
        self.held.release().await
    }
}

/// Grants this client claimed (or is claiming) for one key: an acquisition's
/// so far, then a [`Permit`]'s. Dropped while it still holds any, it releases
/// them from a spawned task.
#[derive(Debug)]
struct Held {
    client: SemaphoreClient,
    key: String,
    client_id: String,
    grants: Vec<HeldGrant>,
    /// Where a drop spawns the release: the runtime the acquisition ran on.
    runtime: Option<tokio::runtime::Handle>,
}

impl Held {
    fn count(&self) -> u64 {
        self.grants.iter().map(|grant| grant.claimed).sum()
    }

    /// Claim reports of every grant held (cumulative, nothing released).
    fn reports(&self) -> Vec<GrantReport> {
        self.grants
            .iter()
            .map(|grant| GrantReport {
                grant_id: grant.grant_id.clone(),
                claimed: grant.claimed,
                released: 0,
            })
            .collect()
    }

    /// Reports every permit released and waits for the holder to take it;
    /// holds nothing afterwards, whatever the outcome.
    async fn release(&mut self) -> Result<(), ClientError> {
        let grants = std::mem::take(&mut self.grants);
        release_grants(&self.client, &self.key, &self.client_id, &grants).await
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.grants.is_empty() {
            return;
        }
        let Some(runtime) = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
        else {
            tracing::error!(key = %self.key, "a permit dropped outside a tokio runtime stays held");
            return;
        };
        let (client, key, client_id) = (
            self.client.clone(),
            self.key.clone(),
            self.client_id.clone(),
        );
        let grants = std::mem::take(&mut self.grants);
        runtime.spawn(async move {
            if let Err(error) = release_grants(&client, &key, &client_id, &grants).await {
                tracing::error!(%key, %error, "releasing a dropped permit failed; it stays held");
            }
        });
    }
}

impl SemaphoreClient {
    /// Waits until `count` permits of `key` are granted to `group` and claimed.
    /// See the [module docs](crate::permit) for cancellation.
    pub async fn acquire(
        &self,
        key: &str,
        group: &str,
        count: u64,
    ) -> Result<Permit, AcquireError> {
        self.acquire_with(key, group, count, AcquireOptions::default())
            .await
    }

    /// [`Self::acquire`] with a client id and a timeout.
    pub async fn acquire_with(
        &self,
        key: &str,
        group: &str,
        count: u64,
        options: AcquireOptions,
    ) -> Result<Permit, AcquireError> {
        self.acquire_until(key, group, count, options, std::future::pending())
            .await
    }

    /// [`Self::acquire_with`] that gives up with [`AcquireError::Cancelled`]
    /// when `cancel` completes (a signal, a shutdown). On that path, as on a
    /// timeout or an error, whatever was granted is released before it returns.
    pub async fn acquire_until(
        &self,
        key: &str,
        group: &str,
        count: u64,
        options: AcquireOptions,
        cancel: impl Future<Output = ()>,
    ) -> Result<Permit, AcquireError> {
        if count == 0 {
            return Err(AcquireError::ZeroCount);
        }
        let client_id = options
            .client_id
            .unwrap_or_else(|| format!("{DEFAULT_CLIENT_ID_PREFIX}{}", self.new_uuid()));
        let mut pending = Held {
            client: self.clone(),
            key: key.to_string(),
            client_id,
            grants: Vec::new(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        let timeout = async {
            match options.timeout {
                Some(timeout) => tokio::time::sleep(timeout).await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            outcome = self.gather(&mut pending, group, count) => outcome,
            () = timeout => Err(AcquireError::Timeout {
                key: key.to_string(),
                waited: options.timeout.unwrap_or_default(),
            }),
            () = cancel => Err(AcquireError::Cancelled { key: key.to_string() }),
        };
        if let Err(error) = outcome {
            if let Err(release) = pending.release().await {
                tracing::error!(%key, error = %release, "releasing partial grants failed");
            }
            return Err(error);
        }
        Ok(Permit {
            held: pending,
            group: group.to_string(),
        })
    }

    /// Runs `work` under `count` permits of `key`, handing it the permit's
    /// fence, and releases them when it finishes. A release the holder did not
    /// take is logged: those permits stay held.
    pub async fn with_permit<F, Fut, R>(
        &self,
        key: &str,
        group: &str,
        count: u64,
        work: F,
    ) -> Result<R, AcquireError>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = R>,
    {
        let permit = self.acquire(key, group, count).await?;
        let result = work(permit.fence()).await;
        if let Err(error) = permit.release().await {
            tracing::error!(%key, %error, "releasing a permit failed; it stays held");
        }
        Ok(result)
    }

    /// Requests until `pending` holds `count` claimed permits.
    async fn gather(
        &self,
        pending: &mut Held,
        group: &str,
        count: u64,
    ) -> Result<(), AcquireError> {
        let oldest_at_ms = self.now_ms();
        while pending.count() < count {
            let request = PermitRequest {
                v: V1,
                client_id: pending.client_id.clone(),
                request_id: None,
                demand: vec![Demand {
                    group: group.to_string(),
                    count: count - pending.count(),
                    oldest_at_ms,
                }],
                grants: pending.reports(),
                leases: None,
                wait_ms: None,
            };
            let answer = InFlightRequest::send(self, pending, request)
                .answer()
                .await?;
            if let Some(blocked) = answer.blocked.iter().find(|blocked| {
                blocked.reason == permitd_core::contract::protocol::BlockedReason::NotPermitted
            }) {
                return Err(AcquireError::NotPermitted {
                    key: pending.key.clone(),
                    group: blocked.group.clone(),
                });
            }
            let needed = count - pending.count();
            let fresh = claim_amounts(&answer.grants, needed);
            if fresh.is_empty() {
                continue;
            }
            // Held before the claim is sent: a drop from here on releases them.
            pending.grants.extend(fresh.iter().cloned());
            self.claim(pending, &fresh).await?;
        }
        Ok(())
    }

    /// Claims `fresh` grants with a `sync`; keeps what the holder confirmed.
    async fn claim(&self, pending: &mut Held, fresh: &[HeldGrant]) -> Result<(), AcquireError> {
        let sync = PermitSync {
            v: V1,
            client_id: pending.client_id.clone(),
            grants: fresh
                .iter()
                .map(|grant| GrantReport {
                    grant_id: grant.grant_id.clone(),
                    claimed: grant.claimed,
                    released: 0,
                })
                .collect(),
            leases: None,
        };
        let synced = self.sync(&pending.key, sync).await?;
        for result in synced.grant_results {
            let Some(position) = pending
                .grants
                .iter()
                .position(|grant| grant.grant_id == result.grant_id)
            else {
                continue;
            };
            match result.status {
                GrantStatus::NotFound => {
                    pending.grants.remove(position);
                }
                GrantStatus::Ok | GrantStatus::Expired => {
                    let grant = &mut pending.grants[position];
                    grant.claimed = grant.claimed.min(result.claimed);
                    if grant.claimed == 0 {
                        pending.grants.remove(position);
                    }
                }
            }
        }
        Ok(())
    }
}

/// A `request` an acquisition sent, running as its own task. Its answer's
/// grants belong to the acquisition; if the acquisition is given up before it
/// read the answer (dropped, cancelled, timed out), the answer is awaited in
/// the background and its grants are released at once, so they do not sit
/// unclaimed until their claim deadline.
struct InFlightRequest {
    task: Option<JoinHandle<Result<PermitGrant, ClientError>>>,
    client: SemaphoreClient,
    key: String,
    client_id: String,
}

impl InFlightRequest {
    fn send(client: &SemaphoreClient, held: &Held, request: PermitRequest) -> Self {
        let (sender, key) = (client.clone(), held.key.clone());
        let task = tokio::spawn(async move { sender.request(&key, request).await });
        Self {
            task: Some(task),
            client: client.clone(),
            key: held.key.clone(),
            client_id: held.client_id.clone(),
        }
    }

    async fn answer(mut self) -> Result<PermitGrant, ClientError> {
        let task = self.task.as_mut().expect("the task is taken only here");
        let joined = task.await;
        self.task = None;
        joined.unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()))
    }
}

impl Drop for InFlightRequest {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        let (client, key, client_id) = (
            self.client.clone(),
            self.key.clone(),
            self.client_id.clone(),
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime, no answer: the holder reclaims at the deadline
        };
        runtime.spawn(async move {
            let Ok(Ok(answer)) = task.await else {
                return;
            };
            let grants = claim_amounts(&answer.grants, u64::MAX);
            if let Err(error) = release_grants(&client, &key, &client_id, &grants).await {
                tracing::warn!(%key, %error, "returning an abandoned request's grants failed");
            }
        });
    }
}

/// What to claim of a round's grants: all of each, until `needed` is covered
/// (more than asked for cannot come from one round; the rest, if any, is left
/// to the claim deadline).
fn claim_amounts(
    grants: &[permitd_core::contract::protocol::GrantedPermits],
    mut needed: u64,
) -> Vec<HeldGrant> {
    let mut claimed = Vec::new();
    for grant in grants {
        if needed == 0 {
            break;
        }
        let take = grant.permits.min(needed);
        needed -= take;
        claimed.push(HeldGrant {
            grant_id: grant.grant_id.to_string(),
            claimed: take,
            fence: grant.fence,
        });
    }
    claimed
}

/// Reports every permit of `grants` released.
async fn release_grants(
    client: &SemaphoreClient,
    key: &str,
    client_id: &str,
    grants: &[HeldGrant],
) -> Result<(), ClientError> {
    if grants.is_empty() {
        return Ok(());
    }
    let sync = PermitSync {
        v: V1,
        client_id: client_id.to_string(),
        grants: grants
            .iter()
            .map(|grant| GrantReport {
                grant_id: grant.grant_id.clone(),
                claimed: grant.claimed,
                released: grant.claimed,
            })
            .collect(),
        leases: None,
    };
    client.sync(key, sync).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::protocol::GrantedPermits;

    use super::*;

    fn granted(ordinal: u32, permits: u64, fence: u64) -> GrantedPermits {
        serde_json::from_value(serde_json::json!({
            "grantId": format!("00000000-0000-8000-8000-{ordinal:012}"),
            "group": "g", "permits": permits, "fence": fence,
        }))
        .expect("a grant")
    }

    #[test]
    fn claims_cover_what_is_needed_and_no_more() {
        let claims = claim_amounts(&[granted(1, 2, 7), granted(2, 5, 7)], 4);
        let amounts: Vec<u64> = claims.iter().map(|grant| grant.claimed).collect();
        assert_eq!(amounts, [2, 2]);
        assert!(claim_amounts(&[granted(1, 2, 7)], 0).is_empty());
    }
}
