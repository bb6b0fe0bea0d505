//! Every replica's applied state equals a replay of its own log.
//!
//! Each running node registers its applied state and its disk here while its
//! process lives (a crash drops the registration with the process). At the
//! end of a history, with no step in flight, [`Replicas::check`] opens a copy
//! of each running node's disk as a fresh store would (its newest snapshot),
//! applies that store's log up to the id the node has applied, and compares
//! the result with the node's memory, shard by shard
//! (`permitd_storage::audit::check_live_shards`):
//! semaphores, tokens, applied id and membership. A difference is a bug of
//! determinism, of the snapshot's encoding, of an install, or of a log that
//! lost or changed an entry the node had applied.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use permitd_storage::{audit, Exec, NodeId, Options, SharedState};

use crate::checker::Violation;
use crate::disk::SimDisk;

/// The running nodes' applied states and disks; clones share them.
#[derive(Debug, Clone, Default)]
pub struct Replicas(Arc<Mutex<Registry>>);

#[derive(Debug, Default)]
struct Registry {
    running: BTreeMap<NodeId, Replica>,
    /// Counts starts, so that an old process's registration, dropped late,
    /// never removes a newer one's.
    starts: u64,
}

#[derive(Debug)]
struct Replica {
    /// Every shard's applied state, in shard order.
    state: Vec<SharedState>,
    disk: SimDisk,
    start: u64,
}

/// A node's registration: dropped with its process.
#[derive(Debug)]
pub struct Running {
    replicas: Replicas,
    id: NodeId,
    start: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut registry = self.replicas.lock();
        if registry
            .running
            .get(&self.id)
            .is_some_and(|replica| replica.start == self.start)
        {
            registry.running.remove(&self.id);
        }
    }
}

impl Replicas {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers node `id`'s process until the returned guard drops.
    pub fn running(&self, id: NodeId, state: Vec<SharedState>, disk: SimDisk) -> Running {
        let mut registry = self.lock();
        registry.starts += 1;
        let start = registry.starts;
        registry.running.insert(id, Replica { state, disk, start });
        Running {
            replicas: self.clone(),
            id,
            start,
        }
    }

    /// Checks every running node against a replay of its log. Call it
    /// between steps of the simulation (at the end of a run).
    pub fn check(&self) -> Vec<Violation> {
        let replicas: Vec<(NodeId, Vec<SharedState>, SimDisk)> = self
            .lock()
            .running
            .iter()
            .map(|(id, replica)| (*id, replica.state.clone(), replica.disk.fork()))
            .collect();
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                return vec![Violation {
                    kind: "replica_not_checked",
                    detail: format!("no runtime for the replay: {error}"),
                }]
            }
        };
        replicas
            .into_iter()
            .filter_map(|(id, state, disk)| {
                let store =
                    Options::with_disk(crate::node_host::DATA_DIR, Arc::new(disk), Exec::Inline);
                let checked = runtime.block_on(audit::check_live_shards(&state, &store));
                checked.err().map(|error| Violation {
                    kind: "replica_differs_from_its_log",
                    detail: format!("node{id}: {error}"),
                })
            })
            .collect()
    }
}
