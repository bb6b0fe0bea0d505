//! Claim-deadline timers: the seed's alarm, kept by the leader.
//!
//! A grant's unclaimed permits return to the pool at its claim deadline. Rounds
//! reclaim as they run, but a key nobody asks about has no round, so the leader
//! keeps one timer per key at `Semaphores::next_claim_deadline_ms` and proposes a
//! `Command::Reclaim` when it passes.
//!
//! The timers are derived state: after every applied entry the timers of the keys
//! it touched are re-aimed, and a new leader rebuilds all of them from the state.
//! A follower keeps none.

use std::collections::HashMap;
use std::time::Duration;

use permitd_storage::{Command, SharedState};
use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;

use crate::leadership::Leadership;
use crate::propose::propose;
use crate::raft::Raft;

/// Pause before retrying a reclaim proposal that failed while still leading.
const RETRY_DELAY_MS: u64 = 200;

/// One armed timer.
#[derive(Debug)]
struct Timer {
    deadline_ms: u64,
    task: AbortHandle,
}

/// The leader's claim-deadline timers.
pub struct Reclaimer {
    raft: Raft,
    state: SharedState,
    leadership: watch::Receiver<Leadership>,
    timers: HashMap<String, Timer>,
}

impl std::fmt::Debug for Reclaimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaimer")
            .field("timers", &self.timers)
            .finish_non_exhaustive()
    }
}

impl Reclaimer {
    /// Starts the task that keeps the timers; it ends when Raft shuts down.
    pub fn start(raft: Raft, state: SharedState, leadership: watch::Receiver<Leadership>) {
        let applied = state.subscribe();
        let reclaimer = Self {
            raft,
            state,
            leadership,
            timers: HashMap::new(),
        };
        tokio::spawn(reclaimer.run(applied));
    }

    async fn run(
        mut self,
        mut applied: broadcast::Receiver<std::sync::Arc<permitd_storage::Applied>>,
    ) {
        let mut leadership = self.leadership.clone();
        let mut leading = false;
        loop {
            tokio::select! {
                changed = leadership.changed() => {
                    if changed.is_err() {
                        self.cancel_all();
                        return;
                    }
                    let now_leading = leadership.borrow_and_update().is_leader;
                    if now_leading && !leading {
                        self.rebuild();
                    } else if !now_leading {
                        self.cancel_all();
                    }
                    leading = now_leading;
                }
                entry = applied.recv() => match entry {
                    Ok(entry) if leading => self.aim(&entry.keys),
                    Ok(_) => {}
                    // Missed entries: re-derive everything rather than guess.
                    Err(broadcast::error::RecvError::Lagged(_)) if leading => self.rebuild(),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => {
                        self.cancel_all();
                        return;
                    }
                },
            }
        }
    }

    /// Arms a timer for every key with an unclaimed grant.
    fn rebuild(&mut self) {
        self.cancel_all();
        let keys: Vec<String> = self
            .state
            .read(|semaphores| semaphores.keys().keys().cloned().collect());
        tracing::info!(keys = keys.len(), "rebuilding reclaim timers");
        self.aim(&keys);
    }

    /// Re-aims the timers of `keys` at their current earliest claim deadline.
    fn aim(&mut self, keys: &[String]) {
        for key in keys {
            let deadline = self
                .state
                .read(|semaphores| semaphores.next_claim_deadline_ms(key));
            match (deadline, self.timers.get(key)) {
                (Some(deadline_ms), Some(timer)) if timer.deadline_ms == deadline_ms => {}
                (Some(deadline_ms), _) => self.arm(key, deadline_ms),
                (None, _) => {
                    if let Some(timer) = self.timers.remove(key) {
                        timer.task.abort();
                    }
                }
            }
        }
    }

    fn arm(&mut self, key: &str, deadline_ms: u64) {
        let raft = self.raft.clone();
        let leadership = self.leadership.clone();
        let owned_key = key.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let wait_ms = deadline_ms.saturating_sub(crate::now_ms());
                tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                let command = Command::Reclaim {
                    now_ms: crate::now_ms().max(deadline_ms),
                    keys: vec![owned_key.clone()],
                };
                match propose(&raft, &leadership, command).await {
                    Ok(_) => return,
                    Err(error) if leadership.borrow().is_leader => {
                        tracing::warn!(key = %owned_key, %error, "reclaim failed; retrying");
                        tokio::time::sleep(Duration::from_millis(RETRY_DELAY_MS)).await;
                    }
                    // No longer leading: the next leader rebuilds its own timers.
                    Err(_) => return,
                }
            }
        });
        if let Some(old) = self.timers.insert(
            key.to_owned(),
            Timer {
                deadline_ms,
                task: task.abort_handle(),
            },
        ) {
            old.task.abort();
        }
    }

    fn cancel_all(&mut self) {
        for (_, timer) in self.timers.drain() {
            timer.task.abort();
        }
    }
}
