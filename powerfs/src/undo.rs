//! The data undo log: per inode, every change to a file's bytes since its last fsync.
//!
//! Each entry holds what a revert needs: the offset, the bytes the change overwrote
//! (only those that existed: a write past the end records none) and the file's size
//! before it. Reverting an inode's entries newest first (write the old bytes back, set
//! the old size) restores the content the file had at its last fsync. The log lives in
//! memory; its total size is capped (`PowerFs` refuses changes past the cap with
//! ENOSPC) because this is a test tool, not a store.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// One unsynced change to a file's bytes.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Where the change started.
    pub offset: u64,
    /// The bytes it overwrote that existed before (from `offset` on).
    pub old: Vec<u8>,
    /// The file's size before the change.
    pub old_size: u64,
    /// For a write: how many bytes it wrote (a torn write keeps a prefix of them).
    pub written: Option<u64>,
}

/// Every inode's unsynced changes, and the bytes they hold.
#[derive(Debug, Default)]
pub struct UndoLog {
    logs: HashMap<u64, Vec<Entry>>,
    bytes: u64,
}

/// Read what `[offset, offset + len)` of `file` holds now, clipped to its size.
pub fn read_old(file: &File, size: u64, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let end = size.min(offset.saturating_add(len));
    if end <= offset {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; (end - offset) as usize];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

impl UndoLog {
    /// Bytes held by all entries.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Record a change to `ino`.
    pub fn push(&mut self, ino: u64, e: Entry) {
        self.bytes += e.old.len() as u64;
        self.logs.entry(ino).or_default().push(e);
    }

    /// fsync: `ino`'s content is durable.
    pub fn clear(&mut self, ino: u64) {
        if let Some(l) = self.logs.remove(&ino) {
            self.bytes -= l.iter().map(|e| e.old.len() as u64).sum::<u64>();
        }
    }

    /// Take every log, leaving this one empty.
    pub fn take_all(&mut self) -> HashMap<u64, Vec<Entry>> {
        self.bytes = 0;
        std::mem::take(&mut self.logs)
    }
}

/// Undo `entries` (oldest first, as recorded) on `file`, newest first.
pub fn revert(file: &File, entries: &[Entry]) -> io::Result<()> {
    for e in entries.iter().rev() {
        // shrink first only when needed: writing old bytes back never extends past
        // old_size, since they existed before the change
        file.write_all_at(&e.old, e.offset)?;
        file.set_len(e.old_size)?;
    }
    Ok(())
}

/// SplitMix64 (Steele, Lea and Flood, 2014): the seed's random numbers for torn
/// writes, and the chaos runs' replayable generator (`permitd-tests`), in a few
/// lines we own.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Numbers from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revert_restores_content_and_size() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))?;
        f.write_all_at(b"hello world", 0)?;
        let mut log = UndoLog::default();
        // overwrite in the middle, append, shrink
        let steps: [(u64, &[u8]); 2] = [(2, b"XY"), (9, b"append")];
        for (off, data) in steps {
            let size = f.metadata()?.len();
            let old = read_old(&f, size, off, data.len() as u64)?;
            log.push(
                1,
                Entry {
                    offset: off,
                    old,
                    old_size: size,
                    written: Some(data.len() as u64),
                },
            );
            f.write_all_at(data, off)?;
        }
        let size = f.metadata()?.len();
        let old = read_old(&f, size, 4, u64::MAX)?;
        log.push(
            1,
            Entry {
                offset: 4,
                old,
                old_size: size,
                written: None,
            },
        );
        f.set_len(4)?;
        let all = log.take_all();
        revert(&f, &all[&1])?;
        let mut buf = vec![0; 11];
        f.read_exact_at(&mut buf, 0)?;
        assert_eq!(&buf, b"hello world");
        assert_eq!(f.metadata()?.len(), 11);
        Ok(())
    }
}
