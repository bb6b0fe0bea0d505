//! Making directory changes durable.
//!
//! A file's `fsync` covers its data and its own metadata, not the directory
//! entry that names it: a created (or deleted, or renamed) file can vanish (or
//! reappear) after a power loss unless its directory is fsynced too. The same
//! holds for a created directory and its parent. Every function here returns
//! only once the change it made is on disk.
//!
//! The store calls the `_on` forms with its [`Disk`]; the others are the
//! same on the real file system ([`OsDisk`]), for the node and the tools.

use std::io;
use std::path::{Path, PathBuf};

use crate::disk::{Disk, OsDisk};

/// Fsyncs the directory `path`: its entries (files created, deleted, renamed
/// in it) are on disk when this returns.
pub fn fsync_dir(path: &Path) -> io::Result<()> {
    OsDisk.sync_dir(path)
}

/// The directory that names `path`. A relative path of one component (`data`)
/// has the empty path as its parent, which names no directory to open: the
/// directory that names it is the working directory, `.`. Skipping it instead
/// left a first start with `--data-dir data` not durable (a power cut in the
/// seconds after it could take the whole data dir, and with it a node's vote).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if parent.as_os_str().is_empty() => Path::new("."),
        Some(parent) => parent,
        // The root names itself.
        None => path,
    }
}

/// Fsyncs the directory that names `path` ([`parent_dir`]): a file or
/// directory created, renamed or removed at `path` is on disk when this returns.
pub fn fsync_parent(path: &Path) -> io::Result<()> {
    fsync_dir(parent_dir(path))
}

/// `create_dir_all`, durably: every directory it creates is fsynced into its
/// parent, from the top down, so the whole path survives a power loss. The
/// deepest directory itself is fsynced too (it may pre-exist with entries
/// whose creation was never made durable; fsyncing it is cheap).
pub fn durable_create_dir_all(path: &Path) -> io::Result<()> {
    durable_create_dir_all_on(&OsDisk, path)
}

/// [`durable_create_dir_all`] on `disk`.
pub fn durable_create_dir_all_on(disk: &dyn Disk, path: &Path) -> io::Result<()> {
    let created = missing_ancestors(disk, path);
    disk.create_dir_all(path)?;
    for dir in created.iter().rev() {
        disk.sync_dir(parent_dir(dir))?;
    }
    disk.sync_dir(path)
}

/// `path` and its ancestors that do not exist yet, deepest first.
fn missing_ancestors(disk: &dyn Disk, path: &Path) -> Vec<PathBuf> {
    path.ancestors()
        .filter(|ancestor| !ancestor.as_os_str().is_empty())
        .take_while(|ancestor| disk.kind(ancestor).is_err())
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
        assert_eq!(missing_ancestors(&OsDisk, &deep).len(), 3);
        durable_create_dir_all(&deep).unwrap();
        assert!(deep.is_dir());
        assert!(missing_ancestors(&OsDisk, &deep).is_empty());
        durable_create_dir_all(&deep).unwrap();
    }

    #[test]
    fn the_parent_of_a_relative_name_is_the_working_directory() {
        assert_eq!(parent_dir(Path::new("data")), Path::new("."));
        assert_eq!(parent_dir(Path::new("data/node-1")), Path::new("data"));
        assert_eq!(parent_dir(Path::new("/srv/data")), Path::new("/srv"));
        assert_eq!(parent_dir(Path::new("/")), Path::new("/"));
        fsync_parent(Path::new("data")).unwrap();
    }

    #[test]
    fn a_file_in_the_way_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(durable_create_dir_all(&file.join("below")).is_err());
    }
}
