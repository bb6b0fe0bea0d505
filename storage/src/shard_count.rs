//! The shard count a data dir was written with, in a file (`<dir>/shard_count`).
//!
//! A key's shard is `shard_of(key, count)`, so a dir opened with another count
//! would hold keys where no call looks for them: its shards' states would be
//! silently wrong. The count is therefore written once, when the store is new,
//! and every later open must ask for the same one. A dir initialised before
//! this file existed holds one shard. Going from S to S′ shards is a backup
//! and a restore into a new cluster (docs/operations.md, "Changing the shard
//! count").

use std::path::Path;

use crate::disk::{Disk, OpenMode};
use crate::StorageError;

const COUNT_FILE: &str = "shard_count";

/// Accepts `count` for the store in `dir`, recording it when the store is new
/// (`initialised` is false: no format marker yet). Before the log and the
/// marker are created, so an initialised store always has its count (or
/// predates it and holds one shard).
pub(crate) fn check_or_record(
    disk: &dyn Disk,
    dir: &Path,
    count: u32,
    initialised: bool,
) -> Result<(), StorageError> {
    let recorded = read(disk, dir)?;
    let written_with = match (recorded, initialised) {
        (Some(recorded), true) => recorded,
        (None, true) => 1,
        // A store that never got its marker holds nothing yet.
        (_, false) => return write(disk, dir, count),
    };
    if written_with == count {
        if recorded.is_none() {
            return write(disk, dir, count);
        }
        return Ok(());
    }
    Err(StorageError::Incompatible {
        dir: dir.to_owned(),
        detail: format!(
            "the store was written with {written_with} shard(s) and is opened with {count}; \
             a key's shard depends on the count, so it cannot change in place: back up, \
             and restore into a new cluster (docs/operations.md, \"Changing the shard count\")"
        ),
    })
}

/// The shard count of the initialised store in `dir`: recorded, or 1 for a
/// store written before counts were recorded.
pub(crate) fn recorded(disk: &dyn Disk, dir: &Path) -> Result<u32, StorageError> {
    Ok(read(disk, dir)?.unwrap_or(1))
}

fn read(disk: &dyn Disk, dir: &Path) -> Result<Option<u32>, StorageError> {
    let path = dir.join(COUNT_FILE);
    match disk.read(&path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            text.trim()
                .parse()
                .map(Some)
                .map_err(|_| StorageError::Corrupt {
                    dir: dir.to_owned(),
                    detail: format!("unreadable {}: {:?}", path.display(), text.trim()),
                })
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(StorageError::Corrupt {
            dir: dir.to_owned(),
            detail: format!("cannot read {}: {error}", path.display()),
        }),
    }
}

/// Writes the count durably: file, then its directory entry.
fn write(disk: &dyn Disk, dir: &Path, count: u32) -> Result<(), StorageError> {
    let io = |error: std::io::Error| StorageError::CreateDir {
        dir: dir.to_owned(),
        source: error,
    };
    let path = dir.join(COUNT_FILE);
    let file = disk.open(&path, OpenMode::CreateOrTruncate).map_err(io)?;
    file.write_all_at(format!("{count}\n").as_bytes(), 0)
        .map_err(io)?;
    file.sync_all().map_err(io)?;
    disk.sync_dir(dir).map_err(io)
}
