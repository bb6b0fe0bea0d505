//! The queue's journal: one file of checksummed records, made durable with
//! `fdatasync`, compacted by writing a new file and renaming it over the old.
//!
//! A queue dir holds:
//! - `journal`: [`MAGIC`], then records; the first is the header (the store's
//!   client id), each later one a step's changes ([`super::store`]);
//! - `journal.new`: a compaction not yet renamed over `journal` (a leftover
//!   one, from a crash before its rename, is ignored and replaced);
//! - `lock`: locked while a handle has the dir open, so a second process is
//!   refused instead of interleaving its records.
//!
//! A record is framed as
//! ```text
//! +-------------+-------------------------------+--------------------+
//! | len: u32 LE | crc32(len, payload): u32 LE   | payload: len bytes |
//! +-------------+-------------------------------+--------------------+
//! ```
//! A payload is never empty, so a zero-filled region (a file extended but
//! never written, after a crash) cannot pass as a record: `len` 0 is damage
//! (the CRC of nothing is 0). The CRC covers `len`, so a flipped length fails.
//!
//! Durability, in the order a crash could cut it:
//! - [`Journal::append`] writes a record after the last (page cache only); a
//!   sync ([`Journal::sync_target`]) makes every append so far durable with
//!   one `fdatasync`. A step counts once its sync returned.
//! - The file is kept [`ZERO_AHEAD_BYTES`] of zeros past its records, written
//!   (not a hole), as the WAL's active segment is: a sync after a write that
//!   grows the file must also write its inode (its size), which the zeros
//!   ahead spare all but one sync per MiB (a step's write and sync, p50 on
//!   this VM's ext4: 150–188 → 125–131 µs; docs/architecture.md). Zeros are
//!   never a record (a record's `len` is never 0), and open cuts them with
//!   any torn tail.
//! - Replay reads records up to the first that is short, empty or fails its
//!   CRC and cuts the file there: a sync covers everything written before it,
//!   so no record after a damaged one was ever synced, and a torn last append
//!   is dropped whole. One record per step makes a step's changes atomic.
//! - A new journal, and each compaction, is written in full to `journal.new`,
//!   fsynced, renamed over `journal`, and the dir fsynced: `journal` is always
//!   the old file or the complete new one. Creating the dir fsyncs its parent.
//!
//! Why not sled (the store before this one): sled 0.34's `flush` ends in
//! `sync_file_range`, never an fsync, so a flushed write can be lost to a power
//! cut (`powerfs/tests/sled_flush.rs` shows one lost); see docs/architecture.md.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::QueueError;

/// The first bytes of a journal file: the format's name and version.
pub const MAGIC: &[u8; 8] = b"PQJRNL\x00\x01";
/// Bytes of a record's frame before its payload: `len` and `crc32`.
const FRAME_BYTES: usize = 8;
/// Largest record payload, in bytes: a compaction writes the whole queue as
/// one record, and a corrupt length must never make replay allocate 4 GiB.
pub const MAX_RECORD_BYTES: usize = 1 << 30;
/// A journal is compacted only once it is at least this long, in bytes.
pub const COMPACT_MIN_BYTES: u64 = 4 << 20;
/// ... and this many times as long as it was after the last compaction, so a
/// compaction's cost (a write of the live records) is spread over the
/// appends that made it due.
pub const COMPACT_GROWTH: u64 = 4;
/// Zeros written past the records whenever they reach the file's end, so that
/// most syncs write data only (see the module doc).
pub const ZERO_AHEAD_BYTES: u64 = 1 << 20;
/// How long [`Journal::open`] waits for a dir another handle still locks (a
/// queue restarted in place, while its old loop task is still being dropped).
const LOCK_WAIT: Duration = Duration::from_secs(2);

const JOURNAL: &str = "journal";
const COMPACTING: &str = "journal.new";
const LOCK: &str = "lock";

/// An open journal, appended to by one store.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    /// The file appended to: `journal`, or `journal.new` while `renaming`.
    /// Shared so that [`Journal::sync_target`] can sync it without the lock.
    file: Arc<File>,
    /// Bumped when `file` is replaced by a compaction.
    generation: u64,
    /// Bytes of records in `file`: where the next one goes.
    len: u64,
    /// Bytes of `file`: its records and the zeros written ahead of them.
    filled_len: u64,
    /// Bytes of `file` known durable.
    synced_len: u64,
    /// `file`'s length right after the last compaction (0 when none ran since
    /// open, so the first write after opening a long journal compacts it).
    compacted_len: u64,
    /// `file` is `journal.new`, to be renamed over `journal` by the next sync.
    renaming: bool,
    /// Holds the dir's lock while open.
    _lock: File,
}

/// What a sync must cover, taken under the journal's lock.
#[derive(Debug)]
pub struct SyncTarget {
    file: Arc<File>,
    generation: u64,
    len: u64,
}

impl Journal {
    /// Opens the journal in `dir`, creating the dir and a journal holding
    /// `header` if there is none. Returns it and its records' payloads, the
    /// header first; a torn or damaged tail is cut off.
    pub fn open(dir: &Path, header: &[u8]) -> Result<(Self, Vec<Vec<u8>>), QueueError> {
        create_dir_durably(dir)?;
        let lock = lock_dir(dir)?;
        let path = dir.join(JOURNAL);
        if !path.exists() {
            write_whole_file(dir, &[header])?;
        }
        let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (payloads, valid_len) = read_records(&bytes).map_err(|reason| QueueError::Corrupt {
            path: path.clone(),
            reason,
        })?;
        // Cut whatever follows the records (zeros written ahead, or a torn
        // record), so that no old bytes lie past the records written next.
        if valid_len < bytes.len() {
            log_cut_tail(&path, &bytes[valid_len..]);
            file.set_len(valid_len as u64)?;
            file.sync_data()?;
        }
        let journal = Journal {
            dir: dir.to_path_buf(),
            file: Arc::new(file),
            generation: 0,
            len: valid_len as u64,
            filled_len: valid_len as u64,
            synced_len: valid_len as u64,
            compacted_len: 0,
            renaming: false,
            _lock: lock,
        };
        Ok((journal, payloads))
    }

    /// Whether the next write should be a compaction instead of an append.
    pub fn compaction_due(&self) -> bool {
        self.len >= COMPACT_MIN_BYTES && self.len >= COMPACT_GROWTH * self.compacted_len
    }

    /// Appends one record (not durable until the next sync).
    pub fn append(&mut self, payload: &[u8]) -> Result<(), QueueError> {
        let record = frame(payload)?;
        let end = self.len + record.len() as u64;
        if end > self.filled_len {
            let filled_to = end + ZERO_AHEAD_BYTES;
            let zeros = vec![0; (filled_to - self.filled_len) as usize];
            self.file.write_all_at(&zeros, self.filled_len)?;
            self.filled_len = filled_to;
        }
        self.file.write_all_at(&record, self.len)?;
        self.len = end;
        Ok(())
    }

    /// Writes `journal.new` with `records` (the header, then every live
    /// record) and appends to it from now on; the next sync `fdatasync`s it
    /// and renames it over `journal`. Until then `journal` still holds the
    /// old records.
    pub fn compact(&mut self, records: &[&[u8]]) -> Result<(), QueueError> {
        let (file, len) = create_with_records(&self.dir.join(COMPACTING), records)?;
        self.file = Arc::new(file);
        self.generation += 1;
        self.len = len;
        self.filled_len = len;
        self.synced_len = 0;
        self.compacted_len = len;
        self.renaming = true;
        Ok(())
    }

    /// Compactions written since open.
    pub fn compactions(&self) -> u64 {
        self.generation
    }

    /// What a sync must cover now, or `None` when everything is durable.
    pub fn sync_target(&self) -> Option<SyncTarget> {
        (self.renaming || self.synced_len < self.len).then(|| SyncTarget {
            file: self.file.clone(),
            generation: self.generation,
            len: self.len,
        })
    }

    /// Records that `target` was synced: renames a compaction into place
    /// (durably) when `target` was its file.
    pub fn synced(&mut self, target: &SyncTarget) -> Result<(), QueueError> {
        if target.generation != self.generation {
            return Ok(());
        }
        if self.renaming {
            std::fs::rename(self.dir.join(COMPACTING), self.dir.join(JOURNAL))?;
            fsync_dir(&self.dir)?;
            self.renaming = false;
        }
        self.synced_len = self.synced_len.max(target.len);
        Ok(())
    }
}

impl SyncTarget {
    /// The `fdatasync` itself, run without the journal's lock so that appends
    /// are not held behind it.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Logs what [`Journal::open`] cuts after the records: zeros written ahead
/// (usual), or a record torn by a crash.
fn log_cut_tail(path: &Path, tail: &[u8]) {
    let path = path.display();
    if tail.iter().all(|byte| *byte == 0) {
        tracing::debug!(%path, bytes = tail.len(), "cutting the zeros ahead of the queue journal's records");
    } else {
        tracing::warn!(
            %path,
            dropped_bytes = tail.len(),
            "the queue journal ends in a torn record (a write cut by a crash); cutting it off"
        );
    }
}

/// Frames `payload` as a record.
fn frame(payload: &[u8]) -> Result<Vec<u8>, QueueError> {
    if payload.len() > MAX_RECORD_BYTES {
        return Err(QueueError::RecordTooLarge {
            bytes: payload.len(),
            max: MAX_RECORD_BYTES,
        });
    }
    assert!(!payload.is_empty(), "a journal record is never empty");
    let len = (payload.len() as u32).to_le_bytes();
    let mut record = Vec::with_capacity(FRAME_BYTES + payload.len());
    record.extend_from_slice(&len);
    record.extend_from_slice(&checksum(len, payload).to_le_bytes());
    record.extend_from_slice(payload);
    Ok(record)
}

/// The CRC32 of a record's length and payload.
fn checksum(len: [u8; 4], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&len);
    hasher.update(payload);
    hasher.finalize()
}

/// The payloads of `bytes` (a whole journal file) up to the first record that
/// is short or fails its CRC, and where that valid part ends. A file without
/// [`MAGIC`] or without a whole header record is not a journal.
fn read_records(bytes: &[u8]) -> Result<(Vec<Vec<u8>>, usize), String> {
    let Some(mut rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return Err("it does not start like a queue journal".into());
    };
    let mut payloads = Vec::new();
    while let Some((payload, after)) = next_record(rest) {
        payloads.push(payload.to_vec());
        rest = after;
    }
    if payloads.is_empty() {
        return Err("its header record is missing or damaged".into());
    }
    Ok((payloads, bytes.len() - rest.len()))
}

/// The record at the start of `bytes` and what follows it, if it is whole.
fn next_record(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let len_bytes: [u8; 4] = bytes.get(0..4)?.try_into().ok()?;
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    let len = u32::from_le_bytes(len_bytes) as usize;
    if len == 0 || len > MAX_RECORD_BYTES {
        return None;
    }
    let payload = bytes.get(FRAME_BYTES..FRAME_BYTES + len)?;
    (checksum(len_bytes, payload) == crc).then(|| (payload, &bytes[FRAME_BYTES + len..]))
}

/// Creates (or replaces) `path` and writes [`MAGIC`] and `records` to it, not
/// synced (a compaction's is synced by the next flush, outside the queue's
/// locks). Returns the file, open for appending, and its length.
fn create_with_records(path: &Path, records: &[&[u8]]) -> Result<(File, u64), QueueError> {
    let mut bytes = MAGIC.to_vec();
    for record in records {
        bytes.extend_from_slice(&frame(record)?);
    }
    // A leftover (an unfinished compaction) is replaced.
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error.into()),
        _ => {}
    }
    let mut file = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(path)?;
    file.write_all(&bytes)?;
    Ok((file, bytes.len() as u64))
}

/// Writes a whole new `journal` in `dir` durably: to `journal.new`, fsynced,
/// renamed over `journal`, dir fsynced.
fn write_whole_file(dir: &Path, records: &[&[u8]]) -> Result<(), QueueError> {
    create_with_records(&dir.join(COMPACTING), records)?
        .0
        .sync_all()?;
    std::fs::rename(dir.join(COMPACTING), dir.join(JOURNAL))?;
    fsync_dir(dir)?;
    Ok(())
}

/// Locks `dir/lock`, waiting up to [`LOCK_WAIT`] while another handle holds it.
fn lock_dir(dir: &Path) -> Result<File, QueueError> {
    let path = dir.join(LOCK);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(QueueError::Locked {
                    path: dir.to_path_buf(),
                })
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(error.into()),
        }
    }
}

/// Fsyncs the directory `path`: the entries created, renamed or removed in it
/// are on disk when this returns.
pub fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// `create_dir_all`, durably: each directory it creates is fsynced into its
/// parent, from the top down. A relative path's first parent is the current
/// directory (`Path::parent` calls it ""), which is fsynced too.
fn create_dir_durably(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = parent_dir(dir);
    create_dir_durably(parent)?;
    match std::fs::create_dir(dir) {
        Err(error) if error.kind() != io::ErrorKind::AlreadyExists => return Err(error),
        _ => {}
    }
    fsync_dir(parent)
}

/// The directory that names `dir`: "." for a relative path of one part.
pub fn parent_dir(dir: &Path) -> &Path {
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new journal (header `head`) in a temp dir, and its dir's path.
    fn opened() -> (tempfile::TempDir, PathBuf, Journal) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q");
        let (journal, _) = Journal::open(&path, b"head").unwrap();
        (dir, path, journal)
    }

    /// What a flush does: sync what is due, record it.
    fn sync(journal: &mut Journal) {
        let target = journal.sync_target().expect("something to sync");
        target.sync().unwrap();
        journal.synced(&target).unwrap();
    }

    fn journal_bytes(dir: &Path) -> Vec<u8> {
        std::fs::read(dir.join(JOURNAL)).unwrap()
    }

    #[test]
    fn records_come_back_in_order_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q");
        let (mut journal, payloads) = Journal::open(&path, b"head").unwrap();
        assert_eq!(payloads, [b"head".to_vec()]);
        journal.append(b"one").unwrap();
        journal.append(b"two").unwrap();
        sync(&mut journal);
        assert!(journal.sync_target().is_none(), "all synced");
        drop(journal);
        let (_, payloads) = Journal::open(&path, b"other").unwrap();
        assert_eq!(
            payloads,
            [b"head".to_vec(), b"one".to_vec(), b"two".to_vec()]
        );
    }

    #[test]
    fn a_torn_or_damaged_tail_is_cut_at_the_first_bad_record() {
        let (_dir, path, mut journal) = opened();
        journal.append(b"kept").unwrap();
        let kept_len = journal.len as usize;
        journal.append(b"flipped").unwrap();
        journal.append(b"after").unwrap();
        drop(journal);
        let mut bytes = journal_bytes(&path);
        bytes[kept_len + FRAME_BYTES] ^= 1;
        std::fs::write(path.join(JOURNAL), &bytes).unwrap();
        let (mut journal, payloads) = Journal::open(&path, b"head").unwrap();
        assert_eq!(payloads, [b"head".to_vec(), b"kept".to_vec()]);
        assert_eq!(journal_bytes(&path).len(), kept_len, "the tail is cut");
        // Appends continue after the cut; a torn (short) record is dropped too.
        journal.append(b"new").unwrap();
        drop(journal);
        let mut bytes = journal_bytes(&path);
        bytes.extend_from_slice(&frame(b"torn").unwrap()[..10]);
        std::fs::write(path.join(JOURNAL), &bytes).unwrap();
        let (_, payloads) = Journal::open(&path, b"head").unwrap();
        assert_eq!(payloads.last().unwrap(), b"new");
        // A zero-filled tail (the file grew, its data never came) is no record.
        let mut bytes = journal_bytes(&path);
        let records_end = bytes.len();
        bytes.extend_from_slice(&[0; 64]);
        std::fs::write(path.join(JOURNAL), &bytes).unwrap();
        let (_, payloads) = Journal::open(&path, b"head").unwrap();
        assert_eq!(payloads.last().unwrap(), b"new");
        assert_eq!(journal_bytes(&path).len(), records_end);
    }

    #[test]
    fn zeros_are_written_ahead_of_the_records_and_cut_at_open() {
        let (_dir, path, mut journal) = opened();
        journal.append(b"one").unwrap();
        let records_end = journal.len;
        let file_len = journal_bytes(&path).len() as u64;
        assert_eq!(file_len, records_end + ZERO_AHEAD_BYTES);
        journal.append(b"two").unwrap();
        assert_eq!(journal_bytes(&path).len() as u64, file_len, "no growth");
        drop(journal);
        let (journal, payloads) = Journal::open(&path, b"head").unwrap();
        assert_eq!(payloads.last().unwrap(), b"two");
        assert_eq!(journal_bytes(&path).len() as u64, journal.len);
    }

    #[test]
    fn a_compaction_replaces_the_journal_only_once_synced() {
        let (_dir, path, mut journal) = opened();
        journal.append(b"old").unwrap();
        journal.compact(&[b"head", b"snapshot"]).unwrap();
        journal.append(b"step").unwrap();
        // Not synced: `journal` still holds the old records.
        let (payloads, _) = read_records(&journal_bytes(&path)).unwrap();
        assert_eq!(payloads.last().unwrap(), b"old");
        sync(&mut journal);
        drop(journal);
        let (_, payloads) = Journal::open(&path, b"head").unwrap();
        assert_eq!(
            payloads,
            [b"head".to_vec(), b"snapshot".to_vec(), b"step".to_vec()]
        );
    }

    #[test]
    fn an_unfinished_compaction_is_ignored_and_replaced() {
        let (_dir, path, mut journal) = opened();
        journal.append(b"old").unwrap();
        journal.compact(&[b"head", b"snapshot"]).unwrap();
        drop(journal);
        let (mut journal, payloads) = Journal::open(&path, b"head").unwrap();
        assert_eq!(payloads, [b"head".to_vec(), b"old".to_vec()]);
        journal.compact(&[b"head", b"again"]).unwrap();
        sync(&mut journal);
        drop(journal);
        let (_, payloads) = Journal::open(&path, b"head").unwrap();
        assert_eq!(payloads, [b"head".to_vec(), b"again".to_vec()]);
    }

    #[test]
    fn compaction_waits_for_growth() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = Journal::open(&dir.path().join("q"), b"head").unwrap();
        assert!(!journal.compaction_due(), "a short journal is kept");
        journal
            .append(&vec![7; COMPACT_MIN_BYTES as usize])
            .unwrap();
        assert!(journal.compaction_due(), "long, never compacted");
        journal.compact(&[b"head", &[7; 1_000]]).unwrap();
        assert!(!journal.compaction_due(), "just compacted");
    }

    #[test]
    fn a_second_handle_is_refused_while_the_first_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q");
        let (journal, _) = Journal::open(&path, b"head").unwrap();
        let error = Journal::open(&path, b"head").unwrap_err();
        assert!(matches!(error, QueueError::Locked { .. }), "{error}");
        drop(journal);
        Journal::open(&path, b"head").unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_journal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join(JOURNAL), b"something else").unwrap();
        let error = Journal::open(&path, b"head").unwrap_err();
        assert!(matches!(error, QueueError::Corrupt { .. }), "{error}");
    }

    #[test]
    fn a_relative_dir_is_named_by_the_current_dir() {
        assert_eq!(parent_dir(Path::new("queue")), Path::new("."));
        assert_eq!(parent_dir(Path::new("data/queue")), Path::new("data"));
    }
}
