//! The cluster defaults from `cluster.toml`, written until they are.
//!
//! `/cluster/init` writes the file's `[defaults]` right after initialising the
//! cluster, but that write can fail (no leader within its deadline, the node
//! stopped in between), and nothing would ever try again: the cluster would run
//! on the built-in defaults. So whenever a node becomes leader it checks whether
//! the replicated state ever had defaults written
//! (`Semaphores::defaults_written`) and, if not, proposes its own file's
//! `[defaults]`, retrying while it leads until one is applied. Any start of any
//! node that then leads retries, and a cluster whose defaults were written once
//! (by init or by `PUT /cluster/defaults`) is never touched again.

use std::time::Duration;

use permitd_core::KeyConfig;
use permitd_storage::{Command, SharedState};
use tokio::sync::watch;

use crate::leader::leadership::{lost, Leadership};
use crate::leader::propose::{propose, ProposeError};
use crate::raft::Raft;

/// Pause between two attempts while this node leads and the defaults are missing.
const RETRY_DELAY_MS: u64 = 200;

/// Starts the task; it ends when Raft shuts down.
pub fn start(
    raft: Raft,
    state: SharedState,
    leadership: watch::Receiver<Leadership>,
    defaults: KeyConfig,
) {
    crate::seams::spawn(run(raft, state, leadership, defaults));
}

async fn run(
    raft: Raft,
    state: SharedState,
    mut leadership: watch::Receiver<Leadership>,
    defaults: KeyConfig,
) {
    loop {
        let Ok(started) = leadership
            .wait_for(|now| now.is_leader)
            .await
            .map(|now| *now)
        else {
            return;
        };
        if write_while_leading(&raft, &state, &leadership, &defaults, started).await {
            return;
        }
        lost(leadership.clone(), started).await;
    }
}

/// Proposes the defaults until the state has some or `started` ends; whether
/// Raft shut down meanwhile.
async fn write_while_leading(
    raft: &Raft,
    state: &SharedState,
    leadership: &watch::Receiver<Leadership>,
    defaults: &KeyConfig,
    started: Leadership,
) -> bool {
    while leadership.borrow().holds(&started) {
        // Applied up to this term's first entry: a `SetDefaults` committed under
        // an earlier leader is visible before deciding it is missing. Without
        // that certainty, nothing is proposed.
        let applied = raft.ensure_linearizable().await.is_ok();
        if applied && state.read(|semaphores| semaphores.defaults_written()) {
            return false;
        }
        if !applied {
            tokio::time::sleep(Duration::from_millis(RETRY_DELAY_MS)).await;
            continue;
        }
        let command = Command::SetDefaults {
            defaults: defaults.clone(),
        };
        match propose(raft, leadership, command).await {
            Ok((result, _)) => {
                match result.into_done() {
                    Ok(()) => tracing::info!("cluster defaults written from [defaults]"),
                    // Deterministic: every attempt would be refused alike.
                    Err(error) => tracing::error!(%error, "the [defaults] were refused"),
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
