//! The cluster defaults, written into every shard until they are.
//!
//! Into the meta shard (shard 0), the file's `[defaults]`: `/cluster/init`
//! writes them right after initialising the cluster, but that write can fail
//! (no leader within its deadline, the node stopped in between), and nothing
//! would ever try again: the cluster would run on the built-in defaults. So
//! whenever a node becomes the meta shard's leader it checks whether the
//! replicated state ever had defaults written (`Semaphores::defaults_written`)
//! and, if not, proposes its own file's `[defaults]`, retrying while it leads
//! until one is applied. A cluster whose defaults were written once (by init
//! or by `PUT /cluster/defaults`) is never touched again.
//!
//! Into every other shard, the meta shard's: a round's outcome depends on the
//! defaults, and a shard's apply may read only its own log, so the leader of
//! shard k proposes a `SetDefaults` in shard k whenever the meta shard's
//! applied defaults differ from shard k's (at election, and after every change
//! through `PUT /cluster/defaults`). A shard therefore takes a new default
//! within one commit of its leader seeing it (docs/architecture.md, "Shards").

use std::time::Duration;

use permitd_core::KeyConfig;
use permitd_storage::{Command, SharedState};
use tokio::sync::{broadcast, watch};

use crate::leader::leadership::{lost, Leadership};
use crate::leader::propose::{propose, ProposeError};
use crate::raft::Raft;

/// Pause between two attempts while this node leads and the defaults are missing.
const RETRY_DELAY_MS: u64 = 200;

/// Where a shard's defaults come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// The meta shard: the file's `[defaults]`, until any are written.
    File(KeyConfig),
    /// Another shard: the meta shard's applied defaults ([`meta_defaults`]).
    Meta(watch::Receiver<Option<KeyConfig>>),
}

/// Starts the task; it ends when Raft shuts down.
pub fn start(
    raft: Raft,
    state: SharedState,
    leadership: watch::Receiver<Leadership>,
    source: Source,
) {
    crate::seams::spawn(run(raft, state, leadership, source));
}

/// The meta shard's applied defaults (`None` until any were written), as a
/// watch that changes only when they do: one task per node follows the meta
/// shard's entries, so the other shards wake only for a change.
pub fn meta_defaults(meta: &SharedState) -> watch::Receiver<Option<KeyConfig>> {
    let current = |meta: &SharedState| {
        meta.read(|semaphores| {
            semaphores
                .defaults_written()
                .then(|| semaphores.defaults().clone())
        })
    };
    let mut applied = meta.subscribe();
    let (sender, receiver) = watch::channel(current(meta));
    let meta = meta.clone();
    crate::seams::spawn(async move {
        loop {
            match applied.recv().await {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let now = current(&meta);
                    sender.send_if_modified(|seen| {
                        let changed = *seen != now;
                        *seen = now;
                        changed
                    });
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    receiver
}

async fn run(
    raft: Raft,
    state: SharedState,
    mut leadership: watch::Receiver<Leadership>,
    mut source: Source,
) {
    loop {
        let Ok(started) = leadership
            .wait_for(|now| now.is_leader)
            .await
            .map(|now| *now)
        else {
            return;
        };
        let shut_down = match &mut source {
            Source::File(defaults) => {
                let missing = |state: &SharedState| {
                    (!state.read(|semaphores| semaphores.defaults_written()))
                        .then(|| defaults.clone())
                };
                write_while_leading(&raft, &state, &leadership, started, missing).await
            }
            Source::Meta(meta) => {
                copy_while_leading(&raft, &state, &leadership, started, meta).await
            }
        };
        if shut_down {
            return;
        }
        lost(leadership.clone(), started).await;
    }
}

/// While `started` lasts, writes the meta shard's defaults into this shard
/// each time they differ from its own; whether Raft shut down meanwhile.
async fn copy_while_leading(
    raft: &Raft,
    state: &SharedState,
    leadership: &watch::Receiver<Leadership>,
    started: Leadership,
    meta: &mut watch::Receiver<Option<KeyConfig>>,
) -> bool {
    loop {
        let wanted = meta.borrow_and_update().clone();
        let differs = |state: &SharedState| {
            let wanted = wanted.clone()?;
            let own = state.read(|semaphores| {
                semaphores
                    .defaults_written()
                    .then(|| semaphores.defaults().clone())
            });
            (own.as_ref() != Some(&wanted)).then_some(wanted)
        };
        if write_while_leading(raft, state, leadership, started, differs).await {
            return true;
        }
        tokio::select! {
            changed = meta.changed() => if changed.is_err() { return true },
            () = lost(leadership.clone(), started) => return false,
        }
    }
}

/// Proposes what `wanted` names until it names nothing or `started` ends;
/// whether Raft shut down meanwhile.
async fn write_while_leading(
    raft: &Raft,
    state: &SharedState,
    leadership: &watch::Receiver<Leadership>,
    started: Leadership,
    wanted: impl Fn(&SharedState) -> Option<KeyConfig>,
) -> bool {
    while leadership.borrow().holds(&started) {
        // Applied up to this term's first entry: a `SetDefaults` committed under
        // an earlier leader is visible before deciding it is missing. Without
        // that certainty, nothing is proposed.
        if raft.ensure_linearizable().await.is_err() {
            tokio::time::sleep(Duration::from_millis(RETRY_DELAY_MS)).await;
            continue;
        }
        let Some(defaults) = wanted(state) else {
            return false;
        };
        match propose(raft, leadership, Command::SetDefaults { defaults }).await {
            Ok((result, _)) => {
                match result.into_done() {
                    Ok(()) => tracing::info!("cluster defaults written into this shard"),
                    // Deterministic: every attempt would be refused alike.
                    Err(error) => tracing::error!(%error, "the defaults were refused"),
                }
                return false;
            }
            Err(ProposeError::ShuttingDown) => return true,
            Err(error) => tracing::warn!(%error, "cannot write the cluster defaults yet"),
        }
        tokio::time::sleep(Duration::from_millis(RETRY_DELAY_MS)).await;
    }
    false
}
