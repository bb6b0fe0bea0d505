//! The storage crate's disk seam (`permitd_storage::disk`) over one node's
//! [`DiskModel`]. The model outlives the node's process: a crash keeps it, a
//! power cut rolls it back (`SimDisk::power_cut`), and the restarted node
//! opens what is left.

use std::ffi::OsString;
use std::fs::TryLockError;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use permitd_storage::disk::{Disk, DiskFile, FileKind, OpenMode};

use crate::disk_model::{normalize, CutReport, DiskFaults, DiskModel, Entry, Inode};

/// One node's simulated disk; clones share it.
#[derive(Debug, Clone)]
pub struct SimDisk(Arc<Mutex<DiskModel>>);

impl Default for SimDisk {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(DiskModel::new())))
    }
}

impl SimDisk {
    fn model(&self) -> MutexGuard<'_, DiskModel> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A power cut (the node must be down): unsynced data and names are lost;
    /// `torn` lets one newest write keep a prefix.
    pub fn power_cut(&self, torn: Option<u64>) -> CutReport {
        self.model().power_cut(torn)
    }

    pub fn faults(&self) -> DiskFaults {
        self.model().faults
    }

    pub fn set_faults(&self, faults: DiskFaults) {
        self.model().faults = faults;
    }

    /// A copy of the disk as it is now, every file and name current, with
    /// no faults: for a check that opens the node's store beside it.
    pub fn fork(&self) -> SimDisk {
        let mut model = self.model().clone();
        model.faults = DiskFaults::default();
        Self(Arc::new(Mutex::new(model)))
    }

    pub fn syncs(&self) -> u64 {
        self.model().syncs
    }

    fn create_dir_one(&self, path: &Path) -> io::Result<()> {
        let mut model = self.model();
        match model.lookup(path) {
            Some(Entry::Dir) => Ok(()),
            Some(Entry::File(_)) => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("a file: {}", path.display()),
            )),
            None => model.create_dir(path),
        }
    }
}

impl Disk for SimDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn DiskFile>> {
        let (create, exclusive) = match mode {
            OpenMode::Existing => (false, false),
            OpenMode::CreateNew => (true, true),
            OpenMode::CreateOrKeep | OpenMode::CreateOrTruncate => (true, false),
        };
        let mut model = self.model();
        let inode = model.open(path, create, exclusive)?;
        if mode == OpenMode::CreateOrTruncate {
            model.set_len(inode, 0)?;
        }
        drop(model);
        Ok(Box::new(SimFile {
            disk: self.clone(),
            inode,
        }))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let model = self.model();
        let inode = match model.lookup(path) {
            Some(Entry::File(inode)) => inode,
            Some(Entry::Dir) => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    path.display().to_string(),
                ))
            }
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    path.display().to_string(),
                ))
            }
        };
        let mut bytes = vec![0; model.len(inode)? as usize];
        let read = model.read_at(inode, &mut bytes, 0)?;
        bytes.truncate(read);
        Ok(bytes)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        Ok(self
            .model()
            .list(path)?
            .into_iter()
            .map(|(name, _)| name.into())
            .collect())
    }

    fn kind(&self, path: &Path) -> io::Result<FileKind> {
        match self.model().lookup(path) {
            Some(Entry::Dir) => Ok(FileKind::Dir),
            Some(Entry::File(_)) => Ok(FileKind::File),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                path.display().to_string(),
            )),
        }
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let path = normalize(path);
        let mut partial = PathBuf::from("/");
        for part in path.iter().skip(1) {
            partial.push(part);
            self.create_dir_one(&partial)?;
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut model = self.model();
        if let Some(Entry::File(_)) = model.lookup(to) {
            model.remove_file(to)?;
        }
        model.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.model().remove_file(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.model().sync_dir(path)
    }
}

/// An open file of a [`SimDisk`].
#[derive(Debug)]
struct SimFile {
    disk: SimDisk,
    inode: Inode,
}

impl DiskFile for SimFile {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        self.disk.model().read_at(self.inode, buffer, offset)
    }

    fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.disk.model().write_at(self.inode, bytes, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.disk.model().set_len(self.inode, len)
    }

    fn len(&self) -> io::Result<u64> {
        self.disk.model().len(self.inode)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.disk.model().sync_file(self.inode)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.disk.model().sync_file(self.inode)
    }

    /// A healthy simulated disk syncs at once (a delay of even 1 ms on every
    /// sync changed the scenario tests' commit times from ~3 ms to ~80 ms,
    /// not yet understood: docs/simulation.md); a slow one as the nemesis says.
    fn sync_delay(&self) -> std::time::Duration {
        self.disk.faults().slow_sync
    }

    /// One process per node and a crash ends it: the lock always succeeds.
    fn try_lock(&self) -> Result<(), TryLockError> {
        Ok(())
    }
}
