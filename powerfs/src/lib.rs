//! powerfs: a power-loss filesystem for crash tests (in the spirit of LazyFS).
//!
//! [`PowerFs::mount`] mounts a FUSE filesystem (in-process, on a background thread)
//! whose reads and writes pass through to a backing dir; the backing dir always holds
//! the *current* view. What a real disk could lose on power loss is recorded, so that
//! [`PowerFs::power_loss`] can drop it:
//!
//! - **Data.** Every write, truncate (setattr size) and fallocate since the file's last
//!   `fsync`/`fdatasync` (FUSE_FSYNC, either datasync flag) is not durable. powerfs
//!   keeps, per inode, an undo log (offset, the old bytes overwritten, the old size);
//!   fsync of the file clears it. `sync_file_range` never reaches FUSE, so a program
//!   that only uses it gets no durability here: intended.
//! - **Namespace.** A create (file, dir), rename, unlink or rmdir is durable only once
//!   its directory is fsynced (FUSE_FSYNCDIR). Until then a removed entry (or a
//!   rename's overwritten target) waits in a hidden trash dir (`.powerfs-trash` in the
//!   backing dir, invisible through the mount). A rename across two dirs is durable
//!   when **either** dir is fsynced; fsyncing a dir also makes durable every earlier
//!   pending op of any dir such a rename tied to it (see [`namespace`]). A created file
//!   whose create is dropped takes its data with it, even if the file was fsynced; a
//!   durable op inside a dir whose own create is dropped goes with the dir.
//!
//! `power_loss` unmounts (the caller's processes must be dead: no file open in the
//! mount, else, after retrying for 5 s, it fails with the unmount's EBUSY and changes
//! nothing), undoes every
//! unsynced data change (newest first), then every pending namespace op (newest first),
//! and mounts again, so no stale kernel cache survives. With `torn = Some(seed)` one
//! file's newest unsynced write (chosen by the seed, among files whose newest change is
//! a write) keeps a random-length prefix (1..len-1 bytes; nothing for a 1-byte write):
//! a torn write. Everything else in the backing dir at mount time is durable.
//!
//! Test tool limits: the undo log lives in memory, capped by
//! [`Options::undo_cap_bytes`] (default 1 GiB): a change that would need more is
//! refused with ENOSPC. Inode numbers are powerfs's own (path ↔ inode table, reset on
//! every remount). Not supported: symlinks, hard links, mknod of anything but regular
//! files, xattrs, RENAME_EXCHANGE. File locks (flock, fcntl) are not forwarded: the
//! kernel keeps them locally, which is all one host needs (sled's lock on its `db`
//! file works). The mount needs root (it mounts with the mount syscall, no
//! `fusermount`, no libfuse) and `/dev/fuse`; no `auto_unmount` (it needs
//! `fusermount3`): dropping [`PowerFs`] unmounts.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let fs = permitd_powerfs::PowerFs::mount("/tmp/backing".as_ref(), "/tmp/mnt".as_ref())?;
//! // ... run the program under test on /tmp/mnt, SIGKILL it ...
//! let report = fs.power_loss(Some(42))?;
//! println!("{report}");
//! fs.unmount()?;
//! # Ok(()) }
//! ```

pub mod fs;
pub mod inodes;
pub mod namespace;
pub mod undo;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use fuser::{BackgroundSession, Config, MountOption};

/// Mount settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Most bytes the data undo logs may hold; past it writes fail with ENOSPC.
    pub undo_cap_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            undo_cap_bytes: 1 << 30,
        }
    }
}

/// The write that power loss tore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornWrite {
    /// The file (relative to the mount's root) as it was before the namespace undo.
    pub path: PathBuf,
    /// Where the write started.
    pub offset: u64,
    /// How long it was.
    pub len: u64,
    /// How many of its first bytes survived.
    pub kept: u64,
}

/// What a power loss dropped, for test logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LossReport {
    /// Unsynced data changes (writes, truncates, fallocates) undone.
    pub writes_dropped: usize,
    /// Files whose content was reverted.
    pub files_reverted: usize,
    /// Pending namespace ops undone.
    pub namespace_ops_dropped: usize,
    /// Pending ops whose undo found nothing left to undo (e.g. inside a dir whose
    /// create was undone).
    pub namespace_ops_skipped: usize,
    /// The torn write, if one was asked for and there was a write to tear.
    pub torn: Option<TornWrite>,
}

impl fmt::Display for LossReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "power loss: {} unsynced writes dropped in {} files, {} namespace ops dropped ({} skipped)",
            self.writes_dropped,
            self.files_reverted,
            self.namespace_ops_dropped,
            self.namespace_ops_skipped
        )?;
        match &self.torn {
            Some(t) => write!(
                f,
                ", torn: {} at {}: {} of {} bytes kept",
                t.path.display(),
                t.offset,
                t.kept,
                t.len
            ),
            None => write!(f, ", no torn write"),
        }
    }
}

/// A mounted powerfs. Dropping it unmounts (lazily if files are still open).
#[derive(Debug)]
pub struct PowerFs {
    mountpoint: PathBuf,
    state: Arc<Mutex<fs::State>>,
    session: Mutex<Option<BackgroundSession>>,
}

fn spawn(state: &Arc<Mutex<fs::State>>, mountpoint: &Path) -> io::Result<BackgroundSession> {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("powerfs".into()),
        MountOption::Subtype("powerfs".into()),
        MountOption::DefaultPermissions,
    ];
    fuser::spawn_mount(
        fs::Fs {
            state: state.clone(),
        },
        mountpoint,
        &config,
    )
}

impl PowerFs {
    /// Mount `backing` at `mountpoint` (both must be dirs) with default [`Options`].
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<PowerFs> {
        Self::mount_with(backing, mountpoint, Options::default())
    }

    /// Mount `backing` at `mountpoint` (both must be dirs).
    pub fn mount_with(backing: &Path, mountpoint: &Path, options: Options) -> io::Result<PowerFs> {
        let backing = backing.canonicalize()?;
        let mountpoint = mountpoint.canonicalize()?;
        let state = Arc::new(Mutex::new(fs::State::new(backing, options.undo_cap_bytes)?));
        let session = spawn(&state, &mountpoint)?;
        Ok(PowerFs {
            mountpoint,
            state,
            session: Mutex::new(Some(session)),
        })
    }

    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    fn st(&self) -> MutexGuard<'_, fs::State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (bytes held by unsynced data changes' undo logs, pending namespace ops)
    pub fn unsynced(&self) -> (u64, usize) {
        self.st().unsynced()
    }

    /// Unmount the session (plain umount: fails with EBUSY while files are open).
    fn umount_session(&self, slot: &mut Option<BackgroundSession>) -> io::Result<()> {
        let Some(session) = slot.take() else {
            return Ok(());
        };
        // a killed process's files are closed as it exits, the kernel's last references
        // to them may go a moment later: retry EBUSY for a while
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut res = nix::mount::umount(&self.mountpoint);
        while res == Err(nix::errno::Errno::EBUSY) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
            res = nix::mount::umount(&self.mountpoint);
        }
        if let Err(e) = res {
            *slot = Some(session);
            return Err(io::Error::new(
                io::Error::from(e).kind(),
                format!(
                    "powerfs: unmount {} failed ({e}): is a file still open in the mount?",
                    self.mountpoint.display()
                ),
            ));
        }
        // Unmounted: the kernel drops the connection, and the session thread ends
        // on its next read with ENODEV or, when a request was still in flight,
        // ECONNABORTED (a CI run saw it). Both are the clean end of the session.
        match session.join() {
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ECONNABORTED as i32) => Ok(()),
            other => other,
        }
    }

    /// Power loss: drop everything not durable and remount (see the crate docs). The
    /// programs using the mount must be dead (no open file in it).
    pub fn power_loss(&self, torn: Option<u64>) -> io::Result<LossReport> {
        let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
        self.umount_session(&mut slot)?;
        let report = self.st().power_loss(torn);
        *slot = Some(spawn(&self.state, &self.mountpoint)?);
        report
    }

    /// Whether the FUSE session still serves: the error it ended with, if its
    /// thread ended while mounted (the kernel then answers every call on the
    /// mount with ECONNABORTED).
    pub fn check_session(&self) -> io::Result<()> {
        let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
        if !slot
            .as_ref()
            .is_some_and(|session| session.guard.is_finished())
        {
            return Ok(());
        }
        match slot.take().map(BackgroundSession::join) {
            Some(Err(error)) => Err(error),
            _ => Err(io::Error::other("the FUSE session ended")),
        }
    }

    /// Unmount; the backing dir keeps the current view (durable or not).
    pub fn unmount(self) -> io::Result<()> {
        let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
        self.umount_session(&mut slot)?;
        drop(slot);
        self.st().discard_trash()
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        let mut slot = self.session.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            return;
        }
        if self.umount_session(&mut slot).is_err() {
            // files still open: detach; the session thread ends with the last of them
            let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
            drop(slot.take());
        }
    }
}
