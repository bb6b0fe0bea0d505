//! One segment file of the write-ahead log: its name, creation, and the
//! positioned reads and writes on it.
//!
//! Segments are named by a sequence number, zero-padded to 20 digits
//! (`00000000000000000001.wal`), so that a lexical listing is the numeric order.
//! One open file handle per segment serves the writer (`pwrite`, only on the
//! active segment), every reader (`pread`) and the group commit (`fdatasync`):
//! positioned IO needs no shared cursor, so they never wait on each other.
//! Files are opened through the store's [`Disk`].

use std::io;
use std::path::{Path, PathBuf};

use crate::disk::{Disk, DiskFile, OpenMode};
use crate::StorageError;

/// The file name suffix of a segment.
const SEGMENT_SUFFIX: &str = ".wal";
/// Digits of the zero-padded sequence number (u64::MAX has 20).
const SEQUENCE_DIGITS: usize = 20;

/// An open segment file.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Its sequence number: segments are replayed in this order.
    pub(crate) sequence: u64,
    pub(crate) path: PathBuf,
    /// Opened for reading and writing; shared by the writer, readers and the
    /// group commit through `Arc<Segment>`.
    file: Box<dyn DiskFile>,
}

/// The file name of segment `sequence`.
pub(crate) fn file_name(sequence: u64) -> String {
    format!("{sequence:0SEQUENCE_DIGITS$}{SEGMENT_SUFFIX}")
}

/// The sequence number a segment file name encodes; `None` for other names.
fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != SEQUENCE_DIGITS || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub(crate) fn io_error(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(io::Error) -> StorageError {
    let path = path.to_owned();
    move |source| StorageError::WalIo {
        action,
        path,
        source,
    }
}

/// The segments in `dir`, by sequence number. Files with other names are
/// left alone (and logged).
pub(crate) fn list(disk: &dyn Disk, dir: &Path) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    let mut segments = Vec::new();
    for name in disk.read_dir(dir).map_err(io_error("list", dir))? {
        let path = dir.join(&name);
        match name.to_str().and_then(parse_file_name) {
            Some(sequence) => segments.push((sequence, path)),
            None => tracing::warn!(
                file = %path.display(),
                "not a write-ahead log segment: ignored"
            ),
        }
    }
    segments.sort_unstable_by_key(|(sequence, _)| *sequence);
    Ok(segments)
}

impl Segment {
    /// Creates segment `sequence` in `dir`; it must not exist. The caller
    /// fsyncs `dir` before anything written to it is acknowledged.
    pub(crate) fn create(disk: &dyn Disk, dir: &Path, sequence: u64) -> Result<Self, StorageError> {
        let path = dir.join(file_name(sequence));
        let file = disk
            .open(&path, OpenMode::CreateNew)
            .map_err(io_error("create", &path))?;
        Ok(Self {
            sequence,
            path,
            file,
        })
    }

    /// Opens an existing segment.
    pub(crate) fn open(disk: &dyn Disk, path: &Path, sequence: u64) -> Result<Self, StorageError> {
        let file = disk
            .open(path, OpenMode::Existing)
            .map_err(io_error("open", path))?;
        Ok(Self {
            sequence,
            path: path.to_owned(),
            file,
        })
    }

    /// The file, for sequential reading at recovery.
    pub(crate) fn file(&self) -> &dyn DiskFile {
        &*self.file
    }

    /// Writes all of `bytes` at `offset` (into the page cache: not durable).
    pub(crate) fn write_at(&self, bytes: &[u8], offset: u64) -> Result<(), StorageError> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(io_error("write", &self.path))
    }

    /// Reads exactly `buffer.len()` bytes at `offset`.
    pub(crate) fn read_at(&self, buffer: &mut [u8], offset: u64) -> Result<(), StorageError> {
        self.file
            .read_exact_at(buffer, offset)
            .map_err(io_error("read", &self.path))
    }

    /// fdatasync: the data written so far, and the file's size, are on disk.
    pub(crate) fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// How long its sync takes in simulated time ([`DiskFile::sync_delay`]).
    pub(crate) fn sync_delay(&self) -> std::time::Duration {
        self.file.sync_delay()
    }

    /// Cuts the file at `len` bytes, in the page cache: the next `fdatasync`
    /// of the segment makes the new size durable.
    pub(crate) fn cut_unsynced(&self, len: u64) -> Result<(), StorageError> {
        self.file
            .set_len(len)
            .map_err(io_error("truncate", &self.path))
    }

    /// Cuts the file at `len` bytes and makes the cut durable.
    pub(crate) fn truncate(&self, len: u64) -> Result<(), StorageError> {
        self.file
            .set_len(len)
            .and_then(|()| self.file.sync_all())
            .map_err(io_error("truncate", &self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::OsDisk;

    #[test]
    fn names_sort_numerically_and_parse_back() {
        assert_eq!(file_name(1), "00000000000000000001.wal");
        assert!(file_name(9) < file_name(10));
        assert_eq!(parse_file_name(&file_name(u64::MAX)), Some(u64::MAX));
        assert_eq!(parse_file_name("1.wal"), None);
        assert_eq!(parse_file_name("0000000000000000000x.wal"), None);
        assert_eq!(parse_file_name("00000000000000000001.tmp"), None);
    }

    #[test]
    fn listing_orders_segments_and_skips_other_files() {
        let dir = tempfile::tempdir().unwrap();
        for sequence in [10, 2, 1] {
            Segment::create(&OsDisk, dir.path(), sequence).unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
        let sequences: Vec<u64> = list(&OsDisk, dir.path())
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(sequences, vec![1, 2, 10]);
        assert!(
            Segment::create(&OsDisk, dir.path(), 2).is_err(),
            "create must not reuse a file"
        );
    }
}
