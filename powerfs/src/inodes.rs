//! The path ↔ inode table.
//!
//! Inode numbers are handed out by powerfs (not taken from the backing fs). Paths are
//! relative to the backing dir; the root is the empty path and inode 1. An inode keeps
//! its number across renames (the table rewrites the paths of a renamed dir's
//! descendants); an unlinked inode points at its place in the trash until the unlink is
//! durable. The table is reset on every remount (power loss), when the kernel has
//! forgotten every inode anyway.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Inode number of the mount's root.
pub const ROOT: u64 = 1;

/// Bidirectional map between powerfs inode numbers and backing-relative paths.
#[derive(Debug)]
pub struct Inodes {
    by_ino: HashMap<u64, PathBuf>,
    by_path: HashMap<PathBuf, u64>,
    next: u64,
}

impl Default for Inodes {
    fn default() -> Self {
        Self::new()
    }
}

impl Inodes {
    /// A table holding only the root.
    pub fn new() -> Self {
        let mut t = Inodes {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT + 1,
        };
        t.by_ino.insert(ROOT, PathBuf::new());
        t.by_path.insert(PathBuf::new(), ROOT);
        t
    }

    /// The path of `ino`, if it is still known.
    pub fn path(&self, ino: u64) -> Option<&Path> {
        self.by_ino.get(&ino).map(PathBuf::as_path)
    }

    /// The inode of `path`, if one was handed out.
    pub fn ino(&self, path: &Path) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// The inode of `path`, handing out a new number the first time.
    pub fn ino_or_insert(&mut self, path: &Path) -> u64 {
        if let Some(ino) = self.by_path.get(path) {
            return *ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(ino, path.to_path_buf());
        self.by_path.insert(path.to_path_buf(), ino);
        ino
    }

    /// Forget `path` (and everything below it); returns the inode it had.
    pub fn remove(&mut self, path: &Path) -> Option<u64> {
        let below: Vec<PathBuf> = self
            .by_path
            .keys()
            .filter(|p| p.starts_with(path) && p.as_path() != path)
            .cloned()
            .collect();
        for p in below {
            if let Some(i) = self.by_path.remove(&p) {
                self.by_ino.remove(&i);
            }
        }
        let ino = self.by_path.remove(path)?;
        self.by_ino.remove(&ino);
        Some(ino)
    }

    /// Move `from` (and everything below it) to `to`. Whatever was at `to` must have
    /// been moved away first.
    pub fn rename(&mut self, from: &Path, to: &Path) {
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, _) in &moved {
            self.by_path.remove(p);
        }
        for (p, ino) in moved {
            let rest = p.strip_prefix(from).unwrap_or(Path::new(""));
            let np = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            self.by_ino.insert(ino, np.clone());
            self.by_path.insert(np, ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_moves_descendants() {
        let mut t = Inodes::new();
        let d = t.ino_or_insert(Path::new("d"));
        let f = t.ino_or_insert(Path::new("d/f"));
        let other = t.ino_or_insert(Path::new("dd"));
        t.rename(Path::new("d"), Path::new("e"));
        assert_eq!(t.path(d), Some(Path::new("e")));
        assert_eq!(t.path(f), Some(Path::new("e/f")));
        assert_eq!(t.path(other), Some(Path::new("dd")));
        assert_eq!(t.ino(Path::new("d/f")), None);
        assert_eq!(t.remove(Path::new("e")), Some(d));
        assert_eq!(t.path(f), None);
    }
}
