//! Pending namespace ops: creates, removes and renames not yet made durable by an
//! fsync of their directory.
//!
//! Each op names the directory inodes it changed. `fsyncdir(D)` makes durable every
//! pending op that touched D and, since a rename ties two directories' changes
//! together (one journal transaction on ext4), every *earlier* pending op that touched
//! a directory of an op made durable this way (transitively). A rename across two
//! directories is therefore durable when **either** directory is fsynced. An op made
//! durable whose parent's creation is not (a file in a new dir that was never fsynced
//! in its parent) is lost with its parent at power loss, as on a real filesystem.
//!
//! A removed entry (unlink, rmdir, a rename's overwritten target) is parked in the
//! trash dir until the remove is durable, so that power loss can put it back.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// What a namespace op did, with what undoing it needs. Paths are backing-relative.
#[derive(Debug, Clone)]
pub enum Change {
    /// A file or dir was created at `path`.
    Create { path: PathBuf },
    /// The entry at `path` (inode `ino`) was moved to `trash`.
    Remove {
        path: PathBuf,
        trash: PathBuf,
        ino: u64,
    },
    /// `from` was renamed to `to`; what was at `to` went to the trash.
    Rename {
        from: PathBuf,
        to: PathBuf,
        displaced: Option<(PathBuf, u64)>,
    },
}

/// One namespace op and the directories (inodes) it changed.
#[derive(Debug, Clone)]
pub struct Op {
    /// The parent directories changed (one, or two for a cross-dir rename).
    pub dirs: Vec<u64>,
    /// What changed.
    pub change: Change,
    /// Made durable by an fsyncdir.
    pub durable: bool,
}

impl Op {
    /// The trash entry (and its inode) that this op, once durable, lets go of.
    pub fn released_trash(&self) -> Option<(&Path, u64)> {
        match &self.change {
            Change::Remove { trash, ino, .. } => Some((trash, *ino)),
            Change::Rename {
                displaced: Some((t, ino)),
                ..
            } => Some((t, *ino)),
            _ => None,
        }
    }
}

/// The ops since the oldest one that is not durable, in order.
#[derive(Debug, Default)]
pub struct Pending {
    ops: Vec<Op>,
}

/// What a revert did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Reverted {
    /// Ops undone.
    pub dropped: usize,
    /// Ops whose undo found nothing to do (their paths gone with an earlier undo).
    pub skipped: usize,
}

impl Pending {
    /// Record an op.
    pub fn push(&mut self, dirs: Vec<u64>, change: Change) {
        self.ops.push(Op {
            dirs,
            change,
            durable: false,
        });
    }

    /// Ops not yet durable.
    pub fn pending_count(&self) -> usize {
        self.ops.iter().filter(|o| !o.durable).count()
    }

    /// fsyncdir(`dir`): mark its ops (and the earlier ops tied to them) durable.
    /// Returns the ops newly made durable, for the caller to release their trash.
    pub fn sync_dir(&mut self, dir: u64) -> Vec<Op> {
        let mut dirs = vec![dir];
        let mut newly = Vec::new();
        for op in self.ops.iter_mut().rev() {
            if op.durable || !op.dirs.iter().any(|d| dirs.contains(d)) {
                continue;
            }
            op.durable = true;
            for d in &op.dirs {
                if !dirs.contains(d) {
                    dirs.push(*d);
                }
            }
            newly.push(op.clone());
        }
        // a durable op is kept only while an earlier op is pending and a durable
        // rename may have moved that op's paths
        let first_pending = self.ops.iter().position(|o| !o.durable);
        match first_pending {
            None => self.ops.clear(),
            Some(i) => {
                self.ops.drain(..i);
                self.ops
                    .retain(|o| !o.durable || matches!(o.change, Change::Rename { .. }));
            }
        }
        newly
    }

    /// Power loss: undo every op that is not durable, newest first, in `backing`.
    pub fn revert(&mut self, backing: &Path) -> io::Result<Reverted> {
        let mut r = Reverted::default();
        // durable renames newer than the op being undone, newest first: the op's paths
        // are where they were then; the renames moved them
        let mut moved: Vec<(PathBuf, PathBuf)> = Vec::new();
        let map = |p: &Path, moved: &[(PathBuf, PathBuf)]| -> PathBuf {
            let mut p = p.to_path_buf();
            for (from, to) in moved.iter().rev() {
                if let Ok(rest) = p.strip_prefix(from) {
                    p = if rest.as_os_str().is_empty() {
                        to.clone()
                    } else {
                        to.join(rest)
                    };
                }
            }
            p
        };
        for op in std::mem::take(&mut self.ops).into_iter().rev() {
            if op.durable {
                if let Change::Rename { from, to, .. } = op.change {
                    moved.push((from, to));
                }
                continue;
            }
            let done = match op.change {
                Change::Create { path } => {
                    let p = backing.join(map(&path, &moved));
                    match fs::symlink_metadata(&p) {
                        Ok(m) if m.is_dir() => fs::remove_dir_all(&p).map(|_| true)?,
                        Ok(_) => fs::remove_file(&p).map(|_| true)?,
                        Err(_) => false,
                    }
                }
                Change::Remove { path, trash, .. } => {
                    let p = backing.join(map(&path, &moved));
                    let t = backing.join(trash);
                    if t.exists() && p.parent().is_some_and(Path::exists) {
                        fs::rename(&t, &p)?;
                        true
                    } else {
                        false
                    }
                }
                Change::Rename {
                    from,
                    to,
                    displaced,
                } => {
                    let f = backing.join(map(&from, &moved));
                    let t = backing.join(map(&to, &moved));
                    let mut done = false;
                    if fs::symlink_metadata(&t).is_ok() && f.parent().is_some_and(Path::exists) {
                        fs::rename(&t, &f)?;
                        done = true;
                    }
                    if let Some((trash, _)) = displaced {
                        let tr = backing.join(trash);
                        if tr.exists() && t.parent().is_some_and(Path::exists) {
                            fs::rename(&tr, &t)?;
                            done = true;
                        }
                    }
                    done
                }
            };
            if done {
                r.dropped += 1;
            } else {
                r.skipped += 1;
            }
        }
        Ok(r)
    }
}
