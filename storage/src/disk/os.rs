//! The production disk: `std::fs`, one syscall per operation, as the store
//! made them before the seam (`pwrite`/`pread` on the file, `fdatasync` by
//! `File::sync_data`, a directory's `fsync` by opening it and `File::sync_all`,
//! `flock` by `File::try_lock`).

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{Disk, DiskFile, FileKind, OpenMode};

/// The operating system's file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsDisk;

/// A file of [`OsDisk`]: a `std::fs::File`.
#[derive(Debug)]
struct OsFile(File);

impl Disk for OsDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn DiskFile>> {
        let mut options = OpenOptions::new();
        match mode {
            OpenMode::Existing => options.read(true).write(true),
            OpenMode::CreateNew => options.read(true).write(true).create_new(true),
            OpenMode::CreateOrKeep => options.write(true).create(true).truncate(false),
            OpenMode::CreateOrTruncate => options.write(true).create(true).truncate(true),
        };
        Ok(Box::new(OsFile(options.open(path)?)))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        fs::read_dir(path)?
            .map(|entry| entry.map(|entry| entry.file_name()))
            .collect()
    }

    fn kind(&self, path: &Path) -> io::Result<FileKind> {
        let metadata = fs::metadata(path)?;
        Ok(if metadata.is_dir() {
            FileKind::Dir
        } else {
            FileKind::File
        })
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
}

impl DiskFile for OsFile {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        self.0.read_at(buffer, offset)
    }

    fn read_exact_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buffer, offset)
    }

    fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(bytes, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn try_lock(&self) -> Result<(), TryLockError> {
        self.0.try_lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_open_as_each_mode_says() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let disk = OsDisk;
        assert!(disk.open(&path, OpenMode::Existing).is_err());
        let file = disk.open(&path, OpenMode::CreateNew).unwrap();
        file.write_all_at(b"hello", 0).unwrap();
        file.sync_data().unwrap();
        let error = disk.open(&path, OpenMode::CreateNew).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AlreadyExists);
        drop(disk.open(&path, OpenMode::CreateOrKeep).unwrap());
        assert_eq!(disk.read(&path).unwrap(), b"hello");
        let mut read = [0u8; 3];
        file.read_exact_at(&mut read, 2).unwrap();
        assert_eq!(&read, b"llo");
        assert!(file.read_exact_at(&mut read, 4).is_err());
        drop(disk.open(&path, OpenMode::CreateOrTruncate).unwrap());
        assert!(file.is_empty().unwrap());
        assert_eq!(disk.kind(dir.path()).unwrap(), FileKind::Dir);
        assert_eq!(disk.kind(&path).unwrap(), FileKind::File);
        assert_eq!(
            disk.read_dir(dir.path()).unwrap(),
            vec![OsString::from("f")]
        );
        disk.sync_dir(dir.path()).unwrap();
    }

    #[test]
    fn a_second_lock_on_one_file_would_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let first = OsDisk.open(&path, OpenMode::CreateOrKeep).unwrap();
        first.try_lock().unwrap();
        let second = OsDisk.open(&path, OpenMode::CreateOrKeep).unwrap();
        assert!(matches!(second.try_lock(), Err(TryLockError::WouldBlock)));
        drop(first);
        second.try_lock().unwrap();
    }
}
