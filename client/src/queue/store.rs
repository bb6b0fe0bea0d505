//! The queue's store: items, per-key permits and remembered released ids, in
//! a [`Journal`] (one file of checksummed records, fdatasynced).
//!
//! The record model: the header names the client id the file belongs to; each
//! later record is one step's changes, as JSON ([`StepRecord`]):
//! - `items`: `[id, ItemRecord | null]`, an item written or removed;
//! - `keys`: `[semaphore key, KeyRecord | null]`, a key's grants and leases;
//! - `released`: `[seq, id]`, released ids to remember; `forgotten`: their
//!   sequence numbers once evicted.
//!
//! Replay applies the steps in order. A compaction writes every live record as
//! one step into a new file (see [`super::journal`]).
//!
//! The loop writes a step's changes and flushes them before it sends the step's
//! messages or admits its items, so a claim the holder saw (of a grant or of a
//! new lease), or a lease permit drawn, is never lost to a crash or a power cut
//! (a lost one would leak a permit for good: the holder reclaims only what was
//! never claimed). A lease's `confirmed` flag is stored with it; records
//! without it read `false`, which `QueueState::restore` corrects for leases
//! that were drawn from.
//!
//! A dir written by the sled store of earlier builds is refused
//! ([`QueueError::SledFormat`]), never read: see docs/operations.md.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::journal::Journal;
use super::state::{Dirty, ItemRecord, KeyRecord, QueueState};
use crate::error::QueueError;

/// The version of the record model in the header.
const FORMAT: u32 = 1;

/// Everything a queue dir holds.
pub type Loaded<T> = (
    Vec<ItemRecord<T>>,
    Vec<(String, KeyRecord)>,
    Vec<(u64, String)>,
);

/// The first record of a journal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    format: u32,
    client_id: String,
}

/// One step's changes, as written.
#[derive(Serialize)]
struct StepRecord<'a, T> {
    items: Vec<(&'a str, Option<&'a ItemRecord<T>>)>,
    keys: Vec<(&'a str, Option<&'a KeyRecord>)>,
    released: &'a [(u64, String)],
    forgotten: Vec<u64>,
}

/// One step's changes, as read back.
#[derive(Deserialize)]
#[serde(bound = "T: DeserializeOwned")]
struct StepReplay<T> {
    items: Vec<(String, Option<ItemRecord<T>>)>,
    keys: Vec<(String, Option<KeyRecord>)>,
    released: Vec<(u64, String)>,
    forgotten: Vec<u64>,
}

/// A queue's store. Clones share the one open journal.
#[derive(Debug, Clone)]
pub struct QueueStore {
    journal: Arc<Mutex<Journal>>,
    /// The encoded header, the first record of every compaction.
    header: Arc<[u8]>,
    /// The step records read at open, until [`QueueStore::load`] takes them.
    replay: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl QueueStore {
    /// Opens (or creates) the queue dir at `path` for `client_id`; a dir
    /// written by another client id is refused, since the holder would not
    /// know its grants, and so is one a second handle has open.
    pub fn open(path: &Path, client_id: &str) -> Result<Self, QueueError> {
        refuse_sled_dir(path)?;
        let header = Header {
            format: FORMAT,
            client_id: client_id.to_string(),
        };
        let header = encode("header", &header)?;
        let (journal, mut records) = Journal::open(path, &header)?;
        let stored: Header = decode("header", &records[0])?;
        if stored.format != FORMAT {
            return Err(QueueError::Corrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "its record format is {}, this build reads {FORMAT}",
                    stored.format
                ),
            });
        }
        if stored.client_id != client_id {
            return Err(QueueError::ClientIdMismatch {
                stored: stored.client_id,
                configured: client_id.to_string(),
            });
        }
        records.remove(0);
        Ok(Self {
            journal: Arc::new(Mutex::new(journal)),
            header: header.into(),
            replay: Arc::new(Mutex::new(records)),
        })
    }

    /// Reads every record back (once: the replay is dropped after).
    pub fn load<T: DeserializeOwned>(&self) -> Result<Loaded<T>, QueueError> {
        let steps = std::mem::take(&mut *self.replay.lock().expect("replay lock"));
        let mut items = BTreeMap::new();
        let mut keys = BTreeMap::new();
        let mut released = BTreeMap::new();
        for (index, step) in steps.iter().enumerate() {
            let step: StepReplay<T> = decode(&format!("step {}", index + 1), step)?;
            for (id, record) in step.items {
                match record {
                    Some(record) => items.insert(id, record),
                    None => items.remove(&id),
                };
            }
            for (key, record) in step.keys {
                match record {
                    Some(record) => keys.insert(key, record),
                    None => keys.remove(&key),
                };
            }
            released.extend(step.released);
            for seq in step.forgotten {
                released.remove(&seq);
            }
        }
        Ok((
            items.into_values().collect(),
            keys.into_iter().collect(),
            released.into_iter().collect(),
        ))
    }

    /// Writes the records `dirty` names, as `state` now has them, as one
    /// record (or, when the journal is due for one, a compaction holding every
    /// live record). Not durable until [`QueueStore::flush`]. Returns whether
    /// anything was written.
    pub fn write<T: Serialize + Clone>(
        &self,
        state: &QueueState<T>,
        dirty: &Dirty,
    ) -> Result<bool, QueueError> {
        if dirty.is_empty() {
            return Ok(false);
        }
        let mut journal = self.lock();
        if journal.compaction_due() {
            let everything = encode("compaction", &step_record(state, &state.all_records()))?;
            journal.compact(&[&self.header, &everything])?;
        } else {
            journal.append(&encode("step", &step_record(state, dirty))?)?;
        }
        Ok(true)
    }

    /// Makes every write so far durable: one `fdatasync` (on a blocking
    /// thread), none when an earlier flush already covered them.
    pub async fn flush(&self) -> Result<(), QueueError> {
        if self.lock().sync_target().is_none() {
            return Ok(());
        }
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.flush_blocking())
            .await
            .map_err(|error| QueueError::Store(std::io::Error::other(error)))?
    }

    fn flush_blocking(&self) -> Result<(), QueueError> {
        // A loop: a compaction may replace the file while it is being synced.
        loop {
            let Some(target) = self.lock().sync_target() else {
                return Ok(());
            };
            target.sync()?;
            self.lock().synced(&target)?;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().expect("journal lock")
    }
}

/// The step record of the records `dirty` names, as `state` has them.
fn step_record<'a, T>(state: &'a QueueState<T>, dirty: &'a Dirty) -> StepRecord<'a, T>
where
    T: Clone,
{
    StepRecord {
        items: dirty
            .items
            .iter()
            .map(|id| (id.as_str(), state.item(id)))
            .collect(),
        keys: dirty
            .keys
            .iter()
            .map(|key| (key.as_str(), state.key_record(key)))
            .collect(),
        released: &dirty.released_added,
        forgotten: dirty.released_removed.iter().map(|(seq, _)| *seq).collect(),
    }
}

/// Refuses a dir the sled store of earlier builds wrote (its `conf` and `db`
/// files): its records are not read, and starting afresh beside them would
/// forget the permits they hold.
fn refuse_sled_dir(path: &Path) -> Result<(), QueueError> {
    if path.join("conf").is_file() && path.join("db").is_file() {
        return Err(QueueError::SledFormat {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn encode<V: Serialize>(name: &str, value: &V) -> Result<Vec<u8>, QueueError> {
    serde_json::to_vec(value).map_err(|source| QueueError::Codec {
        record: name.to_string(),
        source,
    })
}

fn decode<V: DeserializeOwned>(name: &str, value: &[u8]) -> Result<V, QueueError> {
    serde_json::from_slice(value).map_err(|source| QueueError::Codec {
        record: name.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::state::{ItemStatus, QueueItem, StateConfig};

    fn item(id: &str) -> QueueItem<u32> {
        QueueItem {
            id: id.into(),
            key: "acct/1".into(),
            group: "wf".into(),
            body: 7,
        }
    }

    /// Writes and syncs the state's changes.
    fn persist(store: &QueueStore, state: &mut QueueState<u32>) {
        let dirty = state.take_dirty();
        store.write(state, &dirty).unwrap();
        store.flush_blocking().unwrap();
    }

    /// The state a queue restarted on `path` has.
    fn reopen<T: Clone + DeserializeOwned>(path: &Path) -> QueueState<T> {
        let store = QueueStore::open(path, "runner-1").unwrap();
        let (items, keys, released) = store.load::<T>().unwrap();
        QueueState::restore("runner-1", StateConfig::default(), items, keys, released)
    }

    #[test]
    fn records_round_trip_and_removals_stick() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q");
        let store = QueueStore::open(&path, "runner-1").unwrap();
        let mut state = QueueState::<u32>::new("runner-1", StateConfig::default());
        state.enqueue(vec![item("a"), item("b")], 10).unwrap();
        persist(&store, &mut state);
        state.release("a");
        persist(&store, &mut state);
        drop(store);
        let store = QueueStore::open(&path, "runner-1").unwrap();
        let (items, keys, released) = store.load::<u32>().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].id, "b");
        assert!(keys.is_empty());
        assert_eq!(released, vec![(0, "a".to_string())]);
        drop(store);
        let restored = reopen::<u32>(&path);
        assert_eq!(restored.counts(0).queued, 1);
        assert_eq!(restored.status("a"), ItemStatus::Released);
    }

    #[test]
    fn a_compacted_journal_holds_the_same_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q");
        let store = QueueStore::open(&path, "runner-1").unwrap();
        let mut state = QueueState::<String>::new("runner-1", StateConfig::default());
        let large = |id: String| QueueItem {
            id,
            key: "acct/1".into(),
            group: "wf".into(),
            body: "x".repeat(64 * 1024),
        };
        // Enqueue and release until the journal was compacted twice.
        let mut n = 0;
        while store.lock().compactions() < 2 {
            let ids = [format!("kept-{n}"), format!("gone-{n}")];
            state.enqueue(ids.clone().map(large).into(), n).unwrap();
            state.release(&ids[1]);
            let dirty = state.take_dirty();
            store.write(&state, &dirty).unwrap();
            store.flush_blocking().unwrap();
            n += 1;
        }
        drop(store);
        let restored = reopen::<String>(&path);
        assert_eq!(restored.counts(0).queued, n as usize);
        for m in 0..n {
            assert_eq!(restored.status(&format!("kept-{m}")), ItemStatus::Queued);
            assert_eq!(restored.status(&format!("gone-{m}")), ItemStatus::Released);
        }
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

    #[test]
    fn a_sled_queue_dir_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q");
        std::fs::create_dir(&path).unwrap();
        // What sled 0.34 leaves in its dir.
        std::fs::write(path.join("conf"), b"segment_size: 524288").unwrap();
        std::fs::write(path.join("db"), b"").unwrap();
        let error = QueueStore::open(&path, "runner-1").unwrap_err();
        assert!(matches!(error, QueueError::SledFormat { .. }), "{error}");
        assert!(error.to_string().contains("shut the queue down"), "{error}");
        assert!(!path.join("journal").exists(), "nothing written beside it");
    }
}
