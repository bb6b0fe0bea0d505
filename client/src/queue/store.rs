//! The queue's sled file: items, per-key permits and remembered released ids.
//!
//! One sled tree with prefixed keys, so that one [`sled::Batch`] writes every
//! change of a step atomically:
//! - `m/client` → the client id the file belongs to;
//! - `i/{item id}` → an [`ItemRecord`] as JSON;
//! - `k/{semaphore key}` → a [`KeyRecord`] as JSON (grants and leases held);
//! - `r/{seq, 20 digits}` → a released item id, oldest first.
//!
//! The loop writes a step's changes and flushes them before it sends the step's
//! messages or admits its items, so a claim the holder saw (of a grant or of a
//! new lease), or a lease permit drawn, is never lost to a crash (a lost one
//! would leak a permit for good: the holder reclaims only what was never
//! claimed). A lease's `confirmed` flag is stored with it; files from before it
//! existed read `false`, which `QueueState::restore` corrects for leases that
//! were drawn from.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::state::{Dirty, ItemRecord, KeyRecord, QueueState};
use crate::error::QueueError;

const CLIENT_KEY: &[u8] = b"m/client";
const ITEM_PREFIX: &[u8] = b"i/";
const KEY_PREFIX: &[u8] = b"k/";
const RELEASED_PREFIX: &[u8] = b"r/";

/// How long [`QueueStore::open`] waits for a file another handle still locks.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// Opens the sled file, waiting up to [`LOCK_WAIT`] while its lock is taken.
///
/// sled 0.34 releases a file's lock only when its background flusher lets go
/// of the last handle, a moment after the last `Db` is dropped; a process that
/// closes a queue and opens it again (a restart in place) would otherwise see
/// the file locked by itself. A second live process still gets the lock error.
fn open_when_unlocked(path: &Path) -> sled::Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match sled::open(path) {
            Err(sled::Error::Io(error))
                if error.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Everything a queue file holds.
pub type Loaded<T> = (
    Vec<ItemRecord<T>>,
    Vec<(String, KeyRecord)>,
    Vec<(u64, String)>,
);

/// A queue's sled file.
#[derive(Debug, Clone)]
pub struct QueueStore {
    db: sled::Db,
}

impl QueueStore {
    /// Opens (or creates) the file at `path` for `client_id`; a file written by
    /// another client id is refused, since the holder would not know its grants.
    pub fn open(path: &Path, client_id: &str) -> Result<Self, QueueError> {
        let db = open_when_unlocked(path)?;
        match db.get(CLIENT_KEY)? {
            Some(stored) if stored.as_ref() != client_id.as_bytes() => {
                return Err(QueueError::ClientIdMismatch {
                    stored: String::from_utf8_lossy(&stored).into_owned(),
                    configured: client_id.to_string(),
                });
            }
            Some(_) => {}
            None => {
                db.insert(CLIENT_KEY, client_id.as_bytes())?;
                db.flush()?;
            }
        }
        Ok(Self { db })
    }

    /// Reads every record back.
    pub fn load<T: DeserializeOwned>(&self) -> Result<Loaded<T>, QueueError> {
        let mut items = Vec::new();
        for entry in self.db.scan_prefix(ITEM_PREFIX) {
            let (name, value) = entry?;
            items.push(decode(&name, &value)?);
        }
        let mut keys = Vec::new();
        for entry in self.db.scan_prefix(KEY_PREFIX) {
            let (name, value) = entry?;
            let key = String::from_utf8_lossy(&name[KEY_PREFIX.len()..]).into_owned();
            keys.push((key, decode(&name, &value)?));
        }
        let mut released = Vec::new();
        for entry in self.db.scan_prefix(RELEASED_PREFIX) {
            let (name, value) = entry?;
            let seq = std::str::from_utf8(&name[RELEASED_PREFIX.len()..])
                .ok()
                .and_then(|digits| digits.parse::<u64>().ok());
            if let Some(seq) = seq {
                released.push((seq, String::from_utf8_lossy(&value).into_owned()));
            }
        }
        Ok((items, keys, released))
    }

    /// Writes the records `dirty` names, as `state` now has them, in one batch.
    /// Returns whether anything was written.
    pub fn write<T: Serialize + Clone>(
        &self,
        state: &QueueState<T>,
        dirty: &Dirty,
    ) -> Result<bool, QueueError> {
        if dirty.is_empty() {
            return Ok(false);
        }
        let mut batch = sled::Batch::default();
        for id in &dirty.items {
            let name = prefixed(ITEM_PREFIX, id);
            match state.item(id) {
                Some(record) => batch.insert(name, encode(id, record)?),
                None => batch.remove(name),
            }
        }
        for key in &dirty.keys {
            let name = prefixed(KEY_PREFIX, key);
            match state.key_record(key) {
                Some(record) => batch.insert(name, encode(key, record)?),
                None => batch.remove(name),
            }
        }
        for (seq, id) in &dirty.released_added {
            batch.insert(released_name(*seq), id.as_bytes());
        }
        for (seq, _) in &dirty.released_removed {
            batch.remove(released_name(*seq));
        }
        self.db.apply_batch(batch)?;
        Ok(true)
    }

    /// Makes every write so far durable.
    pub async fn flush(&self) -> Result<(), QueueError> {
        self.db.flush_async().await?;
        Ok(())
    }
}

fn prefixed(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(prefix.len() + name.len());
    bytes.extend_from_slice(prefix);
    bytes.extend_from_slice(name.as_bytes());
    bytes
}

fn released_name(seq: u64) -> Vec<u8> {
    format!("r/{seq:020}").into_bytes()
}

fn encode<V: Serialize>(name: &str, value: &V) -> Result<Vec<u8>, QueueError> {
    serde_json::to_vec(value).map_err(|source| QueueError::Codec {
        record: name.to_string(),
        source,
    })
}

fn decode<V: DeserializeOwned>(name: &[u8], value: &[u8]) -> Result<V, QueueError> {
    serde_json::from_slice(value).map_err(|source| QueueError::Codec {
        record: String::from_utf8_lossy(name).into_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::state::{QueueItem, StateConfig};

    fn item(id: &str) -> QueueItem<u32> {
        QueueItem {
            id: id.into(),
            key: "acct/1".into(),
            group: "wf".into(),
            body: 7,
        }
    }

    #[test]
    fn records_round_trip_and_removals_stick() {
        let dir = tempfile::tempdir().unwrap();
        let store = QueueStore::open(&dir.path().join("q"), "runner-1").unwrap();
        let mut state = QueueState::<u32>::new("runner-1", StateConfig::default());
        state.enqueue(vec![item("a"), item("b")], 10).unwrap();
        let dirty = state.take_dirty();
        store.write(&state, &dirty).unwrap();
        state.release("a");
        let dirty = state.take_dirty();
        store.write(&state, &dirty).unwrap();
        let (items, keys, released) = store.load::<u32>().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].id, "b");
        assert!(keys.is_empty());
        assert_eq!(released, vec![(0, "a".to_string())]);
        let restored =
            QueueState::restore("runner-1", StateConfig::default(), items, keys, released);
        assert_eq!(restored.counts(0).queued, 1);
        assert_eq!(
            restored.status("a"),
            crate::queue::state::ItemStatus::Released
        );
    }

    #[test]
    fn another_client_id_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q");
        drop(QueueStore::open(&path, "runner-1").unwrap());
        let error = QueueStore::open(&path, "runner-2").unwrap_err();
        assert!(
            matches!(error, QueueError::ClientIdMismatch { .. }),
            "{error}"
        );
    }
}
