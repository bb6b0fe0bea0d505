//! A job runner: `jobs_per_client` jobs, each drawn from the seed.
//!
//! - **acquire**: `acquire_with` (the client's own request-claim loop), one or
//!   two permits, held, released with `Permit::release`;
//! - **held**: a `request` with a `waitMs`, which the leader holds until the
//!   key has room, then claimed, held and released with `sync`s. A third of
//!   them are *abandoned*: the call is dropped after a drawn 20–400 ms, while
//!   the request may still be held on the leader, which must then leave it
//!   out of its rounds;
//! - **batch**: one `batch` call asking a permit of two or three keys,
//!   each grant claimed, all held together, each released;
//! - **lease** (`leases.rs`) and **replay** (`replay.rs`).
//!
//! Every request is an [`Ask`] in the history, with its fate.

use std::time::Duration;

use permitd_client::{AcquireOptions, BatchItem, SemaphoreClient};
use permitd_core::contract::protocol::{
    Demand, GrantReport, GrantStatus, GrantedPermits, PermitGrant, PermitRequest, PermitSync,
    SemaphoreRequest, SemaphoreResponse, V1,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{client, failure, now, KeySpec, Shared, CAPPED_GROUP, PLAIN_GROUP};
use crate::checker::usage::ABANDON_MARGIN;
use crate::history::{Ask, AskOutcome, Held, UsageRead};

/// The share of held requests a runner abandons, in percent.
const ABANDONED_PERCENT: u32 = 35;
/// Requests a held job sends before it gives up on a busy key.
const HELD_TRIES: usize = 3;

/// One runner: its client, its draws and what it shares with the others.
pub(super) struct Runner {
    pub(super) name: String,
    /// The key only this runner uses.
    pub(super) own: KeySpec,
    pub(super) client: SemaphoreClient,
    pub(super) rng: StdRng,
    pub(super) shared: Shared,
}

/// One runner host: its jobs, then it reports itself finished.
pub async fn run_client(n: usize, seed: u64, shared: Shared) -> turmoil::Result {
    let client = client(&shared.spec.endpoints, seed)?;
    let mut runner = Runner {
        name: format!("client{n}"),
        own: shared.spec.own[n].clone(),
        client,
        rng: StdRng::seed_from_u64(seed ^ 0x5eed),
        shared: shared.clone(),
    };
    shared.until_configured().await;
    runner.pause(0..300).await;
    for attempt in 0..shared.spec.jobs_per_client {
        let client_id = format!("{}-{attempt}", runner.name);
        match runner.rng.random_range(0..100) {
            0..15 => runner.acquire_job(&client_id).await,
            15..40 => runner.held_job(&client_id).await,
            40..50 => runner.sibling_gives_up(&client_id).await,
            50..65 => runner.batch_job(&client_id).await,
            65..80 => runner.lease_job(&client_id).await,
            _ => runner.replay_job(&client_id).await,
        }
        runner.pause(10..150).await;
    }
    shared
        .finished
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

impl Runner {
    pub(super) async fn pause(&mut self, ms: std::ops::Range<u64>) {
        let pause = Duration::from_millis(self.rng.random_range(ms));
        tokio::time::sleep(pause).await;
    }

    pub(super) fn event(&self, what: impl std::fmt::Display) {
        self.shared.trace.event(now(), &self.name, what);
    }

    pub(super) fn any_key(&mut self) -> KeySpec {
        let keys = &self.shared.spec.keys;
        keys[self.rng.random_range(0..keys.len())].clone()
    }

    /// A group and a count for `key`: one permit of its capped group, or one
    /// or two of the plain group (the limit never falls under two).
    fn group_and_count(&mut self, key: &KeySpec) -> (&'static str, u64) {
        if key.group_cap.is_some() && self.rng.random_bool(0.5) {
            (CAPPED_GROUP, 1)
        } else {
            (PLAIN_GROUP, self.rng.random_range(1..=2))
        }
    }

    /// A hold of 1–150 ms.
    pub(super) fn hold(&mut self) -> Duration {
        Duration::from_millis(self.rng.random_range(1..150))
    }

    /// `acquire_with`: the client asks, claims and retries out of sight.
    async fn acquire_job(&mut self, client_id: &str) {
        let key = self.any_key();
        let (group, count) = self.group_and_count(&key);
        let hold = self.hold();
        let options = AcquireOptions {
            // Fixed ids: a random one would order the state machine's maps
            // differently from run to run.
            client_id: Some(client_id.to_owned()),
            timeout: Some(Duration::from_secs(10)),
        };
        let index = self.shared.history.ask(Ask {
            key: key.name.clone(),
            group: group.to_owned(),
            client_id: client_id.to_owned(),
            count,
            sent: now(),
            wait: Duration::ZERO,
            seen: false,
            outcome: AskOutcome::Waiting,
        });
        let permit = match self
            .client
            .acquire_with(&key.name, group, count, options)
            .await
        {
            Ok(permit) => permit,
            Err(error) => {
                let at = now();
                self.event(format_args!(
                    "acquire {} failed: {}",
                    key.name,
                    kind_of(&error)
                ));
                self.shared
                    .history
                    .update_ask(index, |ask| ask.outcome = AskOutcome::Failed { at });
                return;
            }
        };
        let (start, fence, permits) = (now(), permit.fence(), permit.count());
        self.event(format_args!(
            "holds {} x{permits} fence {fence} by acquire",
            key.name
        ));
        self.shared.history.update_ask(index, |ask| {
            ask.outcome = AskOutcome::Answered {
                at: start,
                granted: permits,
                fence,
                held: Some(Held {
                    permits,
                    from: start,
                    until: None,
                }),
                returned: None,
            }
        });
        tokio::time::sleep(hold).await;
        self.stop_using(index);
        match permit.release().await {
            Ok(()) => {
                self.event(format_args!("released {}", key.name));
                self.returned(index);
            }
            Err(error) => self.event(format_args!(
                "release of {} failed: {}",
                key.name,
                failure(&error)
            )),
        }
    }

    /// A request held on the leader until the key has room; some abandoned.
    async fn held_job(&mut self, client_id: &str) {
        let key = self.any_key();
        let (group, count) = self.group_and_count(&key);
        let abandon = self
            .rng
            .random_ratio(ABANDONED_PERCENT, 100)
            .then(|| Duration::from_millis(self.rng.random_range(20..400)));
        for _ in 0..HELD_TRIES {
            let wait = Duration::from_millis(self.rng.random_range(200..3_000));
            let asked = self
                .request(&key.name, group, count, client_id, wait, abandon)
                .await;
            let Some((index, answer)) = asked else {
                return;
            };
            if !answer.grants.is_empty() {
                let hold = self.hold();
                self.work_under(
                    client_id,
                    vec![(key.name.clone(), index, answer.grants)],
                    hold,
                )
                .await;
                return;
            }
        }
    }

    /// On the runner's own key (one permit): it holds the permit while a
    /// sibling worker asks for it with a `waitMs`, which the leader holds,
    /// and gives up after 30–150 ms; the permit is released well after that.
    /// Once the claim window has passed since the sibling gave up, the runner
    /// reads the key's usage: nothing may be left granted to the sibling,
    /// whose caller went away long before the permit came free.
    async fn sibling_gives_up(&mut self, client_id: &str) {
        let key = self.own.name.clone();
        let hold = Duration::from_millis(self.rng.random_range(300..700));
        let gives_up = Duration::from_millis(self.rng.random_range(30..150));
        let after = Duration::from_millis(self.rng.random_range(10..100));
        let Some((index, answer)) = self
            .request(&key, PLAIN_GROUP, 1, client_id, Duration::ZERO, None)
            .await
        else {
            return;
        };
        let claimed = self.claim(&key, client_id, &answer.grants).await;
        if claimed == 0 {
            self.work_under(client_id, vec![(key, index, answer.grants)], Duration::ZERO)
                .await;
            return;
        }
        self.holding(index, &key, claimed);
        let sibling = format!("{client_id}-sibling");
        let wait = Duration::from_millis(2_000);
        let (_, _) = tokio::join!(
            tokio::time::sleep(hold),
            self.request(&key, PLAIN_GROUP, 1, &sibling, wait, Some(gives_up)),
        );
        self.stop_using(index);
        self.release(&key, client_id, index, &answer.grants).await;
        let gave_up = self
            .shared
            .history
            .lock()
            .asks
            .iter()
            .rev()
            .find_map(|ask| match ask.outcome {
                AskOutcome::Abandoned { at } if ask.client_id == sibling => Some(at),
                _ => None,
            });
        let Some(gave_up) = gave_up else {
            return;
        };
        let read_at = gave_up + ABANDON_MARGIN + self.own.grant_timeout + after;
        tokio::time::sleep(read_at.saturating_sub(now())).await;
        let sent = now();
        if let Ok(usage) = self.client.usage(&key).await {
            let answered = now();
            self.event(format_args!("usage {key}: {} granted", usage.granted));
            self.shared.history.lock().usage_reads.push(UsageRead {
                key,
                sent,
                answered,
                granted: usage.granted,
                leased: usage.leased,
            });
        }
    }

    /// Sends one `request`, dropping it after `abandon` if that comes first;
    /// answers its ask's index and the answer, `None` if there was none.
    async fn request(
        &self,
        key: &str,
        group: &str,
        count: u64,
        client_id: &str,
        wait: Duration,
        abandon: Option<Duration>,
    ) -> Option<(usize, PermitGrant)> {
        let index =
            self.shared
                .history
                .ask(Ask::waiting(key, group, client_id, count, now(), wait));
        let request = PermitRequest {
            v: V1,
            client_id: client_id.to_owned(),
            request_id: None,
            demand: vec![Demand {
                group: group.to_owned(),
                count,
                oldest_at_ms: self.client.now_ms(),
            }],
            grants: vec![],
            leases: None,
            wait_ms: Some(wait.as_millis() as u64),
        };
        let call = self.client.request(key, request);
        let answer = match abandon {
            None => call.await,
            Some(after) => match tokio::time::timeout(after, call).await {
                Ok(answer) => answer,
                Err(_) => {
                    let at = now();
                    self.event(format_args!("abandons its request for {key}"));
                    self.shared
                        .history
                        .update_ask(index, |ask| ask.outcome = AskOutcome::Abandoned { at });
                    return None;
                }
            },
        };
        match answer {
            Ok(answer) => {
                self.answered(index, key, &answer.grants);
                Some((index, answer))
            }
            Err(error) => {
                self.event(format_args!("request {key} failed: {}", failure(&error)));
                let at = now();
                self.shared
                    .history
                    .update_ask(index, |ask| ask.outcome = AskOutcome::Failed { at });
                None
            }
        }
    }

    /// Records the answer of the ask at `index`.
    pub(super) fn answered(&self, index: usize, key: &str, grants: &[GrantedPermits]) {
        let at = now();
        let granted = grants.iter().map(|grant| grant.permits).sum();
        let fence = grants.iter().map(|grant| grant.fence).max().unwrap_or(0);
        self.event(format_args!("granted {key} x{granted} fence {fence}"));
        self.shared.history.update_ask(index, |ask| {
            ask.outcome = AskOutcome::Answered {
                at,
                granted,
                fence,
                held: None,
                returned: None,
            }
        });
    }

    /// One `batch`: a permit of two or three keys at once.
    async fn batch_job(&mut self, client_id: &str) {
        let mut keys = self.shared.spec.keys.clone();
        let wanted = self.rng.random_range(2..=3).min(keys.len());
        let mut picked = Vec::new();
        for _ in 0..wanted {
            picked.push(keys.remove(self.rng.random_range(0..keys.len())));
        }
        let sent = now();
        let oldest_at_ms = self.client.now_ms();
        let mut items = Vec::new();
        let mut indexes = Vec::new();
        for key in &picked {
            items.push(BatchItem {
                key: key.name.clone(),
                message: SemaphoreRequest::Request(PermitRequest {
                    v: V1,
                    client_id: client_id.to_owned(),
                    request_id: None,
                    demand: vec![Demand {
                        group: PLAIN_GROUP.to_owned(),
                        count: 1,
                        oldest_at_ms,
                    }],
                    grants: vec![],
                    leases: None,
                    wait_ms: None,
                }),
            });
            indexes.push(self.shared.history.ask(Ask::waiting(
                &key.name,
                PLAIN_GROUP,
                client_id,
                1,
                sent,
                Duration::ZERO,
            )));
        }
        let answers = match self.client.batch(items).await {
            Ok(answers) => answers,
            Err(error) => {
                self.event(format_args!("batch failed: {}", failure(&error)));
                let at = now();
                for index in indexes {
                    self.shared
                        .history
                        .update_ask(index, |ask| ask.outcome = AskOutcome::Failed { at });
                }
                return;
            }
        };
        let mut granted = Vec::new();
        for ((key, index), answer) in picked.iter().zip(indexes).zip(answers) {
            match answer {
                Ok(SemaphoreResponse::Grant(grant)) => {
                    self.answered(index, &key.name, &grant.grants);
                    granted.push((key.name.clone(), index, grant.grants));
                }
                other => {
                    let at = now();
                    let error = other.err().map_or("synced".to_owned(), |e| failure(&e));
                    self.event(format_args!("batch item {} failed: {error}", key.name));
                    self.shared
                        .history
                        .update_ask(index, |ask| ask.outcome = AskOutcome::Failed { at });
                }
            }
        }
        let hold = self.hold();
        self.work_under(client_id, granted, hold).await;
    }

    /// Claims every grant, works for `hold` under the permits the claims
    /// confirmed, then releases every granted permit, key by key.
    pub(super) async fn work_under(
        &mut self,
        client_id: &str,
        granted: Vec<(String, usize, Vec<GrantedPermits>)>,
        hold: Duration,
    ) {
        let granted: Vec<_> = granted
            .into_iter()
            .filter(|(_, _, grants)| !grants.is_empty())
            .collect();
        if granted.is_empty() {
            return;
        }
        for (key, index, grants) in &granted {
            let claimed = self.claim(key, client_id, grants).await;
            if claimed > 0 {
                self.holding(*index, key, claimed);
            }
        }
        tokio::time::sleep(hold).await;
        for (_, index, _) in &granted {
            self.stop_using(*index);
        }
        for (key, index, grants) in &granted {
            self.release(key, client_id, *index, grants).await;
        }
    }

    /// The runner holds `permits` of the ask at `index` from now.
    pub(super) fn holding(&self, index: usize, key: &str, permits: u64) {
        let from = now();
        self.event(format_args!("holds {key} x{permits}"));
        self.shared.history.update_ask(index, |ask| {
            if let AskOutcome::Answered { held, .. } = &mut ask.outcome {
                *held = Some(Held {
                    permits,
                    from,
                    until: None,
                });
            }
        });
    }

    /// Reports every permit of `grants` released.
    async fn release(&self, key: &str, client_id: &str, index: usize, grants: &[GrantedPermits]) {
        let sync = PermitSync {
            v: V1,
            client_id: client_id.to_owned(),
            grants: released(grants),
            leases: None,
        };
        match self.client.sync(key, sync).await {
            Ok(_) => {
                self.event(format_args!("released {key}"));
                self.returned(index);
            }
            Err(error) => self.event(format_args!("release of {key} failed: {}", failure(&error))),
        }
    }

    /// Claims `grants` in full; answers the permits the holder confirmed
    /// (`ok`, all of them), 0 if the claim got no answer.
    async fn claim(&self, key: &str, client_id: &str, grants: &[GrantedPermits]) -> u64 {
        let sync = PermitSync {
            v: V1,
            client_id: client_id.to_owned(),
            grants: claims(grants),
            leases: None,
        };
        match self.client.sync(key, sync).await {
            Ok(synced) => confirmed(grants, &synced.grant_results),
            Err(error) => {
                self.event(format_args!("claim of {key} failed: {}", failure(&error)));
                0
            }
        }
    }

    /// The runner stops using the permits of the ask at `index`.
    pub(super) fn stop_using(&self, index: usize) {
        let until = now();
        self.shared.history.update_ask(index, |ask| {
            if let AskOutcome::Answered {
                held: Some(held), ..
            } = &mut ask.outcome
            {
                held.until = Some(until);
            }
        });
    }

    /// The release of every permit of the ask at `index` was answered.
    pub(super) fn returned(&self, index: usize) {
        let at = now();
        self.shared.history.update_ask(index, |ask| {
            if let AskOutcome::Answered { returned, .. } = &mut ask.outcome {
                *returned = Some(at);
            }
        });
    }
}

/// Reports claiming every permit of `grants`.
pub(super) fn claims(grants: &[GrantedPermits]) -> Vec<GrantReport> {
    grants
        .iter()
        .map(|grant| GrantReport {
            grant_id: grant.grant_id.to_string(),
            claimed: grant.permits,
            released: 0,
        })
        .collect()
}

/// Reports releasing every permit of `grants` (claimed or not: cumulative
/// reports are clamped, so this returns whatever the claim left).
pub(super) fn released(grants: &[GrantedPermits]) -> Vec<GrantReport> {
    grants
        .iter()
        .map(|grant| GrantReport {
            grant_id: grant.grant_id.to_string(),
            claimed: grant.permits,
            released: grant.permits,
        })
        .collect()
}

/// The permits of `grants` whose claim the holder confirmed in full.
pub(super) fn confirmed(
    grants: &[GrantedPermits],
    results: &[permitd_core::contract::protocol::GrantResult],
) -> u64 {
    grants
        .iter()
        .filter(|grant| {
            results.iter().any(|result| {
                result.grant_id == grant.grant_id.to_string()
                    && result.status == GrantStatus::Ok
                    && result.claimed == grant.permits
            })
        })
        .map(|grant| grant.permits)
        .sum()
}

/// A short, stable name for an acquire's failure (messages may carry
/// addresses or ids; the trace must not).
fn kind_of(error: &permitd_client::AcquireError) -> &'static str {
    use permitd_client::AcquireError;
    match error {
        AcquireError::Timeout { .. } => "timeout",
        AcquireError::Cancelled { .. } => "cancelled",
        AcquireError::Client(_) => "client",
        _ => "other",
    }
}
