//! A disk in memory with Linux's crash rules, for the seam's tests: a crash
//! keeps of every file only what `sync_data`/`sync_all` made durable, and of
//! every directory only the entries its last `sync_dir` saw (a directory
//! whose own entry was never synced goes with everything under it). Handles
//! opened before a crash are dead after it (the process that held them is
//! gone), and so are their locks.
//!
//! It also records the thread of every call, and can fail `sync_data` with
//! EIO.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs::TryLockError;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use permitd_storage::disk::{FileKind, OpenMode};
use permitd_storage::{Disk, DiskFile};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    File(u64),
    Dir,
}

#[derive(Debug, Default)]
struct Dir {
    entries: BTreeMap<OsString, Entry>,
    /// The entries as of the last `sync_dir`.
    synced: BTreeMap<OsString, Entry>,
}

#[derive(Debug, Default)]
struct Inode {
    data: Vec<u8>,
    /// The content as of the last `sync_data`/`sync_all`.
    synced: Vec<u8>,
    /// The handle holding its lock.
    lock_owner: Option<u64>,
}

#[derive(Debug)]
struct State {
    /// Bumped by every crash: handles of an older epoch are dead.
    epoch: u64,
    next_id: u64,
    /// Every directory by its path; "/" always exists.
    dirs: HashMap<PathBuf, Dir>,
    inodes: HashMap<u64, Inode>,
    threads: HashSet<ThreadId>,
    fail_sync_data: bool,
    sync_data_calls: u64,
}

/// The disk; clones share it.
#[derive(Debug, Clone)]
pub struct FakeDisk {
    state: Arc<Mutex<State>>,
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}", path.display()))
}

fn parent_and_name(path: &Path) -> io::Result<(PathBuf, OsString)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((parent.to_owned(), name.to_owned())),
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "no parent")),
    }
}

impl State {
    fn dir(&mut self, path: &Path) -> io::Result<&mut Dir> {
        self.dirs.get_mut(path).ok_or_else(|| not_found(path))
    }

    fn entry(&mut self, path: &Path) -> io::Result<Entry> {
        if path == Path::new("/") {
            return Ok(Entry::Dir);
        }
        let (parent, name) = parent_and_name(path)?;
        self.dir(&parent)?
            .entries
            .get(&name)
            .copied()
            .ok_or_else(|| not_found(path))
    }

    fn file(&mut self, path: &Path) -> io::Result<u64> {
        match self.entry(path)? {
            Entry::File(inode) => Ok(inode),
            Entry::Dir => Err(io::Error::new(io::ErrorKind::IsADirectory, "a dir")),
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

impl FakeDisk {
    pub fn new() -> Arc<Self> {
        let mut dirs = HashMap::new();
        dirs.insert(PathBuf::from("/"), Dir::default());
        Arc::new(Self {
            state: Arc::new(Mutex::new(State {
                epoch: 0,
                next_id: 0,
                dirs,
                inodes: HashMap::new(),
                threads: HashSet::new(),
                fail_sync_data: false,
                sync_data_calls: 0,
            })),
        })
    }

    /// Locks the state and notes the calling thread.
    fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap();
        state.threads.insert(std::thread::current().id());
        state
    }

    /// A power cut: drops every unsynced byte, size and directory entry.
    pub fn crash(&self) {
        let mut state = self.lock();
        state.epoch += 1;
        for dir in state.dirs.values_mut() {
            dir.entries = dir.synced.clone();
        }
        // Shallowest first: a directory whose entry is gone takes its
        // subtree along.
        let mut paths: Vec<PathBuf> = state.dirs.keys().cloned().collect();
        paths.sort_by_key(|path| path.components().count());
        for path in paths {
            let Some((parent, name)) = parent_and_name(&path).ok() else {
                continue;
            };
            let named = state
                .dirs
                .get(&parent)
                .is_some_and(|dir| dir.entries.get(&name) == Some(&Entry::Dir));
            if !named {
                state.dirs.remove(&path);
            }
        }
        for inode in state.inodes.values_mut() {
            inode.data = inode.synced.clone();
            inode.lock_owner = None;
        }
    }

    /// Makes every later `sync_data` fail with EIO (or not).
    pub fn fail_sync_data(&self, fail: bool) {
        self.lock().fail_sync_data = fail;
    }

    pub fn sync_data_calls(&self) -> u64 {
        self.lock().sync_data_calls
    }

    /// The threads that called the disk or one of its files.
    pub fn threads(&self) -> HashSet<ThreadId> {
        self.state.lock().unwrap().threads.clone()
    }
}

impl Disk for FakeDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn DiskFile>> {
        let mut state = self.lock();
        let (parent, name) = parent_and_name(path)?;
        let existing = state.dir(&parent)?.entries.get(&name).copied();
        let inode = match (existing, mode) {
            (Some(Entry::Dir), _) => {
                return Err(io::Error::new(io::ErrorKind::IsADirectory, "a dir"))
            }
            (Some(Entry::File(_)), OpenMode::CreateNew) => {
                return Err(io::ErrorKind::AlreadyExists.into())
            }
            (None, OpenMode::Existing) => return Err(not_found(path)),
            (Some(Entry::File(inode)), OpenMode::CreateOrTruncate) => {
                state.inodes.get_mut(&inode).expect("inode").data.clear();
                inode
            }
            (Some(Entry::File(inode)), _) => inode,
            (None, _) => {
                let inode = state.id();
                state.inodes.insert(inode, Inode::default());
                state.dir(&parent)?.entries.insert(name, Entry::File(inode));
                inode
            }
        };
        let handle = state.id();
        Ok(Box::new(FakeFile {
            disk: self.clone(),
            inode,
            handle,
            epoch: state.epoch,
            readable: matches!(mode, OpenMode::Existing | OpenMode::CreateNew),
        }))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut state = self.lock();
        let inode = state.file(path)?;
        Ok(state.inodes[&inode].data.clone())
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        Ok(self.lock().dir(path)?.entries.keys().cloned().collect())
    }

    fn kind(&self, path: &Path) -> io::Result<FileKind> {
        Ok(match self.lock().entry(path)? {
            Entry::Dir => FileKind::Dir,
            Entry::File(_) => FileKind::File,
        })
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let ancestors: Vec<&Path> = path.ancestors().collect();
        for dir in ancestors.into_iter().rev().skip(1) {
            let (parent, name) = parent_and_name(dir)?;
            match state.dir(&parent)?.entries.get(&name) {
                Some(Entry::Dir) => {}
                Some(Entry::File(_)) => return Err(io::ErrorKind::AlreadyExists.into()),
                None => {
                    state.dir(&parent)?.entries.insert(name, Entry::Dir);
                    state.dirs.insert(dir.to_owned(), Dir::default());
                }
            }
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let inode = state.file(from)?;
        let (from_parent, from_name) = parent_and_name(from)?;
        let (to_parent, to_name) = parent_and_name(to)?;
        state.dir(&to_parent)?;
        state.dir(&from_parent)?.entries.remove(&from_name);
        state
            .dir(&to_parent)?
            .entries
            .insert(to_name, Entry::File(inode));
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.file(path)?;
        let (parent, name) = parent_and_name(path)?;
        state.dir(&parent)?.entries.remove(&name);
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let dir = state.dir(path)?;
        dir.synced = dir.entries.clone();
        Ok(())
    }
}

/// An open file of [`FakeDisk`].
#[derive(Debug)]
struct FakeFile {
    disk: FakeDisk,
    inode: u64,
    handle: u64,
    epoch: u64,
    readable: bool,
}

impl FakeFile {
    /// The state, unless this handle died in a crash.
    fn lock(&self) -> io::Result<MutexGuard<'_, State>> {
        let state = self.disk.lock();
        if state.epoch != self.epoch {
            return Err(io::Error::other("the disk crashed under this handle"));
        }
        Ok(state)
    }

    fn with_inode<T>(&self, f: impl FnOnce(&mut Inode) -> T) -> io::Result<T> {
        let mut state = self.lock()?;
        Ok(f(state.inodes.get_mut(&self.inode).expect("inode")))
    }
}

impl DiskFile for FakeFile {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        if !self.readable {
            return Err(io::Error::from_raw_os_error(9)); // EBADF, as a write-only fd
        }
        self.with_inode(|inode| {
            let start = (offset as usize).min(inode.data.len());
            let read = buffer.len().min(inode.data.len() - start);
            buffer[..read].copy_from_slice(&inode.data[start..start + read]);
            read
        })
    }

    fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.with_inode(|inode| {
            let end = offset as usize + bytes.len();
            if inode.data.len() < end {
                inode.data.resize(end, 0);
            }
            inode.data[offset as usize..end].copy_from_slice(bytes);
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with_inode(|inode| inode.data.resize(len as usize, 0))
    }

    fn len(&self) -> io::Result<u64> {
        self.with_inode(|inode| inode.data.len() as u64)
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.lock()?;
        state.sync_data_calls += 1;
        if state.fail_sync_data {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        let inode = state.inodes.get_mut(&self.inode).expect("inode");
        inode.synced = inode.data.clone();
        Ok(())
    }

    fn sync_all(&self) -> io::Result<()> {
        self.with_inode(|inode| inode.synced = inode.data.clone())
    }

    fn try_lock(&self) -> Result<(), TryLockError> {
        let handle = self.handle;
        self.with_inode(|inode| match inode.lock_owner {
            Some(owner) if owner != handle => Err(TryLockError::WouldBlock),
            _ => {
                inode.lock_owner = Some(handle);
                Ok(())
            }
        })
        .map_err(TryLockError::Error)?
    }
}

impl Drop for FakeFile {
    fn drop(&mut self) {
        let handle = self.handle;
        // A dead handle's lock went with the crash.
        let _ = self.with_inode(|inode| {
            if inode.lock_owner == Some(handle) {
                inode.lock_owner = None;
            }
        });
    }
}
