//! Disks that can lose power: each node's data dir on a `powerfs` mount.
//!
//! With [`crate::Settings::power_loss_disks`], node `N` runs with its working
//! directory on a `powerfs` mount, `disks/node-N` under the cluster's temp dir
//! (over `backing/node-N`), as a user runs `permitd up` in a folder: its
//! cluster file is `cluster.toml` there and its data dir the relative
//! `data/node-N`. The node creates `data` and `data/node-N` itself, so the
//! durability of its own folders, down to the entry in the working directory
//! that names `data`, is under test too. [`Disks::power_loss`]
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

/// The name of the cluster file in a node's working directory.
pub const CONFIG_FILE: &str = "cluster.toml";

/// Node `id`'s data dir as its cluster file names it: relative to the file,
/// which sits in the node's working directory.
pub fn relative_data_dir(id: u64) -> String {
    format!("data/node-{id}")
}

/// The data dir of node `id` on its disk, relative to the cluster's dir.
pub fn data_dir(id: u64) -> String {
    format!("{}/{}", mount_dir(id), relative_data_dir(id))
}

/// Writes the cluster file into a node's mount durably (the file, then the
/// mount's root that names it): the test's setup must survive every cut, so
/// only what the node itself writes is under test.
pub fn write_config(mount: &Path, toml: &str) {
    let path = mount.join(CONFIG_FILE);
    std::fs::write(&path, toml).expect("cluster file on the disk");
    std::fs::File::open(&path)
        .and_then(|file| file.sync_all())
        .expect("fsync of the cluster file");
    permitd_storage::fsync::fsync_dir(mount).expect("fsync of the mount's root");
}
