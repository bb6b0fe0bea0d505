//! Runners that wait on the leader: each sends `request`s with a `waitMs`, so a
//! request that a round leaves empty-handed is *held* until a permit frees
//! (docs/protocol.md, "Held requests"), as the runner's queue does. They claim
//! what they get with a `sync`, hold it, and release it with another.
//!
//! They use keys of their own, which nothing else touches (no leases, no
//! configuration change, no force release): what occupies those keys is then
//! known exactly from their records, which is what `liveness.rs` needs to say
//! that a held request waited while a permit was free. They keep going for a
//! while after the faults heal, so that quiet time exists to judge that in.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use permitd_client::SemaphoreClient;
use permitd_core::contract::protocol::{
    Demand, GrantReport, GrantStatus, GrantedPermits, PermitRequest, PermitSync, V1,
};
use permitd_core::KeyConfigUpdate;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::history::{Ask, AskOutcome, Held, History};
use crate::trace::Trace;
use crate::workload::{self, Shared};

/// The keys the waiters share, and their limits.
pub const WAITER_KEYS: [(&str, u64); 2] = [("held-0", 1), ("held-1", 2)];
/// Each request's `waitMs`: long against a round (5–20 ms), so a request held
/// in vain stands out.
pub const WAIT_MS: u64 = 1_500;
/// The group every waiter asks in.
const GROUP: &str = "jobs";

/// What became of one request, as its runner saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A permit: occupied (possibly) from `sent` until its release was
    /// acknowledged, or to the end of the run if it never was.
    Granted { released: Option<Duration> },
    /// Answered with nothing: the round left it empty-handed, and it was held
    /// until its `waitMs` ran out or a round had nothing for it.
    Empty,
    /// No answer: it may have been granted, and the grant then lapses at its
    /// claim deadline.
    Unknown,
}

/// One request of a waiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub key: String,
    pub client: String,
    pub sent: Duration,
    /// When its answer (or the last error) came.
    pub answered: Duration,
    pub answer: Answer,
}

/// Every waiter's requests, shared with the checker.
pub type WaitLog = Arc<Mutex<Vec<Wait>>>;

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

fn push(log: &WaitLog, wait: Wait) -> usize {
    let mut log = log
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    log.push(wait);
    log.len() - 1
}

/// Sets the waiter keys' limits, retrying until the cluster takes them (every
/// waiter does it: the same limits, so order does not matter).
async fn configure(client: &SemaphoreClient) {
    for (key, limit) in WAITER_KEYS {
        let update = KeyConfigUpdate {
            limit: Some(limit),
            ..Default::default()
        };
        while client.set_key_config(key, &update).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One waiter, working until simulated time `until`. Every request goes into
/// the run's history (budget, fences, usage) and into `waits` (liveness).
pub async fn run_waiter(
    name: String,
    seed: u64,
    shared: Shared,
    until: Duration,
    waits: WaitLog,
) -> turmoil::Result {
    let client = workload::client(&shared.spec.endpoints, seed)?;
    let (history, trace) = (&shared.history, &shared.trace);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0000_7761_6974_6572);
    configure(&client).await;
    let mut attempt = 0u64;
    while now() < until {
        attempt += 1;
        let (key, _) = WAITER_KEYS[rng.random_range(0..WAITER_KEYS.len())];
        let sent = now();
        let wait_for = Duration::from_millis(WAIT_MS);
        let asked = history.ask(Ask::waiting(key, GROUP, &name, 1, sent, wait_for));
        let request = PermitRequest {
            v: V1,
            client_id: name.clone(),
            request_id: Some(format!("{name}-{attempt}")),
            demand: vec![Demand {
                group: GROUP.into(),
                count: 1,
                oldest_at_ms: client.now_ms(),
            }],
            grants: Vec::new(),
            leases: None,
            wait_ms: Some(WAIT_MS),
        };
        let grant = match client.request(key, request).await {
            Ok(answer) => answer.grants.into_iter().next(),
            Err(_) => {
                trace.event(now(), &name, format_args!("request {key} failed"));
                history.update_ask(asked, |ask| ask.outcome = AskOutcome::Failed { at: now() });
                push(&waits, wait(key, &name, sent, Answer::Unknown));
                tokio::time::sleep(Duration::from_millis(rng.random_range(10..100))).await;
                continue;
            }
        };
        let (granted, fence) = grant.as_ref().map_or((0, 0), |g| (g.permits, g.fence));
        history.update_ask(asked, |ask| {
            ask.outcome = AskOutcome::Answered {
                at: now(),
                granted,
                fence,
                held: None,
                returned: None,
            }
        });
        let Some(grant) = grant else {
            trace.event(now(), &name, format_args!("request {key} empty"));
            push(&waits, wait(key, &name, sent, Answer::Empty));
            continue;
        };
        let index = push(
            &waits,
            wait(key, &name, sent, Answer::Granted { released: None }),
        );
        let hold = Duration::from_millis(rng.random_range(1..150));
        let released =
            hold_and_release(&client, &name, key, grant, hold, (history, asked), trace).await;
        waits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[index]
            .answer = Answer::Granted { released };
    }
    Ok(())
}

fn wait(key: &str, client: &str, sent: Duration, answer: Answer) -> Wait {
    Wait {
        key: key.into(),
        client: client.into(),
        sent,
        answered: now(),
        answer,
    }
}

/// Claims `grant`, runs a job under it for `hold`, releases it; returns when
/// the release was acknowledged (`None`: never). Notes each step on the
/// request's record in the history.
async fn hold_and_release(
    client: &SemaphoreClient,
    name: &str,
    key: &str,
    grant: GrantedPermits,
    hold: Duration,
    (history, asked): (&History, usize),
    trace: &Trace,
) -> Option<Duration> {
    let report = |released| PermitSync {
        v: V1,
        client_id: name.into(),
        grants: vec![GrantReport {
            grant_id: grant.grant_id.to_string(),
            claimed: grant.permits,
            released,
        }],
        leases: None,
    };
    let grant_id = grant.grant_id.to_string();
    let claimed = client.sync(key, report(0)).await.ok().map(|synced| {
        // A grant answered late (a retry's remembered answer) may be past its
        // claim deadline: then the claim is clamped, and nothing is held.
        synced.grant_results.iter().any(|result| {
            result.grant_id == grant_id
                && result.status == GrantStatus::Ok
                && result.claimed == grant.permits
        })
    });
    let set_held = |held: Held| {
        history.update_ask(asked, |ask| {
            if let AskOutcome::Answered { held: slot, .. } = &mut ask.outcome {
                *slot = Some(held);
            }
        });
    };
    match claimed {
        Some(true) => {
            let from = now();
            trace.event(
                from,
                name,
                format_args!("holds {key} fence {}", grant.fence),
            );
            let permits = grant.permits;
            set_held(Held {
                permits,
                from,
                until: None,
            });
            tokio::time::sleep(hold).await;
            set_held(Held {
                permits,
                from,
                until: Some(now()),
            });
        }
        Some(false) => trace.event(now(), name, format_args!("claim of {key} came too late")),
        // The claim may or may not have been applied: the release below
        // settles either way.
        None => trace.event(now(), name, format_args!("claim of {key} failed")),
    }
    // Reports are cumulative: a release sent again is the same release.
    for _ in 0..5 {
        if client.sync(key, report(grant.permits)).await.is_ok() {
            let at = now();
            trace.event(at, name, format_args!("released {key}"));
            history.update_ask(asked, |ask| {
                if let AskOutcome::Answered { returned, .. } = &mut ask.outcome {
                    *returned = Some(at);
                }
            });
            return Some(at);
        }
    }
    trace.event(now(), name, format_args!("release of {key} failed"));
    None
}
