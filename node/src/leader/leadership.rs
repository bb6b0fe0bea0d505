//! Who leads, as this node sees it: a watch over openraft's server metrics reduced to the
//! few facts the round batcher and the API act on.

use openraft::ServerState;
use permitd_storage::ShardId;
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
    let (sender, receiver) = watch::channel(Leadership::default());
    crate::seams::spawn(async move {
        loop {
            let current = {
                let metrics = metrics.borrow_and_update();
                let silent = *leader_silent.borrow_and_update();
                // A leader handing the shard over (`handover.rs`) names no
                // leader: nothing is proposed or answered here meanwhile.
                let stepping = *stepping_down.borrow_and_update();
                let is_leader = metrics.state == ServerState::Leader;
                Leadership {
                    leader: metrics
                        .current_leader
                        .filter(|_| (is_leader && !stepping) || (!is_leader && !silent)),
                    term: metrics.vote.leader_id().get_term(),
                    is_leader: is_leader && !stepping && metrics.current_leader == Some(metrics.id),
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
