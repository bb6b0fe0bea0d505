//! Making writes durable: on stable storage, not only in the page cache.
//!
//! sled's own flush ends, on Linux, in `sync_file_range` on its `db` file. That
//! call writes back data pages only: it persists no metadata (the file's new
//! size is metadata: sled's file grows as it writes), sends no cache flush to
//! the device, and never makes a new file's directory entry durable. After a
//! power loss a store flushed that way can come back without what it wrote
//! since its last real sync. So a durable flush here is sled's flush, then an
//! `fsync` of every file and folder sled keeps, then of the folders above.
//!
//! The state machine needs this only now and then (docs/architecture.md,
//! "What is synced when"): at start-up, when a snapshot is built or installed
//! (openraft purges the log behind it, so the state it covers must not be
//! lost), and at a clean shutdown. Between those, the Raft log (`wal`) holds
//! every entry the state tree may lose, and openraft applies them again.
//!
//! sled's `flush_async` hands the flush to sled's own IO thread pool, whose
//! queue wakes *every* idle pool thread (seven) for each task; a flush on
//! tokio's blocking pool wakes one thread.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::fsync::fsync_dir;
use crate::StorageError;

/// A sled database and the folder its files live in.
#[derive(Debug, Clone)]
pub(crate) struct DurableDb {
    db: sled::Db,
    /// `<data dir>/sled`: every file and folder in it is synced by a flush.
    sled_dir: PathBuf,
}

impl DurableDb {
    pub(crate) fn new(db: sled::Db, sled_dir: PathBuf) -> Self {
        Self { db, sled_dir }
    }

    pub(crate) fn db(&self) -> &sled::Db {
        &self.db
    }

    /// Writes everything `db` buffers and syncs its files; returns once it is
    /// durable. Blocks a thread of tokio's blocking pool, never the runtime.
    pub(crate) async fn flush(&self) -> Result<(), StorageError> {
        let this = self.clone();
        match tokio::task::spawn_blocking(move || this.flush_blocking()).await {
            Ok(flushed) => flushed,
            Err(error) => Err(StorageError::Flush(error.to_string())),
        }
    }

    /// [`DurableDb::flush`] on the calling thread.
    pub(crate) fn flush_blocking(&self) -> Result<(), StorageError> {
        self.db.flush()?;
        sync_tree(&self.sled_dir).map_err(|error| StorageError::Flush(error.to_string()))
    }
}

/// `fsync`s every file under `dir` (sled keeps at most one level of folders),
/// then the folders themselves, deepest first, then `dir`'s parent: the files'
/// contents and sizes, and every directory entry that names them.
fn sync_tree(dir: &Path) -> io::Result<()> {
    let mut folders = vec![dir.to_owned()];
    let mut index = 0;
    while let Some(folder) = folders.get(index).cloned() {
        for entry in fs::read_dir(&folder)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                folders.push(entry.path());
            } else if kind.is_file() {
                sync_file(&entry.path())?;
            }
        }
        index += 1;
    }
    for folder in folders.iter().rev() {
        fsync_dir(folder)?;
    }
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => fsync_dir(parent),
        _ => Ok(()),
    }
}

/// `fsync` of a file opened read-only: Linux syncs the inode whatever the
/// descriptor's mode. A file removed meanwhile (sled replaced it) is skipped.
fn sync_file(path: &Path) -> io::Result<()> {
    match fs::File::open(path) {
        Ok(file) => file.sync_all(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_syncs_every_sled_file() {
        let root = tempfile::tempdir().unwrap();
        let sled_dir = root.path().join("sled");
        let db = sled::Config::new().path(&sled_dir).open().unwrap();
        db.insert(b"k", b"v").unwrap();
        let durable = DurableDb::new(db, sled_dir);
        durable.flush_blocking().unwrap();
    }
}
