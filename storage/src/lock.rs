//! One process per data dir: an advisory lock on `<dir>/lock`.
//!
//! Two nodes writing one log would interleave records and each believe its own
//! vote; the second one to start is refused instead. The lock is `flock`'s
//! (`File::try_lock`), so it goes with the process: a node killed by SIGKILL or
//! a power cut never leaves a stale lock behind.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use crate::StorageError;

const LOCK_FILE: &str = "lock";

/// The held lock of one data dir; released when dropped.
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    pub(crate) fn acquire(dir: &Path) -> Result<Self, StorageError> {
        let path = dir.join(LOCK_FILE);
        let locked = |detail: String| StorageError::Locked {
            dir: dir.to_owned(),
            detail,
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
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

    #[test]
    fn a_second_lock_on_one_dir_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let refused = DirLock::acquire(dir.path()).unwrap_err();
        assert!(refused.to_string().contains("holds its lock"), "{refused}");
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }
}
