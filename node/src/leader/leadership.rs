//! Who leads, as this node sees it: a watch over openraft's server metrics reduced to the
//! few facts the round batcher and the API act on.

use openraft::metrics::RaftDataMetrics;
use openraft::ServerState;
use permitd_storage::{NodeId, ShardId};
use tokio::sync::watch;

pub use crate::raft::leader_view::Leadership;
use crate::raft::Raft;

/// Follows `raft`'s server metrics (vote, role, leader: they change with the
/// leadership, not with every entry as the full metrics do) and the election guard's word on whether the
/// leader went silent (then no leader is named: openraft keeps naming a leader
/// it has not heard until this node stands for election, which the guard holds
/// back); the receiver changes only when the leadership does.
pub fn watch_leadership(
    raft: &Raft,
    mut leader_silent: watch::Receiver<bool>,
    mut stepping_down: watch::Receiver<bool>,
    shard: ShardId,
) -> watch::Receiver<Leadership> {
    let mut metrics = raft.server_metrics();
    let mut data = raft.data_metrics();
    let (sender, receiver) = watch::channel(Leadership::default());
    crate::seams::spawn(async move {
        let mut catch_up = CatchUp::default();
        loop {
            let current = {
                let metrics = metrics.borrow_and_update();
                let silent = *leader_silent.borrow_and_update();
                // A leader handing the shard over (`handover.rs`) names no
                // leader: nothing is proposed or answered here meanwhile.
                let stepping = *stepping_down.borrow_and_update();
                let raft_leader = metrics.state == ServerState::Leader;
                let leads = raft_leader && metrics.current_leader == Some(metrics.id);
                let term = metrics.vote.leader_id().get_term();
                let caught_up =
                    catch_up.caught_up(leads.then_some(term), &data.borrow_and_update());
                // Until then it is led by nobody, as while stepping down.
                let is_leader = leads && caught_up && !stepping;
                Leadership {
                    leader: metrics
                        .current_leader
                        .filter(|_| is_leader || (!raft_leader && !silent)),
                    term,
                    is_leader,
                }
            };
            sender.send_if_modified(|seen| {
                let changed = *seen != current;
                if changed && seen.leader != current.leader {
                    crate::observe::metrics::leader_changed(shard, current.leader);
                }
                if current.is_leader && !seen.holds(&current) {
                    // One line per term and shard this node led: tests check
                    // from the node logs that no term of a shard ever had two
                    // leaders.
                    tracing::info!(term = current.term, shard, "this node leads the cluster");
                }
                *seen = current;
                changed
            });
            let changed = tokio::select! {
                changed = metrics.changed() => changed.is_ok(),
                // Applied entries matter only to a leader still catching up.
                changed = data.changed(), if catch_up.waiting() => changed.is_ok(),
                // The guard lives as long as Raft; if it is gone, metrics decide.
                () = changed_while_open(&mut leader_silent) => true,
                // No handover task at S = 1: its sender is gone from the start.
                () = changed_while_open(&mut stepping_down) => true,
            };
            if !changed {
                // Raft shut down: nobody leads any more from here.
                sender.send_replace(Leadership::default());
                return;
            }
        }
    });
    receiver
}

/// Whether this node, leading a term in openraft, has applied every entry its
/// log held when it began to: only then does its applied state hold every
/// acknowledged answer.
///
/// A new leader learns which of its entries are committed only once one of
/// its own term commits. openraft 0.9 also resumes a leader at start-up, in
/// the term its persisted vote names, with its committed id as its log last
/// recorded it: an entry answered just before a power cut may be committed
/// but not yet applied there. Served from that state, a retried request met
/// no remembered answer and a held grant looked free: the power-loss soak
/// found acknowledged grants answered otherwise on replay. So the leader
/// names no leader, proposes nothing and answers nothing until its applied
/// index reaches its last entry as of the start of its term here.
#[derive(Debug, Default)]
struct CatchUp {
    /// The term led, and the last log index when this node was seen leading it.
    target: Option<(u64, Option<u64>)>,
    done: bool,
}

impl CatchUp {
    /// `leading` is the term this node leads in openraft, if it does.
    fn caught_up(&mut self, leading: Option<u64>, data: &RaftDataMetrics<NodeId>) -> bool {
        let Some(term) = leading else {
            *self = Self::default();
            return false;
        };
        if self.target.map(|(led, _)| led) != Some(term) {
            let last = data.last_log.map(|log_id| log_id.index);
            self.target = Some((term, last));
            self.done = false;
        }
        if !self.done {
            let needed = self.target.and_then(|(_, last)| last);
            let applied = data.last_applied.map(|log_id| log_id.index);
            self.done = applied >= needed;
        }
        self.done
    }

    /// A leader still catching up: applied-entry changes decide when it is done.
    fn waiting(&self) -> bool {
        self.target.is_some() && !self.done
    }
}

/// Resolves when `receiver` changes; never once its sender is gone (a closed
/// watch resolves `changed` at once, every time: selected on in a loop, it
/// would spin).
async fn changed_while_open(receiver: &mut watch::Receiver<bool>) {
    if receiver.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Resolves once `receiver` no longer shows the leadership `started` (or Raft is gone).
pub async fn lost(mut receiver: watch::Receiver<Leadership>, started: Leadership) {
    // `wait_for` fails only when the sender is gone, which is a loss too.
    let _ = receiver.wait_for(|now| !now.holds(&started)).await;
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, LogId};

    use super::*;

    fn data(last_log: Option<u64>, last_applied: Option<u64>) -> RaftDataMetrics<NodeId> {
        let log_id = |index| LogId::new(CommittedLeaderId::new(6, 2), index);
        RaftDataMetrics {
            last_log: last_log.map(log_id),
            last_applied: last_applied.map(log_id),
            snapshot: None,
            purged: None,
            millis_since_quorum_ack: None,
            replication: None,
        }
    }

    #[test]
    fn a_resumed_leader_leads_once_it_applied_its_whole_log() {
        let mut catch_up = CatchUp::default();
        // Resumed in term 6 with entries 784–786 logged, 783 applied.
        assert!(!catch_up.caught_up(Some(6), &data(Some(786), Some(783))));
        assert!(catch_up.waiting());
        // Entries appended meanwhile do not move the mark.
        assert!(!catch_up.caught_up(Some(6), &data(Some(788), Some(785))));
        assert!(catch_up.caught_up(Some(6), &data(Some(788), Some(786))));
        assert!(!catch_up.waiting());
        // Done for the term: a later lag does not take the lead back.
        assert!(catch_up.caught_up(Some(6), &data(Some(790), Some(786))));
    }

    #[test]
    fn each_term_led_is_caught_up_anew_and_an_empty_log_at_once() {
        let mut catch_up = CatchUp::default();
        assert!(catch_up.caught_up(Some(1), &data(None, None)));
        assert!(!catch_up.caught_up(None, &data(Some(5), Some(5))));
        assert!(!catch_up.waiting());
        assert!(!catch_up.caught_up(Some(3), &data(Some(9), Some(5))));
        assert!(catch_up.caught_up(Some(3), &data(Some(10), Some(10))));
    }
}
