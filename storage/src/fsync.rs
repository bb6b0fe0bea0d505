//! Making directory changes durable.
//!
//! A file's `fsync` covers its data and its own metadata, not the directory
//! entry that names it: a created (or deleted, or renamed) file can vanish (or
//! reappear) after a power loss unless its directory is fsynced too. The same
//! holds for a created directory and its parent. Every function here returns
//! only once the change it made is on disk.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Fsyncs the directory `path`: its entries (files created, deleted, renamed
/// in it) are on disk when this returns.
pub fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// `create_dir_all`, durably: every directory it creates is fsynced into its
/// parent, from the top down, so the whole path survives a power loss. The
/// deepest directory itself is fsynced too (it may pre-exist with entries
/// whose creation was never made durable; fsyncing it is cheap).
pub fn durable_create_dir_all(path: &Path) -> io::Result<()> {
    let created = missing_ancestors(path);
    std::fs::create_dir_all(path)?;
    for dir in created.iter().rev() {
        if let Some(parent) = dir.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            fsync_dir(parent)?;
        }
    }
    fsync_dir(path)
}

/// `path` and its ancestors that do not exist yet, deepest first.
fn missing_ancestors(path: &Path) -> Vec<PathBuf> {
    path.ancestors()
        .filter(|ancestor| !ancestor.as_os_str().is_empty())
        .take_while(|ancestor| !ancestor.exists())
        .map(Path::to_path_buf)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_every_missing_level_and_accepts_an_existing_dir() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a").join("b").join("c");
        assert_eq!(missing_ancestors(&deep).len(), 3);
        durable_create_dir_all(&deep).unwrap();
        assert!(deep.is_dir());
        assert!(missing_ancestors(&deep).is_empty());
        durable_create_dir_all(&deep).unwrap();
    }

    #[test]
    fn a_file_in_the_way_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(durable_create_dir_all(&file.join("below")).is_err());
    }
}
