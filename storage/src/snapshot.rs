//! Snapshots: their encoding, and the files that hold them.
//!
//! A snapshot is one [`crate::codec`] document `{version, lastApplied,
//! membership, semaphores}`. The semaphores serialise only their canonical part
//! (settings, grants, leases, remembered answers, in `BTreeMap` order), so two
//! replicas at the same log id produce the same bytes, and the derived indexes
//! are rebuilt on load. The version is read on its own first, so a snapshot from
//! another build fails with "version N" rather than with whatever field changed.
//!
//! The bytes live in a file of `<data dir>/snapshots/` (shard 0's; shard
//! k's in `<data dir>/shards/<k>/snapshots/`, [`snapshot_dir`]). Invariants:
//! - a file is complete and on disk (written to a temporary name, synced,
//!   renamed, directory synced) before openraft hears of it;
//! - the current snapshot is the newest file; others are removed once a newer
//!   one is on disk, and at start-up the newest complete file is current again
//!   ([`SnapshotFiles::load_newest`]).
//!
//! Files are read and written through the store's [`Disk`].

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::{LogId, SnapshotMeta, StoredMembership};
use permitd_core::tokens::TokenRegistry;
use permitd_core::Semaphores;
use serde::{Deserialize, Serialize};

use crate::disk::stream::FileWriter;
use crate::disk::{Disk, OpenMode};
use crate::fsync::durable_create_dir_all_on;
use crate::{codec, NodeId, PeerNode, ShardId, StorageError};

/// The snapshot format this build writes and reads (1 was JSON).
pub const SNAPSHOT_FORMAT_VERSION: u32 = 2;

/// The folder of snapshot files inside a data dir (or a shard's folder).
const SNAPSHOT_DIR: &str = "snapshots";
/// The folder of the shards past shard 0 inside a data dir.
const SHARDS_DIR: &str = "shards";

/// Where `shard`'s snapshot files live. Shard 0's stay where a data dir of one
/// group kept them, so a dir of format 4 opens as shard 0 as it is; the others
/// get folders of their own, outside shard 0's (whose files are cleared of
/// everything but the current snapshot).
pub(crate) fn snapshot_dir(data_dir: &Path, shard: ShardId) -> PathBuf {
    match shard {
        0 => data_dir.join(SNAPSHOT_DIR),
        shard => data_dir
            .join(SHARDS_DIR)
            .join(shard.to_string())
            .join(SNAPSHOT_DIR),
    }
}
/// Extension of a complete snapshot file; `.tmp` while it is written.
const SNAPSHOT_EXTENSION: &str = "snap";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ImageRef<'a> {
    version: u32,
    last_applied: &'a Option<LogId<NodeId>>,
    membership: &'a StoredMembership<NodeId, PeerNode>,
    semaphores: &'a Semaphores,
    tokens: &'a TokenRegistry,
}

#[derive(Deserialize)]
struct Header {
    version: u32,
}

/// A decoded snapshot. (`version` is checked through [`Header`] first.)
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SnapshotImage {
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, PeerNode>,
    pub semaphores: Semaphores,
    /// Absent from snapshots written before tokens existed.
    #[serde(default)]
    pub tokens: TokenRegistry,
}

/// The current snapshot: its metadata and its file.
#[derive(Debug, Clone)]
pub(crate) struct StoredSnapshot {
    pub meta: SnapshotMeta<NodeId, PeerNode>,
    /// The file's name in the snapshot folder.
    pub file: String,
}

/// Serialises the state machine at `last_applied` into `writer`, as it goes.
pub(crate) fn encode_into(
    writer: &mut impl Write,
    last_applied: &Option<LogId<NodeId>>,
    membership: &StoredMembership<NodeId, PeerNode>,
    semaphores: &Semaphores,
    tokens: &TokenRegistry,
) -> Result<(), StorageError> {
    let image = ImageRef {
        version: SNAPSHOT_FORMAT_VERSION,
        last_applied,
        membership,
        semaphores,
        tokens,
    };
    Ok(codec::encode_into(writer, &image)?)
}

/// [`encode_into`] a buffer.
#[cfg(test)]
pub(crate) fn encode(
    last_applied: &Option<LogId<NodeId>>,
    membership: &StoredMembership<NodeId, PeerNode>,
    semaphores: &Semaphores,
    tokens: &TokenRegistry,
) -> Result<Vec<u8>, StorageError> {
    let mut bytes = Vec::new();
    encode_into(&mut bytes, last_applied, membership, semaphores, tokens)?;
    Ok(bytes)
}

/// Parses a snapshot, refusing any other format version.
pub(crate) fn decode(bytes: &[u8]) -> Result<SnapshotImage, StorageError> {
    let unreadable =
        |error: codec::CodecError| StorageError::Snapshot(format!("unreadable snapshot: {error}"));
    let header: Header = codec::decode(bytes).map_err(unreadable)?;
    if header.version != SNAPSHOT_FORMAT_VERSION {
        return Err(StorageError::Snapshot(format!(
            "snapshot format version {}, this build reads {SNAPSHOT_FORMAT_VERSION}",
            header.version
        )));
    }
    codec::decode(bytes).map_err(unreadable)
}

/// The snapshot folder of one data dir. Blocking IO: call from blocking threads
/// (or for reads openraft waits on anyway).
#[derive(Debug, Clone)]
pub(crate) struct SnapshotFiles {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
}

impl SnapshotFiles {
    /// The snapshot files of `shard` in `data_dir`.
    pub fn new(disk: Arc<dyn Disk>, data_dir: &Path, shard: ShardId) -> Self {
        Self {
            disk,
            dir: snapshot_dir(data_dir, shard),
        }
    }

    fn io(&self, action: &str, error: std::io::Error) -> StorageError {
        StorageError::Snapshot(format!("{action} in {}: {error}", self.dir.display()))
    }

    /// The file name of snapshot `snapshot_id` (only characters safe in a name).
    pub fn name_of(snapshot_id: &str) -> String {
        let safe: String = snapshot_id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        format!("{safe}.{SNAPSHOT_EXTENSION}")
    }

    /// Writes `data` as `name`, durably, before anything may name it.
    pub fn write(&self, name: &str, data: &[u8]) -> Result<(), StorageError> {
        self.write_with(name, |file| {
            file.write_all(data)
                .map_err(|error| self.io("writing a snapshot", error))
        })
    }

    /// Writes what `write` puts into the (buffered) file as `name`, durably,
    /// before anything may name it: a snapshot is encoded straight into its
    /// file, never held whole in memory beside the state it copies.
    pub fn write_with(
        &self,
        name: &str,
        write: impl FnOnce(&mut BufWriter<FileWriter>) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let disk = &*self.disk;
        durable_create_dir_all_on(disk, &self.dir)
            .map_err(|error| self.io("creating the folder", error))?;
        let path = self.dir.join(name);
        let temporary = path.with_extension("tmp");
        let file = disk
            .open(&temporary, OpenMode::CreateOrTruncate)
            .map_err(|error| self.io("creating a file", error))?;
        let mut buffered = BufWriter::new(FileWriter::new(file));
        write(&mut buffered)?;
        let file = buffered
            .into_inner()
            .map_err(|error| self.io("writing a snapshot", error.into_error()))?
            .into_file();
        file.sync_all()
            .map_err(|error| self.io("writing a snapshot", error))?;
        disk.rename(&temporary, &path)
            .map_err(|error| self.io("renaming a snapshot", error))?;
        disk.sync_dir(&self.dir)
            .map_err(|error| self.io("syncing the folder", error))
    }

    pub fn read(&self, name: &str) -> Result<Vec<u8>, StorageError> {
        self.disk
            .read(&self.dir.join(name))
            .map_err(|error| self.io(&format!("reading {name}"), error))
    }

    /// The names in the folder; none when it does not exist (yet).
    fn names(&self) -> Result<Vec<std::ffi::OsString>, StorageError> {
        match self.disk.read_dir(&self.dir) {
            Ok(names) => Ok(names),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(error) => Err(self.io("listing", error)),
        }
    }

    /// The newest complete snapshot file and its decoded state, if any. A
    /// file that does not decode is corrupt (only complete files carry the
    /// extension); unfinished writes are ignored. Blocking.
    pub fn load_newest(
        &self,
        data_dir: &Path,
    ) -> Result<Option<(StoredSnapshot, SnapshotImage)>, StorageError> {
        let mut newest: Option<(StoredSnapshot, SnapshotImage)> = None;
        for name in self.names()? {
            let path = self.dir.join(name);
            if path.extension().and_then(|ext| ext.to_str()) != Some(SNAPSHOT_EXTENSION) {
                continue;
            }
            let corrupt = |detail: String| StorageError::Corrupt {
                dir: data_dir.to_owned(),
                detail: format!("snapshot {}: {detail}", path.display()),
            };
            let bytes = self
                .disk
                .read(&path)
                .map_err(|error| corrupt(error.to_string()))?;
            let image = decode(&bytes).map_err(|error| corrupt(error.to_string()))?;
            if newest
                .as_ref()
                .is_some_and(|(_, best)| best.last_applied >= image.last_applied)
            {
                continue;
            }
            let file = path
                .file_name()
                .and_then(|name| name.to_str())
                .ok_or_else(|| corrupt("a file name that is not UTF-8".to_owned()))?
                .to_owned();
            let stored = StoredSnapshot {
                meta: SnapshotMeta {
                    last_log_id: image.last_applied,
                    last_membership: image.membership.clone(),
                    snapshot_id: file
                        .trim_end_matches(&format!(".{SNAPSHOT_EXTENSION}"))
                        .to_owned(),
                },
                file,
            };
            newest = Some((stored, image));
        }
        Ok(newest)
    }

    /// Removes every file but `keep` (older snapshots, unfinished writes).
    pub fn remove_all_but(&self, keep: &str) -> Result<(), StorageError> {
        for name in self.names()? {
            if name != keep {
                self.disk
                    .remove_file(&self.dir.join(name))
                    .map_err(|error| self.io("removing", error))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_checks_its_version() {
        let semaphores = Semaphores::default();
        let membership = StoredMembership::default();
        let bytes = encode(&None, &membership, &semaphores, &TokenRegistry::default()).unwrap();
        let image = decode(&bytes).unwrap();
        assert_eq!(image.semaphores, semaphores);
        assert_eq!(image.last_applied, None);

        #[derive(Serialize)]
        struct Other {
            version: u32,
        }
        let newer = codec::encode(&Other { version: 7 }).unwrap();
        let error = decode(&newer).unwrap_err().to_string();
        assert!(error.contains("version 7"), "{error}");
        assert!(decode(b"garbage").is_err());
    }

    #[test]
    fn tokens_travel_in_snapshots_and_older_snapshots_have_none() {
        use permitd_core::tokens::{Role, TokenSpec};
        let mut tokens = TokenRegistry::default();
        let spec = TokenSpec {
            name: "r".into(),
            role: Role::Reader,
            keys: Vec::new(),
            client_ids: Vec::new(),
        };
        tokens.create(9, 1, &"ab".repeat(32), &spec).unwrap();
        let membership = StoredMembership::default();
        let bytes = encode(&None, &membership, &Semaphores::default(), &tokens).unwrap();
        assert_eq!(decode(&bytes).unwrap().tokens, tokens);

        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct WithoutTokens<'a> {
            version: u32,
            last_applied: Option<LogId<NodeId>>,
            membership: &'a StoredMembership<NodeId, PeerNode>,
            semaphores: Semaphores,
        }
        let older = codec::encode(&WithoutTokens {
            version: SNAPSHOT_FORMAT_VERSION,
            last_applied: None,
            membership: &membership,
            semaphores: Semaphores::default(),
        })
        .unwrap();
        assert!(decode(&older).unwrap().tokens.is_empty());
    }

    #[test]
    fn files_are_written_whole_and_only_the_current_one_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let files = SnapshotFiles::new(Arc::new(crate::disk::OsDisk), dir.path(), 0);
        let old = SnapshotFiles::name_of("1-1-10-1700");
        let new = SnapshotFiles::name_of("1-1-20/1800");
        assert!(!new.contains('/'));
        files.write(&old, b"old").unwrap();
        files.write(&new, b"new").unwrap();
        files.remove_all_but(&new).unwrap();
        assert_eq!(files.read(&new).unwrap(), b"new");
        assert!(files.read(&old).is_err());
    }
}
