//! One process per data dir: an advisory lock on `<dir>/lock`.
//!
//! Two nodes writing one log would interleave records and each believe its own
//! vote; the second one to start is refused instead. The lock is `flock`'s
//! (`File::try_lock`), so it goes with the process: a node killed by SIGKILL or
//! a power cut never leaves a stale lock behind. It is taken through the
//! store's [`Disk`], whose file keeps it ([`crate::disk::DiskFile::try_lock`]).

use std::fs::TryLockError;
use std::path::Path;

use crate::disk::{Disk, DiskFile, OpenMode};
use crate::StorageError;

const LOCK_FILE: &str = "lock";

/// The held lock of one data dir; released when dropped.
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: Box<dyn DiskFile>,
}

impl DirLock {
    pub(crate) fn acquire(disk: &dyn Disk, dir: &Path) -> Result<Self, StorageError> {
        let path = dir.join(LOCK_FILE);
        let locked = |detail: String| StorageError::Locked {
            dir: dir.to_owned(),
            detail,
        };
        let file = disk
            .open(&path, OpenMode::CreateOrKeep)
            .map_err(|error| locked(format!("cannot open {}: {error}", path.display())))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(TryLockError::WouldBlock) => Err(locked(
                "another process (a running permitd?) holds its lock".to_owned(),
            )),
            Err(TryLockError::Error(error)) => {
                Err(locked(format!("cannot lock {}: {error}", path.display())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::OsDisk;

    #[test]
    fn a_second_lock_on_one_dir_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(&OsDisk, dir.path()).unwrap();
        let refused = DirLock::acquire(&OsDisk, dir.path()).unwrap_err();
        assert!(refused.to_string().contains("holds its lock"), "{refused}");
        drop(first);
        DirLock::acquire(&OsDisk, dir.path()).unwrap();
    }
}
