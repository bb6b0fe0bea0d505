//! The `fuser::Filesystem` implementation: pass-through to the backing dir, recording
//! what power loss must undo.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, Metadata};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use nix::libc;

use crate::inodes::{Inodes, ROOT};
use crate::namespace::{Change, Pending};
use crate::undo::{self, Entry, Rng, UndoLog};
use crate::{LossReport, TornWrite};

/// Attributes and entries are never cached by the kernel: every change goes through
/// powerfs, and power loss remounts anyway; zero keeps it simple and correct.
const TTL: Duration = Duration::ZERO;

/// The hidden dir (in the backing dir's root) that holds removed entries until their
/// removal is durable.
pub const TRASH: &str = ".powerfs-trash";

/// Everything powerfs knows; shared by the FUSE thread and the `PowerFs` handle.
#[derive(Debug)]
pub struct State {
    backing: PathBuf,
    inodes: Inodes,
    files: HashMap<u64, (u64, File)>,
    next_fh: u64,
    undo: UndoLog,
    ns: Pending,
    undo_cap: u64,
    trash_seq: u64,
}

type Res<T> = Result<T, Errno>;

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn attr(ino: u64, m: &Metadata) -> FileAttr {
    let t = |s: i64, ns: i64| {
        if s >= 0 {
            UNIX_EPOCH + Duration::new(s as u64, ns as u32)
        } else {
            UNIX_EPOCH
        }
    };
    let ft = m.file_type();
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: t(m.atime(), m.atime_nsec()),
        mtime: t(m.mtime(), m.mtime_nsec()),
        ctime: t(m.ctime(), m.ctime_nsec()),
        crtime: t(m.ctime(), m.ctime_nsec()),
        kind: FileType::from_std(ft).unwrap_or(FileType::RegularFile),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

fn open_rw(p: &Path) -> io::Result<File> {
    File::options().read(true).write(true).open(p)
}

impl State {
    /// State for a fresh mount of `backing` (whose content is all durable).
    pub fn new(backing: PathBuf, undo_cap: u64) -> io::Result<State> {
        let trash = backing.join(TRASH);
        if trash.exists() {
            fs::remove_dir_all(&trash)?;
        }
        fs::create_dir(&trash)?;
        Ok(State {
            backing,
            inodes: Inodes::new(),
            files: HashMap::new(),
            next_fh: 1,
            undo: UndoLog::default(),
            ns: Pending::default(),
            undo_cap,
            trash_seq: 0,
        })
    }

    /// (unsynced data changes, pending namespace ops)
    pub fn unsynced(&self) -> (u64, usize) {
        (self.undo.bytes(), self.ns.pending_count())
    }

    fn abs(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    fn path(&self, ino: INodeNo) -> Res<PathBuf> {
        self.inodes
            .path(ino.0)
            .map(Path::to_path_buf)
            .ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Res<PathBuf> {
        if parent.0 == ROOT && name == TRASH {
            return Err(Errno::ENOENT);
        }
        Ok(self.path(parent)?.join(name))
    }

    fn entry(&mut self, rel: &Path) -> Res<FileAttr> {
        let m = fs::symlink_metadata(self.abs(rel)).map_err(errno)?;
        let ino = self.inodes.ino_or_insert(rel);
        Ok(attr(ino, &m))
    }

    fn new_trash(&mut self) -> PathBuf {
        self.trash_seq += 1;
        Path::new(TRASH).join(self.trash_seq.to_string())
    }

    /// Record that `[offset, offset+len)` of `ino` is about to change (and maybe the
    /// size, to `new_size`).
    fn record(
        &mut self,
        ino: u64,
        file: &File,
        offset: u64,
        len: u64,
        written: Option<u64>,
    ) -> Res<()> {
        if self.inodes.path(ino).is_none() {
            return Ok(()); // removed for good: nothing to restore
        }
        let size = file.metadata().map_err(errno)?.len();
        let old = undo::read_old(file, size, offset, len).map_err(errno)?;
        if self.undo.bytes() + old.len() as u64 > self.undo_cap {
            return Err(Errno::ENOSPC);
        }
        self.undo.push(
            ino,
            Entry {
                offset,
                old,
                old_size: size,
                written,
            },
        );
        Ok(())
    }

    fn file(&self, fh: FileHandle) -> Res<&File> {
        self.files.get(&fh.0).map(|(_, f)| f).ok_or(Errno::EBADF)
    }

    fn add_fh(&mut self, ino: u64, f: File) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.files.insert(fh, (ino, f));
        fh
    }

    fn create_file(&mut self, parent: INodeNo, name: &OsStr, mode: u32) -> Res<(FileAttr, File)> {
        let rel = self.child(parent, name)?;
        let f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode & 0o7777)
            .open(self.abs(&rel))
            .map_err(errno)?;
        self.ns
            .push(vec![parent.0], Change::Create { path: rel.clone() });
        let a = self.entry(&rel)?;
        Ok((a, f))
    }

    fn remove(&mut self, parent: INodeNo, name: &OsStr, dir: bool) -> Res<()> {
        let rel = self.child(parent, name)?;
        let abs = self.abs(&rel);
        let m = fs::symlink_metadata(&abs).map_err(errno)?;
        if dir {
            if !m.is_dir() {
                return Err(Errno::ENOTDIR);
            }
            if fs::read_dir(&abs).map_err(errno)?.next().is_some() {
                return Err(Errno::ENOTEMPTY);
            }
        } else if m.is_dir() {
            return Err(Errno::EISDIR);
        }
        let trash = self.new_trash();
        fs::rename(&abs, self.abs(&trash)).map_err(errno)?;
        let ino = self.inodes.ino_or_insert(&rel);
        self.inodes.rename(&rel, &trash);
        self.ns.push(
            vec![parent.0],
            Change::Remove {
                path: rel,
                trash,
                ino,
            },
        );
        Ok(())
    }

    fn rename(
        &mut self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Res<()> {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return Err(Errno::EINVAL);
        }
        let from = self.child(parent, name)?;
        let to = self.child(newparent, newname)?;
        let fm = fs::symlink_metadata(self.abs(&from)).map_err(errno)?;
        if from == to {
            return Ok(());
        }
        if to.starts_with(&from) {
            return Err(Errno::EINVAL);
        }
        let mut displaced = None;
        if let Ok(tm) = fs::symlink_metadata(self.abs(&to)) {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            match (fm.is_dir(), tm.is_dir()) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) => {
                    if fs::read_dir(self.abs(&to)).map_err(errno)?.next().is_some() {
                        return Err(Errno::ENOTEMPTY);
                    }
                }
                (false, false) => {}
            }
            let trash = self.new_trash();
            fs::rename(self.abs(&to), self.abs(&trash)).map_err(errno)?;
            let ino = self.inodes.ino_or_insert(&to);
            self.inodes.rename(&to, &trash);
            displaced = Some((trash, ino));
        }
        if let Err(e) = fs::rename(self.abs(&from), self.abs(&to)) {
            if let Some((trash, _)) = &displaced {
                // put the target back; the failure is what the caller sees
                let _ = fs::rename(self.abs(trash), self.abs(&to));
                self.inodes.rename(trash, &to);
            }
            return Err(errno(e));
        }
        self.inodes.rename(&from, &to);
        let dirs = if parent == newparent {
            vec![parent.0]
        } else {
            vec![parent.0, newparent.0]
        };
        self.ns.push(
            dirs,
            Change::Rename {
                from,
                to,
                displaced,
            },
        );
        Ok(())
    }

    fn fsyncdir(&mut self, ino: INodeNo) -> Res<()> {
        for op in self.ns.sync_dir(ino.0) {
            if let Some((trash, tino)) = op.released_trash() {
                let p = self.abs(trash);
                let r = match fs::symlink_metadata(&p) {
                    Ok(m) if m.is_dir() => fs::remove_dir_all(&p),
                    Ok(_) => fs::remove_file(&p),
                    Err(_) => Ok(()),
                };
                r.map_err(errno)?;
                self.undo.clear(tino);
                self.inodes.remove(trash);
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)] // the FUSE request's fields
    fn setattr(
        &mut self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Res<FileAttr> {
        let rel = self.path(ino)?;
        let abs = self.abs(&rel);
        if let Some(mode) = mode {
            fs::set_permissions(&abs, fs::Permissions::from_mode(mode & 0o7777)).map_err(errno)?;
        }
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&abs, uid, gid).map_err(errno)?;
        }
        let opened = match fh.and_then(|fh| self.files.get(&fh.0)) {
            Some((_, f)) => Some(f.try_clone().map_err(errno)?),
            None if size.is_some() => Some(open_rw(&abs).map_err(errno)?),
            None if atime.is_some() || mtime.is_some() => Some(File::open(&abs).map_err(errno)?),
            None => None,
        };
        if let (Some(size), Some(f)) = (size, &opened) {
            self.record(ino.0, f, size, u64::MAX, None)?;
            f.set_len(size).map_err(errno)?;
        }
        if atime.is_some() || mtime.is_some() {
            let t = |t: TimeOrNow| match t {
                TimeOrNow::SpecificTime(t) => t,
                TimeOrNow::Now => SystemTime::now(),
            };
            let mut times = fs::FileTimes::new();
            if let Some(a) = atime {
                times = times.set_accessed(t(a));
            }
            if let Some(m) = mtime {
                times = times.set_modified(t(m));
            }
            if let Some(f) = &opened {
                f.set_times(times).map_err(errno)?;
            }
        }
        let m = match &opened {
            Some(f) => f.metadata(),
            None => fs::symlink_metadata(&abs),
        }
        .map_err(errno)?;
        Ok(attr(ino.0, &m))
    }

    fn readdir(&mut self, ino: INodeNo, offset: u64, reply: &mut ReplyDirectory) -> Res<()> {
        let rel = self.path(ino)?;
        let mut names: Vec<(std::ffi::OsString, FileType)> = fs::read_dir(self.abs(&rel))
            .map_err(errno)?
            .filter_map(Result::ok)
            .filter(|e| !(ino.0 == ROOT && e.file_name() == TRASH))
            .map(|e| {
                let ft = e
                    .file_type()
                    .ok()
                    .and_then(FileType::from_std)
                    .unwrap_or(FileType::RegularFile);
                (e.file_name(), ft)
            })
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let parent_ino = rel
            .parent()
            .and_then(|p| self.inodes.ino(p))
            .unwrap_or(ROOT);
        let mut all = vec![
            (ino.0, FileType::Directory, std::ffi::OsString::from(".")),
            (
                parent_ino,
                FileType::Directory,
                std::ffi::OsString::from(".."),
            ),
        ];
        for (name, ft) in names {
            let i = self.inodes.ino_or_insert(&rel.join(&name));
            all.push((i, ft, name));
        }
        for (i, (e_ino, ft, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(e_ino), (i + 1) as u64, ft, &name) {
                break;
            }
        }
        Ok(())
    }

    /// Drop everything not durable (see `PowerFs::power_loss`); the caller has
    /// unmounted. Leaves the state as a fresh mount's.
    pub fn power_loss(&mut self, torn: Option<u64>) -> io::Result<LossReport> {
        self.files.clear();
        let report = self.revert_all(torn);
        // whatever happened, the next mount starts from what the backing dir holds
        self.undo.take_all();
        self.inodes = Inodes::new();
        self.ns = Pending::default();
        self.trash_seq = 0;
        report
    }

    fn revert_all(&mut self, torn: Option<u64>) -> io::Result<LossReport> {
        let logs = self.undo.take_all();
        let mut report = LossReport {
            writes_dropped: logs.values().map(Vec::len).sum(),
            files_reverted: 0,
            namespace_ops_dropped: 0,
            namespace_ops_skipped: 0,
            torn: None,
        };
        let mut inos: Vec<u64> = logs.keys().copied().collect();
        inos.sort_unstable();
        // the torn write: one file's newest change, if a write, keeps a prefix
        let mut torn_write = None;
        if let Some(seed) = torn {
            let cands: Vec<(u64, &Entry)> = inos
                .iter()
                .filter(|i| self.inodes.path(**i).is_some())
                .filter_map(|i| logs[i].last().map(|e| (*i, e)))
                .filter(|(_, e)| e.written.is_some_and(|n| n > 0))
                .collect();
            if !cands.is_empty() {
                let mut rng = Rng::new(seed);
                let (ino, e) = cands[rng.below(cands.len() as u64) as usize];
                let n = e.written.unwrap_or(0);
                let kept = if n >= 2 { 1 + rng.below(n - 1) } else { 0 };
                let rel = self
                    .inodes
                    .path(ino)
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                let mut buf = vec![0u8; kept as usize];
                File::open(self.abs(&rel))?.read_exact_at(&mut buf, e.offset)?;
                torn_write = Some((rel, e.offset, n, buf));
            }
        }
        for ino in inos {
            let Some(rel) = self.inodes.path(ino) else {
                continue;
            };
            match open_rw(&self.abs(rel)) {
                Ok(f) => {
                    undo::revert(&f, &logs[&ino])?;
                    report.files_reverted += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        if let Some((rel, offset, len, kept)) = torn_write {
            open_rw(&self.abs(&rel))?.write_all_at(&kept, offset)?;
            report.torn = Some(TornWrite {
                path: rel,
                offset,
                len,
                kept: kept.len() as u64,
            });
        }
        let r = self.ns.revert(&self.backing)?;
        report.namespace_ops_dropped = r.dropped;
        report.namespace_ops_skipped = r.skipped;
        let trash = self.backing.join(TRASH);
        fs::remove_dir_all(&trash)?;
        fs::create_dir(&trash)?;
        Ok(report)
    }

    /// Unmounted for good: the backing dir keeps the current view; the trash goes.
    pub fn discard_trash(&mut self) -> io::Result<()> {
        self.files.clear();
        fs::remove_dir_all(self.backing.join(TRASH))
    }
}

/// The FUSE side: every request locks the shared state.
#[derive(Debug)]
pub struct Fs {
    /// Shared with the `PowerFs` handle.
    pub state: Arc<Mutex<State>>,
}

impl Fs {
    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

macro_rules! reply {
    ($reply:ident, $res:expr, |$v:ident| $ok:expr) => {
        match $res {
            Ok($v) => $ok,
            Err(e) => $reply.error(e),
        }
    };
}

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.st();
        let res = st.child(parent, name).and_then(|rel| st.entry(&rel));
        reply!(reply, res, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = self.st();
        let res = match fh.and_then(|fh| st.files.get(&fh.0)) {
            Some((_, f)) => f.metadata().map_err(errno),
            None => st
                .path(ino)
                .and_then(|rel| fs::symlink_metadata(st.abs(&rel)).map_err(errno)),
        };
        reply!(reply, res, |m| reply.attr(&TTL, &attr(ino.0, &m)));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let res = self
            .st()
            .setattr(ino, mode, uid, gid, size, atime, mtime, fh);
        reply!(reply, res, |a| reply.attr(&TTL, &a));
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let res = self.st().create_file(parent, name, mode & !umask);
        reply!(reply, res, |a| reply.entry(&TTL, &a.0, Generation(0)));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut st = self.st();
        let res = st.child(parent, name).and_then(|rel| {
            fs::DirBuilder::new()
                .mode(mode & !umask & 0o7777)
                .create(st.abs(&rel))
                .map_err(errno)?;
            st.ns
                .push(vec![parent.0], Change::Create { path: rel.clone() });
            st.entry(&rel)
        });
        reply!(reply, res, |a| reply.entry(&TTL, &a, Generation(0)));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let res = self.st().remove(parent, name, false);
        reply!(reply, res, |_v| reply.ok());
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let res = self.st().remove(parent, name, true);
        reply!(reply, res, |_v| reply.ok());
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let res = self.st().rename(parent, name, newparent, newname, flags);
        reply!(reply, res, |_v| reply.ok());
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.st();
        let res = st
            .path(ino)
            .and_then(|rel| open_rw(&st.abs(&rel)).map_err(errno))
            .map(|f| st.add_fh(ino.0, f));
        reply!(reply, res, |fh| reply
            .opened(FileHandle(fh), FopenFlags::empty()));
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = self.st();
        let res = st.file(fh).and_then(|f| {
            let mut buf = vec![0u8; size as usize];
            let mut got = 0;
            while got < buf.len() {
                match f.read_at(&mut buf[got..], offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(errno(e)),
                }
            }
            buf.truncate(got);
            Ok(buf)
        });
        reply!(reply, res, |b| reply.data(&b));
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.st();
        let res = st
            .file(fh)
            .and_then(|f| f.try_clone().map_err(errno))
            .and_then(|f| {
                let n = data.len() as u64;
                st.record(ino.0, &f, offset, n, Some(n))?;
                f.write_all_at(data, offset).map_err(errno)
            });
        reply!(reply, res, |_v| reply.written(data.len() as u32));
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.st().files.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.st().undo.clear(ino.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let st = self.st();
        let res = st.path(ino).and_then(|rel| {
            if fs::metadata(st.abs(&rel)).map_err(errno)?.is_dir() {
                Ok(())
            } else {
                Err(Errno::ENOTDIR)
            }
        });
        reply!(reply, res, |_v| reply
            .opened(FileHandle(0), FopenFlags::empty()));
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let res = self.st().readdir(ino, offset, &mut reply);
        reply!(reply, res, |_v| reply.ok());
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let res = self.st().fsyncdir(ino);
        reply!(reply, res, |_v| reply.ok());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let backing = self.st().backing.clone();
        match nix::sys::statvfs::statvfs(&backing) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                s.block_size() as u32,
                s.name_max() as u32,
                s.fragment_size() as u32,
            ),
            Err(e) => reply.error(Errno::from_i32(e as i32)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        let res = self.st().path(ino);
        reply!(reply, res, |_v| reply.ok());
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.st();
        let res = st
            .create_file(parent, name, mode & !umask)
            .map(|(a, f)| (a, st.add_fh(a.ino.0, f)));
        reply!(reply, res, |v| reply.created(
            &TTL,
            &v.0,
            Generation(0),
            FileHandle(v.1),
            FopenFlags::empty()
        ));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut st = self.st();
        let res = st
            .file(fh)
            .and_then(|f| f.try_clone().map_err(errno))
            .and_then(|f| {
                st.record(ino.0, &f, offset, length, None)?;
                nix::fcntl::fallocate(
                    f.as_raw_fd(),
                    nix::fcntl::FallocateFlags::from_bits_truncate(mode),
                    offset as i64,
                    length as i64,
                )
                .map_err(|e| Errno::from_i32(e as i32))
            });
        reply!(reply, res, |_v| reply.ok());
    }
}
