//! The on-disk format version, kept twice: in sled and in a marker file beside it.
//! (The marker also says the write-ahead log must exist: see `open_wal` in `lib.rs`.)
//!
//! sled treats a data file it cannot read as a torn log and silently opens an
//! empty database. A store that came back empty would forget its vote and its
//! log, which Raft cannot survive, so the marker file (`<dir>/format_version`,
//! written once the sled store is initialised and flushed) says "this dir holds a
//! store": marker present but nothing in sled means the data was lost.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::durable::DurableDb;
use crate::{keys, StorageError};

/// The on-disk layout version this build reads and writes (the trees and keys of
/// [`crate::keys`], the encoding of [`crate::codec`], snapshots as files).
///
/// History: 1 held every value as JSON and the snapshot in one sled value; 2
/// holds them in MessagePack and the snapshot in a file. A dir of another
/// version is refused, not migrated: a node's data can always be rebuilt from
/// its peers (delete the dir; the leader sends a snapshot), which is safer than
/// an in-place rewrite of the Raft log.
///
/// 3 moves the Raft log, vote, committed and last purged ids out of sled's `log`
/// and `raft` trees into the write-ahead log (`<dir>/wal`, see `wal/mod.rs`).
pub const STORAGE_FORMAT_VERSION: u32 = 3;

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
fn read_marker(dir: &Path) -> Result<Option<u32>, StorageError> {
    let path = dir.join(MARKER_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| {
            incompatible(
                dir,
                format!("unreadable {}: {:?}", path.display(), text.trim()),
            )
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(incompatible(
            dir,
            format!("cannot read {}: {error}", path.display()),
        )),
    }
}

/// Whether the dir holds an initialised store (of any version): its marker file exists.
pub(crate) fn is_initialised(dir: &Path) -> Result<bool, StorageError> {
    Ok(read_marker(dir)?.is_some())
}

/// Writes the marker durably: file, then its directory entry.
fn write_marker(dir: &Path) -> Result<(), StorageError> {
    let io = |error: std::io::Error| StorageError::CreateDir {
        dir: dir.to_owned(),
        source: error,
    };
    let path = dir.join(MARKER_FILE);
    let mut file = fs::File::create(&path).map_err(io)?;
    writeln!(file, "{STORAGE_FORMAT_VERSION}").map_err(io)?;
    file.sync_all().map_err(io)?;
    fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io)
}

/// The version row in sled, `None` when absent.
fn read_sled_version(db: &sled::Db, dir: &Path) -> Result<Option<u32>, StorageError> {
    let Some(bytes) = db.get(keys::FORMAT_VERSION)? else {
        return Ok(None);
    };
    let bytes = <[u8; 4]>::try_from(bytes.as_ref())
        .map_err(|_| incompatible(dir, format!("unreadable format version {bytes:?}")))?;
    Ok(Some(u32::from_be_bytes(bytes)))
}

/// Accepts a store of our version, initialises a brand-new one, refuses the rest.
pub(crate) fn check_or_initialise(durable: &DurableDb, dir: &Path) -> Result<(), StorageError> {
    let db = durable.db();
    let marker = read_marker(dir)?;
    if let Some(version) = marker {
        check_version(dir, version, "the marker file")?;
    }
    match (read_sled_version(db, dir)?, marker) {
        (Some(version), _) => {
            check_version(dir, version, "the database")?;
            if marker.is_none() {
                // A crash between initialising sled and writing the marker.
                write_marker(dir)?;
            }
            Ok(())
        }
        (None, Some(_)) => Err(StorageError::Corrupt {
            dir: dir.to_owned(),
            detail: "the store was initialised but sled recovered none of its data".to_owned(),
        }),
        // Only a database sled has just created is initialised: a recovered one
        // without a version belongs to someone else.
        (None, None) if !db.was_recovered() => {
            db.insert(keys::FORMAT_VERSION, &STORAGE_FORMAT_VERSION.to_be_bytes())?;
            durable.flush_blocking()?;
            write_marker(dir)
        }
        (None, None) => Err(incompatible(
            dir,
            "a sled database without a format version: not a permitd store".to_owned(),
        )),
    }
}
