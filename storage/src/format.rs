//! The on-disk format version, in a marker file (`<dir>/format_version`).
//!
//! The marker also says "this dir holds a store": it is written (durably) only
//! after the write-ahead log was created, so a dir with a marker but no log lost
//! its log, and would forget its vote, which Raft cannot survive (see
//! `open_wal` in `lib.rs`).

use std::path::Path;

use crate::disk::{Disk, OpenMode};
use crate::StorageError;

/// The on-disk layout version this build reads and writes (the write-ahead
/// log's segments and records, `wal/record.rs`; the encoding of
/// [`crate::codec`]; snapshots as files).
///
/// History: 1 held every value as JSON and the snapshot in one sled value; 2
/// holds them in MessagePack and the snapshot in a file. A dir of another
/// version is refused, not migrated: a node's data can always be rebuilt from
/// its peers (delete the dir; the leader sends a snapshot), which is safer than
/// an in-place rewrite of the Raft log.
///
/// 3 moves the Raft log, vote, committed and last purged ids out of sled's `log`
/// and `raft` trees into the write-ahead log (`<dir>/wal`, see `wal/mod.rs`).
///
/// 4 drops sled: the applied state is the newest snapshot file plus the log
/// entries after it, replayed at start-up (`state_machine.rs`).
///
/// 5 writes an entry's command as a byte string holding its MessagePack, the
/// bytes the leader encoded once (`encoded_command.rs`), where 4 wrote the
/// command's map; and every log record carries its shard (`wal/record.rs`),
/// where 4's records are all shard 0's. A format 5 build reads both, so a dir
/// of format 4 opens as one shard: its marker is rewritten to 5 before
/// anything new is logged, and a format 4 build then refuses the dir instead
/// of failing on the first new record.
pub const STORAGE_FORMAT_VERSION: u32 = 5;

/// The older version this build reads as it is (see the history above).
const READABLE_OLDER_VERSION: u32 = 4;

const MARKER_FILE: &str = "format_version";

fn incompatible(dir: &Path, detail: String) -> StorageError {
    StorageError::Incompatible {
        dir: dir.to_owned(),
        detail,
    }
}

fn check_version(dir: &Path, version: u32, place: &str) -> Result<(), StorageError> {
    if version == STORAGE_FORMAT_VERSION {
        return Ok(());
    }
    Err(incompatible(
        dir,
        format!(
            "{place} says format version {version}, this build reads only version \
             {STORAGE_FORMAT_VERSION} and does not migrate; run the build that wrote it, \
             or delete the dir and let the node catch up from its peers"
        ),
    ))
}

/// The version in the marker file, `None` when there is no marker.
fn read_marker(disk: &dyn Disk, dir: &Path) -> Result<Option<u32>, StorageError> {
    let path = dir.join(MARKER_FILE);
    match disk.read(&path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            text.trim().parse().map(Some).map_err(|_| {
                incompatible(
                    dir,
                    format!("unreadable {}: {:?}", path.display(), text.trim()),
                )
            })
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(incompatible(
            dir,
            format!("cannot read {}: {error}", path.display()),
        )),
    }
}

/// Whether the dir holds an initialised store (of any version): its marker file exists.
pub(crate) fn is_initialised(disk: &dyn Disk, dir: &Path) -> Result<bool, StorageError> {
    Ok(read_marker(disk, dir)?.is_some())
}

/// Writes the marker durably: file, then its directory entry.
fn write_marker(disk: &dyn Disk, dir: &Path) -> Result<(), StorageError> {
    let io = |error: std::io::Error| StorageError::CreateDir {
        dir: dir.to_owned(),
        source: error,
    };
    let path = dir.join(MARKER_FILE);
    let file = disk.open(&path, OpenMode::CreateOrTruncate).map_err(io)?;
    let text = format!("{STORAGE_FORMAT_VERSION}\n");
    file.write_all_at(text.as_bytes(), 0).map_err(io)?;
    file.sync_all().map_err(io)?;
    disk.sync_dir(dir).map_err(io)
}

/// Accepts a store of our version; initialises a brand-new one (whose log was
/// just created) by writing the marker.
pub(crate) fn check_or_initialise(disk: &dyn Disk, dir: &Path) -> Result<(), StorageError> {
    match read_marker(disk, dir)? {
        Some(READABLE_OLDER_VERSION) => {
            tracing::info!(
                dir = %dir.display(),
                from = READABLE_OLDER_VERSION,
                to = STORAGE_FORMAT_VERSION,
                "storage format marker upgraded: this build reads the older log as it is"
            );
            write_marker(disk, dir)
        }
        Some(version) => check_version(dir, version, "the marker file"),
        None => write_marker(disk, dir),
    }
}
