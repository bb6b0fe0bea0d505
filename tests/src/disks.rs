//! Disks that can lose power: each node's data dir on a `powerfs` mount.
//!
//! With [`crate::Settings::power_loss_disks`], node `N` keeps its data in
//! `disks/node-N/data` under the cluster's temp dir, where `disks/node-N` is a
//! `powerfs` mount over `backing/node-N`. The node creates `data` itself, so
//! the durability of its own folder is under test too. [`Disks::power_loss`]
//! drops whatever the node had not made durable; the caller kills the node
//! first, as a power cut would.

use std::collections::BTreeMap;
use std::path::Path;

use permitd_powerfs::{LossReport, PowerFs};

/// The mounts of a cluster's nodes, by node id.
#[derive(Debug, Default)]
pub struct Disks {
    mounts: BTreeMap<u64, PowerFs>,
}

impl Disks {
    /// Mounts one disk per node id under `root`.
    pub fn mount(root: &Path, ids: impl IntoIterator<Item = u64>) -> Self {
        let mut mounts = BTreeMap::new();
        for id in ids {
            let backing = root.join("backing").join(format!("node-{id}"));
            let mountpoint = root.join(mount_dir(id));
            std::fs::create_dir_all(&backing).expect("backing dir");
            std::fs::create_dir_all(&mountpoint).expect("mountpoint");
            let disk = PowerFs::mount(&backing, &mountpoint)
                .unwrap_or_else(|error| panic!("mounting powerfs for node {id}: {error}"));
            mounts.insert(id, disk);
        }
        Self { mounts }
    }

    /// Drops what node `id`'s disk did not make durable. Its node must be dead.
    pub fn power_loss(&self, id: u64, torn: Option<u64>) -> LossReport {
        self.mounts
            .get(&id)
            .unwrap_or_else(|| panic!("node {id} has no disk"))
            .power_loss(torn)
            .unwrap_or_else(|error| panic!("power loss on node {id}'s disk: {error}"))
    }
}

/// The mountpoint of node `id`'s disk, relative to the cluster's dir.
pub fn mount_dir(id: u64) -> String {
    format!("disks/node-{id}")
}

/// The data dir of node `id` on its disk, relative to the cluster's dir.
pub fn data_dir(id: u64) -> String {
    format!("{}/data", mount_dir(id))
}
