//! The disk seam: every file-system operation the storage crate makes, as a
//! trait, so that a deterministic simulator can run the store on a disk of its
//! own (in memory, with crashes that drop what was not synced).
//!
//! [`OsDisk`] is the production disk: `std::fs`, the same syscalls the store
//! made before the seam existed. The set of operations is exactly what the
//! store needs; a simulated disk implements only these.
//!
//! # Crash semantics
//!
//! Each method's documentation says what is durable once it returns, i.e.
//! what survives a power cut (a crash of the process alone loses nothing the
//! kernel accepted). In short, as on Linux:
//! - a file's bytes and size are durable only after [`DiskFile::sync_data`]
//!   or [`DiskFile::sync_all`] of it;
//! - a directory entry (a file or directory created, renamed or removed in
//!   it) is durable only after [`Disk::sync_dir`] of that directory;
//! - nothing else is ever durable on its own.
//!
//! A simulated disk must keep every promise below and may break everything
//! else at a crash: the store is written to need nothing more.

mod os;
pub(crate) mod stream;

use std::ffi::OsString;
use std::fmt::Debug;
use std::fs::TryLockError;
use std::io;
use std::path::Path;

pub use os::OsDisk;

/// How [`Disk::open`] opens a file: the four ways the store opens one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read and write a file that exists (a segment at recovery).
    Existing,
    /// Read and write a new file; fails with `AlreadyExists` if the name is
    /// taken (a new segment: never overwrite one).
    CreateNew,
    /// Write a file, created if missing and left as it is if present (the
    /// lock file).
    CreateOrKeep,
    /// Write a file, created if missing and emptied if present (the format
    /// marker, a snapshot's temporary file).
    CreateOrTruncate,
}

/// What a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Dir,
    /// Anything else: a file (or a device, a socket; the store treats them
    /// alike, as "not a directory").
    File,
}

/// A file system, as the storage crate uses it. Paths are whatever the store
/// was given (absolute or relative to the working directory).
pub trait Disk: Send + Sync + Debug + 'static {
    /// Opens `path` as `mode` says. A file this creates is named in its
    /// directory at once for every reader, but its directory entry is durable
    /// only after [`Disk::sync_dir`] of its parent; a crash before that may
    /// lose the file whatever was synced into it.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn DiskFile>>;

    /// The whole content of the file at `path` (as the page cache holds it,
    /// synced or not). Changes nothing.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;

    /// The names of the entries of directory `path` (not `.` or `..`), in no
    /// particular order. Changes nothing.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>>;

    /// What `path` names; `NotFound` if nothing. Changes nothing.
    fn kind(&self, path: &Path) -> io::Result<FileKind>;

    /// Creates directory `path` and every missing ancestor; an existing
    /// directory is fine. No new entry is durable until [`Disk::sync_dir`] of
    /// the directory that names it (see `fsync::durable_create_dir_all_on`).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Renames `from` to `to`, replacing a file `to` atomically: a crash
    /// leaves one of the two names' states, never neither. Durable only after
    /// [`Disk::sync_dir`] of the directories of both (the store renames
    /// within one directory).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes the file at `path`. Durable only after [`Disk::sync_dir`] of
    /// its directory: before that, a crash may bring the file back (with its
    /// synced content).
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Makes directory `path`'s entries durable (`fsync` of the directory):
    /// every file or directory created, renamed or removed in it before this
    /// call is on disk as the directory now names it when this returns. Says
    /// nothing of the files' content.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
}

/// An open file. Every operation is positioned: the store shares one handle
/// between the writer, readers and the group commit, with no cursor.
pub trait DiskFile: Send + Sync + Debug {
    /// Reads into `buffer` at `offset`; returns how many bytes were read
    /// (fewer than asked only at the end of the file, 0 past it). Sees every
    /// write made through any handle, synced or not.
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Reads exactly `buffer.len()` bytes at `offset`; `UnexpectedEof` if the
    /// file ends first.
    fn read_exact_at(&self, mut buffer: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buffer.is_empty() {
            match self.read_at(buffer, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(read) => {
                    buffer = &mut buffer[read..];
                    offset += read as u64;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Writes all of `bytes` at `offset`, growing the file if they reach past
    /// its end (a gap reads as zeros). Into the page cache only: a crash
    /// before [`DiskFile::sync_data`] may lose any part of it, in any order
    /// (a torn write), and the size it gave the file.
    fn write_all_at(&self, bytes: &[u8], offset: u64) -> io::Result<()>;

    /// Cuts or extends (with zeros) the file to `len` bytes. Like a write:
    /// durable only after [`DiskFile::sync_data`].
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// The file's length now (synced or not).
    fn len(&self) -> io::Result<u64>;

    /// Whether the file is empty now ([`DiskFile::len`] is 0).
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// `fdatasync`: every byte written and the size set before this call are
    /// durable when it returns (not the directory entry: [`Disk::sync_dir`]).
    /// An error leaves the file in a state nobody knows: the caller must not
    /// retry and believe it (the write-ahead log refuses all later writes).
    fn sync_data(&self) -> io::Result<()>;

    /// `fsync`: as [`DiskFile::sync_data`], plus the file's other metadata.
    fn sync_all(&self) -> io::Result<()>;

    /// How long a sync of this file takes in the simulator's time, which the
    /// log's inline group commit (`Exec::Inline`) waits out before syncing. A
    /// real disk's syncs take real time on a thread and say zero.
    fn sync_delay(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// Takes the advisory, exclusive lock on the file without waiting
    /// (`flock`): `WouldBlock` if another handle holds it. It is held until
    /// this handle is dropped, and goes with the process (a crash leaves no
    /// stale lock). Nothing durable.
    fn try_lock(&self) -> Result<(), TryLockError>;
}
