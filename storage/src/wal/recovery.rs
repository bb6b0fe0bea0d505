//! Opening the log: scan every segment, cut a torn tail, replay the records
//! into the Raft state and the entry index.
//!
//! 1. **Scan** the segments in sequence order, record by record, checking each
//!    length against the limit and each CRC. The first record that is cut short
//!    or fails its CRC ends the log: it and everything after it were never
//!    acknowledged (an acknowledgement needs an fdatasync covering the record,
//!    and a later segment's acknowledgements need every earlier segment synced).
//! 2. **Cut** there: delete the later segments (newest first, so the segments
//!    left are always a contiguous run), fsync the dir, then truncate the
//!    damaged segment at the last whole record and fsync it. A crash halfway
//!    through leaves the same damage for the next open to cut again.
//! 3. **Sync** every kept segment: bytes a killed process left in the page
//!    cache were never acknowledged and could still be lost in a power cut, which
//!    would tear the log *before* entries we are about to acknowledge.
//! 4. **Replay** the records in order, each into its own shard's state (a
//!    record of format 4 into shard 0): the last vote and committed id win, the
//!    purge point only moves up, a Truncate drops entries at or after its index,
//!    an Entry drops entries at or after its own index (an overwrite) and takes
//!    its place. Entries at or below their shard's highest purge point anywhere
//!    in the log are skipped: they are gone, and a segment a lost unlink brought
//!    back may hold them out of order.
//! 5. **Check** that the segments are a run of consecutive sequence numbers (a
//!    gap is a lost segment) and that each shard's entries left are consecutive
//!    and above its purge point; a hole is [`StorageError::Corrupt`], never a
//!    panic.
//!
//! A record whose CRC matches but whose kind or payload we cannot read was
//! written whole, by someone: it is reported as corrupt, never cut silently.

use std::collections::BTreeMap;
use std::io::{BufReader, ErrorKind, Read};
use std::path::Path;
use std::sync::Arc;

use super::record::{self, Header, Record, RecordError, HEADER_BYTES};
use super::segment::{self, io_error, Segment};
use super::{Location, RaftState, ShardId, ShardLog};
use crate::disk::stream::FileReader;
use crate::disk::Disk;
use crate::StorageError;

/// Read-ahead of the sequential scan, in bytes.
const SCAN_BUFFER_BYTES: usize = 1024 * 1024;

/// What the segments on disk hold, after any torn tail was cut.
#[derive(Debug)]
pub(super) struct Recovered {
    /// Every shard any record names.
    pub(super) shards: BTreeMap<ShardId, ShardLog>,
    /// Every kept segment, by sequence.
    pub(super) segments: BTreeMap<u64, Arc<Segment>>,
}

/// One whole record found by the scan.
#[derive(Debug)]
struct Scanned {
    offset: u64,
    len: u64,
    shard: ShardId,
    record: Record,
}

/// One segment's whole records, and where its valid bytes end.
#[derive(Debug)]
struct Scan {
    records: Vec<Scanned>,
    valid_len: u64,
    /// Why the scan stopped before the end of the file, if it did.
    damage: Option<RecordError>,
}

fn corrupt(dir: &Path, detail: String) -> StorageError {
    StorageError::Corrupt {
        dir: dir.to_owned(),
        detail,
    }
}

/// Scans, cuts, syncs and replays the segments in `dir`.
pub(super) fn recover(disk: &dyn Disk, dir: &Path) -> Result<Recovered, StorageError> {
    let listed = segment::list(disk, dir)?;
    check_no_gap(dir, &listed)?;
    let mut scanned = Vec::with_capacity(listed.len());
    for (position, (sequence, path)) in listed.iter().enumerate() {
        let segment = Segment::open(disk, path, *sequence)?;
        let scan = scan(dir, &segment)?;
        let damaged = scan.damage.is_some();
        if let Some(damage) = &scan.damage {
            cut(
                disk,
                dir,
                &segment,
                scan.valid_len,
                damage,
                &listed[position + 1..],
            )?;
        }
        segment
            .sync_data()
            .map_err(io_error("fdatasync", &segment.path))?;
        scanned.push((Arc::new(segment), scan.records));
        if damaged {
            break;
        }
    }
    disk.sync_dir(dir).map_err(io_error("fsync", dir))?;
    replay(dir, scanned)
}

/// Reads `segment` record by record until its end or the first damage.
fn scan(dir: &Path, segment: &Segment) -> Result<Scan, StorageError> {
    let mut reader = BufReader::with_capacity(SCAN_BUFFER_BYTES, FileReader::new(segment.file()));
    let mut records = Vec::new();
    let mut offset = 0u64;
    loop {
        let mut header = [0u8; HEADER_BYTES];
        let read = read_full(&mut reader, &mut header).map_err(io_error("read", &segment.path))?;
        if read == 0 {
            return Ok(Scan::complete(records, offset));
        }
        if read < HEADER_BYTES {
            let damage = RecordError::Short {
                needed: HEADER_BYTES,
                available: read,
            };
            return Ok(Scan::damaged(records, offset, damage));
        }
        if header == [0u8; HEADER_BYTES] {
            return Ok(Scan::damaged(records, offset, RecordError::Unwritten));
        }
        let header = match Header::parse(&header) {
            Ok(header) => header,
            Err(damage) => return Ok(Scan::damaged(records, offset, damage)),
        };
        let mut payload = vec![0u8; header.payload_len];
        let read = read_full(&mut reader, &mut payload).map_err(io_error("read", &segment.path))?;
        if read < payload.len() {
            let damage = RecordError::Short {
                needed: HEADER_BYTES + payload.len(),
                available: HEADER_BYTES + read,
            };
            return Ok(Scan::damaged(records, offset, damage));
        }
        let tag = match header.verify(&payload) {
            Ok(tag) => tag,
            Err(RecordError::UnknownKind(kind)) => {
                let detail = format!(
                    "{} at offset {offset}: unknown record kind {kind}",
                    segment.path.display()
                );
                return Err(corrupt(dir, detail));
            }
            Err(damage) => return Ok(Scan::damaged(records, offset, damage)),
        };
        let (shard, record) = record::decode(tag, &payload).map_err(|error| {
            corrupt(
                dir,
                format!("{} at offset {offset}: {error}", segment.path.display()),
            )
        })?;
        let len = (HEADER_BYTES + payload.len()) as u64;
        records.push(Scanned {
            offset,
            len,
            shard,
            record,
        });
        offset += len;
    }
}

impl Scan {
    fn complete(records: Vec<Scanned>, valid_len: u64) -> Self {
        Self {
            records,
            valid_len,
            damage: None,
        }
    }

    fn damaged(records: Vec<Scanned>, valid_len: u64, damage: RecordError) -> Self {
        Self {
            records,
            valid_len,
            damage: Some(damage),
        }
    }
}

/// Reads until `buffer` is full or the file ends; returns the bytes read.
fn read_full(reader: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// Ends the log at `valid_len` bytes of `segment`: deletes the `later`
/// segments (newest first), then truncates `segment`.
fn cut(
    disk: &dyn Disk,
    dir: &Path,
    segment: &Segment,
    valid_len: u64,
    damage: &RecordError,
    later: &[(u64, std::path::PathBuf)],
) -> Result<(), StorageError> {
    let file_len = segment
        .file()
        .len()
        .map_err(io_error("stat", &segment.path))?;
    let cut_bytes = file_len - valid_len.min(file_len);
    if matches!(damage, RecordError::Unwritten) && later.is_empty() {
        tracing::info!(
            segment = %segment.path.display(),
            valid_bytes = valid_len,
            cut_bytes,
            "write-ahead log ends in zero-filled space: cutting it off"
        );
    } else {
        tracing::warn!(
            segment = %segment.path.display(),
            valid_bytes = valid_len,
            cut_bytes,
            later_segments_deleted = later.len(),
            %damage,
            "write-ahead log ends in a torn or damaged record: cutting it off (it was never acknowledged)"
        );
    }
    for (_, path) in later.iter().rev() {
        disk.remove_file(path).map_err(io_error("delete", path))?;
    }
    if !later.is_empty() {
        disk.sync_dir(dir).map_err(io_error("fsync", dir))?;
    }
    segment.truncate(valid_len)
}

/// Replays the scanned records into each shard's Raft state and entry index.
fn replay(
    dir: &Path,
    scanned: Vec<(Arc<Segment>, Vec<Scanned>)>,
) -> Result<Recovered, StorageError> {
    // Each shard's highest purge point anywhere: its entries at or below it
    // are gone, even those of a segment that came back after a lost unlink.
    let mut floors: BTreeMap<ShardId, u64> = BTreeMap::new();
    for scanned in scanned.iter().flat_map(|(_, records)| records) {
        if let Record::Purged(Some(log_id)) = scanned.record {
            let floor = floors.entry(scanned.shard).or_default();
            *floor = (*floor).max(log_id.index);
        }
    }
    let mut shards: BTreeMap<ShardId, ShardLog> = BTreeMap::new();
    for (segment, records) in &scanned {
        for scanned in records {
            let shard = shards.entry(scanned.shard).or_default();
            let floor = floors.get(&scanned.shard).copied();
            replay_record(shard, segment.sequence, scanned, floor);
        }
    }
    for (id, shard) in &shards {
        check_consecutive(dir, *id, &shard.raft, &shard.index)?;
    }
    let segments = scanned
        .into_iter()
        .map(|(segment, _)| (segment.sequence, segment))
        .collect();
    Ok(Recovered { shards, segments })
}

fn replay_record(shard: &mut ShardLog, sequence: u64, scanned: &Scanned, floor: Option<u64>) {
    let ShardLog { raft, index, .. } = shard;
    match scanned.record {
        Record::Vote(vote) => raft.vote = vote,
        Record::Committed(committed) => raft.committed = committed,
        Record::Purged(purged) => {
            raft.purged = raft.purged.max(purged);
            if let Some(purged) = raft.purged {
                *index = index.split_off(&(purged.index + 1));
            }
        }
        Record::Truncate(from) => drop(index.split_off(&from)),
        Record::Entry(log_id) => {
            // An entry overwrites: it drops what is at or after its index,
            // even when it is at or below the purge point itself (an
            // overwrite of entry 5 that dropped entry 6, then a purge through
            // 5, must not bring 6 back).
            if index
                .last_key_value()
                .is_some_and(|(&last, _)| last >= log_id.index)
            {
                drop(index.split_off(&log_id.index));
            }
            if floor.is_some_and(|floor| log_id.index <= floor) {
                return;
            }
            let location = Location {
                segment: sequence,
                offset: scanned.offset,
                len: scanned.len,
                log_id,
            };
            index.insert(log_id.index, location);
        }
    }
}

/// The segments are numbered consecutively: a gap is a lost segment.
fn check_no_gap(dir: &Path, listed: &[(u64, std::path::PathBuf)]) -> Result<(), StorageError> {
    for pair in listed.windows(2) {
        let [(before, _), (after, _)] = pair else {
            continue;
        };
        if before + 1 != *after {
            let detail = format!(
                "the write-ahead log has a hole: segment {after} follows segment {before}, \
                 segments in between are missing"
            );
            return Err(corrupt(dir, detail));
        }
    }
    Ok(())
}

/// The entries are consecutive and above the purge point.
fn check_consecutive(
    dir: &Path,
    shard: ShardId,
    raft: &RaftState,
    index: &BTreeMap<u64, Location>,
) -> Result<(), StorageError> {
    let purged = raft.purged.map(|purged| purged.index);
    let mut previous: Option<u64> = None;
    for (&at, location) in index {
        let follows = previous.map_or(purged.is_none_or(|purged| at > purged), |previous| {
            previous + 1 == at
        });
        if !follows || location.log_id.index != at {
            let detail = format!(
                "the write-ahead log has a hole: shard {shard}'s entry {at} (in segment {}) follows \
                 entry {previous:?}, purged up to {purged:?}",
                location.segment
            );
            return Err(corrupt(dir, detail));
        }
        previous = Some(at);
    }
    Ok(())
}
