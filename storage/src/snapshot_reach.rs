//! How far the newest durable snapshot reaches: what a purge of the log may
//! not pass.
//!
//! openraft purges the log behind a snapshot. For a snapshot this node built,
//! the file is durable before openraft hears of it. For one it installs from
//! the leader, openraft asks for the purge as soon as the snapshot has arrived,
//! while the state machine is still writing it: a purge made durable then, and
//! a crash, or a failed write (a full disk), before the file is, left a node
//! whose log starts after its snapshot ends. It could never start again
//! ("Failed to get log entries"): found by the simulator (docs/simulation.md).
//! So while a snapshot is being received, the log store's purge waits here
//! until a durable snapshot covers the purge point, and fails if the install
//! that would have covered it failed. (A purge with no snapshot on its way
//! goes ahead: openraft's own storage suite purges logs with no snapshot.)

use std::sync::Arc;

use tokio::sync::watch;

use crate::StorageError;

/// The reach of the durable snapshot, as the state machine updates it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Reach {
    /// The last log index the newest durable snapshot covers.
    index: Option<u64>,
    /// A snapshot from the leader is being received or installed.
    receiving: bool,
    /// Why the last install failed, if it did: a purge waiting for it fails.
    failed: Option<String>,
}

/// Shared by the state machine (which moves it) and the log store (which
/// waits on it); cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotReach(Arc<watch::Sender<Reach>>);

impl SnapshotReach {
    /// The reach of the snapshot a store opened with (`None`: no snapshot).
    pub(crate) fn new(index: Option<u64>) -> Self {
        Self(Arc::new(watch::Sender::new(Reach {
            index,
            receiving: false,
            failed: None,
        })))
    }

    /// A snapshot covering up to `index` is durable.
    pub(crate) fn covered(&self, index: Option<u64>) {
        self.0.send_if_modified(|reach| {
            let moved = index > reach.index;
            if moved {
                reach.index = index;
            }
            moved
        });
    }

    /// A snapshot from the leader begins to arrive: purges past the durable
    /// snapshot wait for its install.
    pub(crate) fn receiving(&self) {
        self.0.send_modify(|reach| {
            reach.receiving = true;
            reach.failed = None;
        });
    }

    /// The received snapshot is installed, durably (after [`Self::covered`]).
    pub(crate) fn installed(&self) {
        self.0.send_modify(|reach| reach.receiving = false);
    }

    /// An install failed: purges waiting for it fail too.
    pub(crate) fn failed(&self, why: String) {
        self.0.send_modify(|reach| {
            reach.receiving = false;
            reach.failed = Some(why);
        });
    }

    /// Returns at once unless a snapshot is being received, else once a
    /// durable snapshot covers `index`; fails if that install fails.
    pub(crate) async fn wait_for(&self, index: u64) -> Result<(), StorageError> {
        let mut reach = self.0.subscribe();
        loop {
            {
                let now = reach.borrow_and_update();
                if let Some(why) = &now.failed {
                    return Err(StorageError::Snapshot(format!(
                        "the log is not purged up to {index}: the snapshot that would cover it \
                         was not installed ({why})"
                    )));
                }
                if now.index >= Some(index) || !now.receiving {
                    return Ok(());
                }
            }
            if reach.changed().await.is_err() {
                return Err(StorageError::Snapshot("the state machine is gone".into()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_purge_waits_for_the_snapshot_being_received_that_covers_it() {
        let reach = SnapshotReach::new(Some(10));
        reach.wait_for(10).await.expect("covered at open");
        reach
            .wait_for(30)
            .await
            .expect("no snapshot on its way: no wait");
        reach.receiving();
        let waiting = tokio::spawn({
            let reach = reach.clone();
            async move { reach.wait_for(20).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "no snapshot reaches 20 yet");
        reach.covered(Some(15));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        reach.covered(Some(25));
        reach.installed();
        waiting.await.unwrap().expect("covered now");
    }

    #[tokio::test]
    async fn a_failed_install_fails_the_purge_waiting_for_it() {
        let reach = SnapshotReach::new(None);
        reach.receiving();
        let waiting = tokio::spawn({
            let reach = reach.clone();
            async move { reach.wait_for(5).await }
        });
        tokio::task::yield_now().await;
        reach.failed("No space left on device".into());
        assert!(waiting.await.unwrap().is_err());
    }
}
