//! Quiet shards: in a cluster of several shards, a shard with nothing to
//! replicate runs no timer and sends no heartbeat; one liveness exchange per
//! pair of nodes (`liveness.rs`) stands for all of them (CockroachDB's
//! quiesced ranges do the same).
//!
//! Measured before this (docs/scaling.md): an idle node of 64 shards
//! received 93–95 peer calls/s and spent 5.2–5.35 % of a core, against 16 and
//! under 1 % at one shard. Each shard's openraft core woke on its own timer
//! (every 1.5 heartbeats) and its leader sent heartbeats that only said "still
//! here": coalesced per peer (`heartbeats.rs`), they still took two calls per
//! interval per peer, and every follower's core handled each.
//!
//! A shard's leader goes quiet when, for [`QUIET_AFTER`] heartbeat
//! intervals, its log, its applied index and every follower's matched index
//! stood still, all at its last entry: every follower has every entry, and
//! the heartbeats of that time told them the commit index. A quiet leader
//! turns openraft's heartbeats and timer off ([`RaftSwitch`]). Anything that
//! moves (a new entry, a follower's progress, a new term) or a peer's wake
//! (a follower behind, named in a liveness exchange) turns them on at once; an entry
//! written to a quiet shard is replicated as before, since openraft sends
//! entries as they are appended, not on its timer.
//!
//! On followers openraft's timer only ever starts elections, which the
//! election guard (`election_guard.rs`) decides instead; it runs only while
//! the guard lets openraft elect (a single voter).
//!
//! At one shard nothing changes: heartbeats and timers run as always, and
//! no liveness call is made.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use permitd_storage::{NodeId, ShardId};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::leader_view::Leadership;
use crate::raft::Raft;

/// Heartbeat intervals a leader's shard must stand still before it goes
/// quiet: enough for the last commit index to reach every follower in a
/// heartbeat or two, few enough that an idle cluster is quiet within a
/// fraction of a second.
pub const QUIET_AFTER: u32 = 4;

/// Gauge: shards this node leads that are quiet.
pub const QUIET_SHARDS: &str = "permitd_quiet_shards";

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    metrics::describe_gauge!(
        QUIET_SHARDS,
        "Shards this node leads that are quiet: nothing to replicate, no heartbeats (several shards only)."
    );
}

/// What each owner asks of a shard's openraft timers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Wants {
    /// The quiescence task: no timer, no heartbeat (a quiet leader, or a
    /// follower whose elections the guard decides).
    quiet: bool,
    /// A handover (`leader/handover.rs`): no heartbeat, so that the
    /// followers' leases run out.
    handing_over: bool,
    /// The election guard: openraft's own election timer (a single voter).
    electing: bool,
}

impl Wants {
    fn heartbeat(self) -> bool {
        !self.quiet && !self.handing_over
    }

    fn tick(self) -> bool {
        !self.quiet || self.electing
    }
}

/// The one owner of a shard's openraft runtime switches (heartbeat, timer,
/// election): the quiescence task, a handover and the election guard each
/// say what they want, and the switches follow all three.
pub struct RaftSwitch {
    raft: Raft,
    wants: Mutex<Wants>,
    /// Whether this node leads the shard and it is quiet.
    quiet_leader: watch::Sender<bool>,
}

impl std::fmt::Debug for RaftSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftSwitch")
            .field(
                "wants",
                &*self.wants.lock().unwrap_or_else(PoisonError::into_inner),
            )
            .finish_non_exhaustive()
    }
}

impl RaftSwitch {
    /// The switches of `raft`, as openraft starts them: heartbeats and timer
    /// on, elections off (`app.rs` turns openraft's election timer off).
    pub fn new(raft: Raft) -> Arc<Self> {
        Arc::new(Self {
            raft,
            wants: Mutex::default(),
            quiet_leader: watch::channel(false).0,
        })
    }

    fn change(&self, change: impl FnOnce(&mut Wants)) {
        let mut wants = self.wants.lock().unwrap_or_else(PoisonError::into_inner);
        let before = *wants;
        change(&mut wants);
        let config = self.raft.runtime_config();
        if before.heartbeat() != wants.heartbeat() {
            config.heartbeat(wants.heartbeat());
        }
        if before.tick() != wants.tick() {
            config.tick(wants.tick());
        }
        if before.electing != wants.electing {
            config.elect(wants.electing);
        }
    }

    /// The quiescence task's word.
    fn quiet(&self, quiet: bool) {
        self.change(|wants| wants.quiet = quiet);
    }

    /// A handover starts (`true`) or ends.
    pub fn handing_over(&self, handing_over: bool) {
        self.change(|wants| wants.handing_over = handing_over);
    }

    /// The election guard lets openraft elect (`true`) or not.
    pub fn electing(&self, electing: bool) {
        self.change(|wants| wants.electing = electing);
    }

    /// Whether this node leads the shard and it is quiet: its liveness claims
    /// then stand for its heartbeats.
    pub fn quiet_leader(&self) -> watch::Receiver<bool> {
        self.quiet_leader.subscribe()
    }

    pub fn is_quiet_leader(&self) -> bool {
        *self.quiet_leader.borrow()
    }
}

/// Where a shard's leader stands: what moving means, and whether every
/// follower has everything.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Progress {
    term: u64,
    last_log: Option<u64>,
    applied: Option<u64>,
    matched: Vec<(NodeId, Option<u64>)>,
}

impl Progress {
    /// Every follower has the leader's last entry, and the leader applied it.
    fn settled(&self) -> bool {
        self.applied == self.last_log
            && self
                .matched
                .iter()
                .all(|(_, matched)| *matched == self.last_log)
    }
}

/// Where the shard stands on this node: `None` unless this node leads it.
fn progress(raft: &Raft, leadership: &Leadership) -> Option<Progress> {
    if !leadership.is_leader {
        return None;
    }
    let data = raft.data_metrics();
    let data = data.borrow();
    Some(Progress {
        term: leadership.term,
        last_log: data.last_log.map(|id| id.index),
        applied: data.last_applied.map(|id| id.index),
        matched: data
            .replication
            .iter()
            .flatten()
            .map(|(id, matched)| (*id, matched.map(|id| id.index)))
            .collect(),
    })
}

/// The quiescence of one shard: its switch, and the wakes its peers ask for.
#[derive(Debug)]
pub struct Quiescence {
    pub shard: ShardId,
    pub switch: Arc<RaftSwitch>,
    /// A peer's liveness answer said it is behind in this shard.
    pub wake: Arc<Notify>,
}

impl Quiescence {
    /// Starts the task that decides when this shard is quiet on this node;
    /// it ends when Raft shuts down. Several shards only: at one, heartbeats
    /// and timers run as always.
    pub fn start(&self, raft: Raft, leadership: watch::Receiver<Leadership>, heartbeat: Duration) {
        let (switch, wake, shard) = (self.switch.clone(), self.wake.clone(), self.shard);
        crate::seams::spawn(run(raft, leadership, switch, wake, heartbeat, shard));
    }
}

async fn run(
    raft: Raft,
    mut leadership: watch::Receiver<Leadership>,
    switch: Arc<RaftSwitch>,
    wake: Arc<Notify>,
    heartbeat: Duration,
    shard: ShardId,
) {
    let quiet_after = heartbeat * QUIET_AFTER;
    let mut data = raft.data_metrics();
    let mut last: Option<(Progress, Instant)> = None;
    let mut woken = false;
    loop {
        let now = Instant::now();
        let current = progress(&raft, &leadership.borrow_and_update());
        let quiet = match current {
            None => {
                last = None;
                // Not leading: openraft's timer only starts elections,
                // which the guard decides.
                true
            }
            Some(current) => {
                let moved = woken || last.as_ref().is_none_or(|(seen, _)| *seen != current);
                if moved || !current.settled() {
                    last = Some((current, now));
                }
                woken = false;
                let still_since = last.as_ref().map_or(now, |(_, since)| *since);
                now.saturating_duration_since(still_since) >= quiet_after
                    && last.as_ref().is_some_and(|(seen, _)| seen.settled())
            }
        };
        switch.quiet(quiet);
        let leading_quietly = quiet && last.is_some();
        switch.quiet_leader.send_if_modified(|was| {
            let changed = *was != leading_quietly;
            if changed {
                let delta = if leading_quietly { 1.0 } else { -1.0 };
                metrics::gauge!(QUIET_SHARDS).increment(delta);
                tracing::debug!(shard, quiet = leading_quietly, "quiet leader");
            }
            *was = leading_quietly;
            changed
        });
        // A leader not yet quiet looks again when it may be; anything that
        // moves wakes it sooner.
        let look_again = (last.is_some() && !quiet).then_some(quiet_after / 2);
        let open = tokio::select! {
            changed = leadership.changed() => changed.is_ok(),
            changed = data.changed() => changed.is_ok(),
            () = wake.notified() => {
                woken = true;
                true
            }
            () = sleep_or_pending(look_again) => true,
        };
        if !open || raft.metrics().has_changed().is_err() {
            return; // Raft shut down.
        }
    }
}

async fn sleep_or_pending(after: Option<Duration>) {
    match after {
        Some(after) => tokio::time::sleep(after).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(last_log: u64, applied: u64, matched: &[u64]) -> Progress {
        Progress {
            term: 3,
            last_log: Some(last_log),
            applied: Some(applied),
            matched: (2..).zip(matched.iter().map(|m| Some(*m))).collect(),
        }
    }

    #[test]
    fn a_leader_is_settled_when_every_follower_has_its_applied_last_entry() {
        assert!(progress(10, 10, &[10, 10]).settled());
        assert!(!progress(10, 9, &[10, 10]).settled(), "not applied");
        assert!(!progress(10, 10, &[10, 9]).settled(), "a follower behind");
        let mut unknown = progress(10, 10, &[10, 10]);
        unknown.matched.push((4, None));
        assert!(!unknown.settled(), "a follower not yet heard");
    }

    #[test]
    fn heartbeats_run_unless_quiet_or_handing_over_and_the_timer_unless_quiet() {
        let wants = |quiet, handing_over, electing| Wants {
            quiet,
            handing_over,
            electing,
        };
        assert!(wants(false, false, false).heartbeat());
        assert!(!wants(true, false, false).heartbeat());
        assert!(!wants(false, true, false).heartbeat());
        assert!(
            wants(false, true, false).tick(),
            "a handover keeps the timer"
        );
        assert!(!wants(true, false, false).tick());
        assert!(
            wants(true, false, true).tick(),
            "a single voter elects by timer"
        );
    }
}
