//! The node's recent lifecycle events, for `GET /v1/events`.
//!
//! Every node applies every committed entry, so every node can serve the event
//! stream from its own applied entries: no forwarding, no leader load, and a
//! stream survives a leader change. The price is that a stream is as current as
//! the node serving it (a lagging follower's stream lags too).
//!
//! The log keeps the last [`EVENT_BUFFER_EVENTS`] events in memory and a
//! broadcast of new ones. Invariants:
//! - every event of every entry with index ≥ `complete_from` that this node
//!   applied is in `records` (so a resume from there misses nothing);
//! - `records` is in log order and never longer than its capacity;
//! - a new event is pushed and broadcast under the same lock a subscriber takes
//!   to copy the backlog and subscribe, so a subscriber sees each event once.
//!
//! `complete_from` moves forward when old events are dropped, when a snapshot
//! replaces the state (its entries' events never ran here), and when the node
//! missed apply notices; at start it is the first index after the applied state
//! loaded from disk (earlier events were applied by a previous process).
//!
//! While `complete_from` is still 1 the log holds every event since the cluster
//! began (index 0 is openraft's initial membership entry, which has none), so a
//! `from` older than that streams from the first event held rather than being
//! refused: nothing before it is gone.
//!
//! Each shard has its own log; the node's logs share one [`EventHub`]: the
//! limit on open streams (a stream of every shard is one subscriber, as a
//! stream of one is) and a counter that stamps each event with the order this
//! node applied it in across shards, so a stream of several shards sends its
//! backlog in that order. Shards apply independently: that order is this
//! node's, not the cluster's (another node may apply two shards' entries the
//! other way round).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use permitd_core::contract::EventRecord;
use permitd_core::limits::{EVENT_BUFFER_EVENTS, MAX_EVENT_SUBSCRIBERS};
use permitd_storage::Applied;
use tokio::sync::{broadcast, watch, OwnedSemaphorePermit, Semaphore};

/// One kept event, encoded once: what a stream sends as the message's `data:`.
/// A record's JSON is ~200 bytes where the record itself costs ~650 (a round's
/// usage holds a B-tree of groups, whose first node alone is 536 bytes), so the
/// [`EVENT_BUFFER_EVENTS`] kept events take ~3 MiB rather than ~6.5 MiB on every
/// node; and each stream sends the same text without encoding it again.
#[derive(Debug)]
pub struct KeptEvent {
    pub log_index: u64,
    /// When this node applied its entry, among every shard's entries
    /// ([`EventHub`]): increasing in push order on this node, the same for
    /// every event of one entry.
    pub applied_order: u64,
    /// The last of its entry's events: a stream of several shards sends an
    /// entry's events together, never another shard's between them.
    pub last_of_entry: bool,
    pub key: String,
    /// The event's type (the message's `event:`).
    pub name: &'static str,
    /// The [`EventRecord`], as JSON.
    pub json: Box<str>,
}

impl KeptEvent {
    fn new(
        (log_index, applied_order, last_of_entry): (u64, u64, bool),
        key: &str,
        event: &permitd_core::Event,
    ) -> Self {
        let record = EventRecord {
            log_index,
            key: key.to_owned(),
            event: event.clone(),
        };
        let json = serde_json::to_string(&record).expect("an event record serialises");
        Self {
            log_index,
            applied_order,
            last_of_entry,
            name: event.name(),
            key: record.key,
            json: json.into_boxed_str(),
        }
    }
}

/// What the event logs of every shard of a node share; cheap to clone.
#[derive(Debug, Clone)]
pub struct EventHub {
    /// The next entry's [`KeptEvent::applied_order`].
    applied_order: Arc<AtomicU64>,
    /// One permit per open stream ([`MAX_EVENT_SUBSCRIBERS`]), whatever
    /// shards it covers.
    subscribers: Arc<Semaphore>,
    max_subscribers: usize,
}

/// An open stream's place among the node's [`MAX_EVENT_SUBSCRIBERS`]; held
/// for the stream's life.
#[derive(Debug)]
pub struct Admission {
    _permit: OwnedSemaphorePermit,
}

impl Default for EventHub {
    fn default() -> Self {
        Self::with_max_subscribers(MAX_EVENT_SUBSCRIBERS)
    }
}

impl EventHub {
    pub(crate) fn with_max_subscribers(max_subscribers: usize) -> Self {
        Self {
            applied_order: Arc::new(AtomicU64::new(0)),
            subscribers: Arc::new(Semaphore::new(max_subscribers)),
            max_subscribers,
        }
    }

    /// A place for one more stream, or `TooManySubscribers`.
    pub fn admit(&self) -> Result<Admission, SubscribeError> {
        Arc::clone(&self.subscribers)
            .try_acquire_owned()
            .map(|permit| Admission { _permit: permit })
            .map_err(|_| SubscribeError::TooManySubscribers {
                max: self.max_subscribers,
            })
    }

    fn next_order(&self) -> u64 {
        // Relaxed is enough: each log pushes under its own lock, and only the
        // order among one node's pushes matters, which the counter gives.
        self.applied_order.fetch_add(1, Ordering::Relaxed)
    }
}

/// The recent events and the live feed; cheap to clone.
#[derive(Debug, Clone)]
pub struct EventLog {
    buffer: Arc<Mutex<Buffer>>,
    live: broadcast::Sender<Arc<KeptEvent>>,
    hub: EventHub,
    /// Set at shutdown: open streams end so the server can drain.
    closed: watch::Sender<bool>,
}

#[derive(Debug)]
struct Buffer {
    records: VecDeque<Arc<KeptEvent>>,
    capacity: usize,
    /// The lowest log index from which every event is kept.
    complete_from: u64,
    /// The last index an apply notice was seen for.
    last_index: u64,
    /// Notices were lost: the next one starts a new complete run.
    gap: bool,
}

/// Why a stream cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    #[error("events before log index {oldest} are no longer kept on this node; resume from {oldest} or later, or re-read the state")]
    TooFarBehind { oldest: u64 },
    #[error("this node just missed applied entries (it fell behind its own state machine); stream new events only, or resume once the next entry is applied")]
    MissedEntries,
    #[error("this node already serves {max} event streams")]
    TooManySubscribers { max: usize },
}

/// A started stream of one shard: the kept events it asked for, then the
/// live feed.
#[derive(Debug)]
pub struct Subscription {
    pub backlog: Vec<Arc<KeptEvent>>,
    pub live: broadcast::Receiver<Arc<KeptEvent>>,
    pub closed: watch::Receiver<bool>,
    /// The log index the stream starts after: every event of this shard up
    /// to it is behind the stream (`from - 1`, or the last index this log had
    /// seen when the stream asked for new events only). The stream's cursor
    /// starts here.
    pub after: u64,
}

impl EventLog {
    /// An empty log whose events start after `applied_at_start`.
    pub fn new(applied_at_start: u64, hub: &EventHub) -> Self {
        Self::with_capacity(applied_at_start, EVENT_BUFFER_EVENTS, hub)
    }

    pub(crate) fn with_capacity(applied_at_start: u64, capacity: usize, hub: &EventHub) -> Self {
        let buffer = Buffer {
            records: VecDeque::with_capacity(capacity.min(1_024)),
            capacity,
            complete_from: applied_at_start + 1,
            last_index: applied_at_start,
            gap: false,
        };
        Self {
            buffer: Arc::new(Mutex::new(buffer)),
            live: broadcast::channel(capacity).0,
            hub: hub.clone(),
            closed: watch::channel(false).0,
        }
    }

    /// Records one applied entry's events.
    pub fn push(&self, applied: &Applied) {
        let mut buffer = self.lock();
        if applied.installed_snapshot {
            buffer.restart_at(applied.log_index + 1);
        } else if buffer.gap {
            buffer.restart_at(applied.log_index);
        }
        buffer.gap = false;
        buffer.last_index = buffer.last_index.max(applied.log_index);
        let order = self.hub.next_order();
        let last = applied.events.len().saturating_sub(1);
        for (at, (key, event)) in applied.events.iter().enumerate() {
            let place = (applied.log_index, order, at == last);
            let record = Arc::new(KeptEvent::new(place, key, event));
            buffer.keep(Arc::clone(&record));
            // No subscriber is fine.
            let _ = self.live.send(record);
        }
    }

    /// The node missed apply notices: nothing before the next entry is complete.
    pub fn lost_notices(&self) {
        let mut buffer = self.lock();
        let next = buffer.last_index + 1;
        buffer.restart_at(next);
        buffer.gap = true;
    }

    /// Starts a stream of the events with index ≥ `from` (of `key` only, when
    /// given); `from: None` means only events applied from now on. A `from`
    /// older than the complete run is refused unless the run reaches back to
    /// the cluster's start ([`Buffer::holds_whole_history`]). The caller
    /// holds the stream's [`Admission`] ([`EventHub::admit`]).
    pub fn subscribe(
        &self,
        key: Option<&str>,
        from: Option<u64>,
    ) -> Result<Subscription, SubscribeError> {
        let buffer = self.lock();
        let backlog = match from {
            None => Vec::new(),
            // Which entries were missed is known only once the next one arrives.
            Some(_) if buffer.gap => return Err(SubscribeError::MissedEntries),
            Some(from) if from < buffer.complete_from && !buffer.holds_whole_history() => {
                return Err(SubscribeError::TooFarBehind {
                    oldest: buffer.complete_from,
                })
            }
            Some(from) => buffer
                .records
                .iter()
                .filter(|record| record.log_index >= from && matches(key, record))
                .cloned()
                .collect(),
        };
        Ok(Subscription {
            backlog,
            live: self.live.subscribe(),
            closed: self.closed.subscribe(),
            after: from.map_or(buffer.last_index, |from| from.saturating_sub(1)),
        })
    }

    /// Ends every open stream (shutdown).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.buffer.lock().expect("event log lock poisoned")
    }
}

/// Whether `record` belongs to a stream of `key` (every key when `None`).
pub fn matches(key: Option<&str>, record: &KeptEvent) -> bool {
    key.is_none_or(|key| key == record.key)
}

impl Buffer {
    fn keep(&mut self, record: Arc<KeptEvent>) {
        if self.records.len() == self.capacity {
            if let Some(oldest) = self.records.pop_front() {
                // That entry's remaining events may still be here: it is no
                // longer complete, so resuming must start after it.
                self.complete_from = self.complete_from.max(oldest.log_index + 1);
            }
        }
        self.records.push_back(record);
    }

    /// Whether every event since the cluster began is kept: the node applied
    /// every entry from index 1 itself and dropped none of their events (the
    /// first entry, index 0, is the initial membership and has no events).
    fn holds_whole_history(&self) -> bool {
        self.complete_from <= 1
    }

    fn restart_at(&mut self, complete_from: u64) {
        self.records.clear();
        self.complete_from = self.complete_from.max(complete_from);
    }
}

/// An applied entry holding one round event per key, for tests of the log and
/// of the stream built on it.
#[cfg(test)]
pub(crate) fn round_entry(index: u64, keys: &[&str]) -> Applied {
    let event = permitd_core::Event::Round {
        timestamp_ms: index,
        requested: 1,
        granted: 1,
        usage: permitd_core::Usage::default(),
    };
    Applied {
        log_index: index,
        keys: keys.iter().map(|key| (*key).to_owned()).collect(),
        events: keys
            .iter()
            .map(|key| ((*key).to_owned(), event.clone()))
            .collect(),
        installed_snapshot: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indexes(subscription: &Subscription) -> Vec<(u64, String)> {
        subscription
            .backlog
            .iter()
            .map(|record| (record.log_index, record.key.clone()))
            .collect()
    }

    #[test]
    fn a_kept_event_is_its_record_as_json() {
        let log = EventLog::with_capacity(0, 10, &EventHub::default());
        let entry = round_entry(7, &["a"]);
        log.push(&entry);
        let kept = &log.subscribe(None, Some(7)).unwrap().backlog[0];
        let record = EventRecord {
            log_index: 7,
            key: "a".into(),
            event: entry.events[0].1.clone(),
        };
        assert_eq!(&*kept.json, serde_json::to_string(&record).unwrap());
        assert_eq!(
            (kept.log_index, kept.key.as_str(), kept.name),
            (7, "a", "round")
        );
    }

    #[test]
    fn a_resume_gets_kept_events_of_its_key_from_its_index() {
        let log = EventLog::with_capacity(10, 100, &EventHub::default());
        log.push(&round_entry(11, &["a", "b"]));
        log.push(&round_entry(12, &["a"]));
        let all = log.subscribe(None, Some(11)).unwrap();
        assert_eq!(indexes(&all).len(), 3);
        let a = log.subscribe(Some("a"), Some(12)).unwrap();
        assert_eq!(indexes(&a), [(12, "a".to_owned())]);
        let live_only = log.subscribe(Some("a"), None).unwrap();
        assert!(live_only.backlog.is_empty());
    }

    #[test]
    fn events_before_start_or_dropped_ones_are_too_far_behind() {
        let log = EventLog::with_capacity(10, 3, &EventHub::default());
        assert_eq!(
            log.subscribe(None, Some(10)).unwrap_err(),
            SubscribeError::TooFarBehind { oldest: 11 }
        );
        log.push(&round_entry(11, &["a", "b"]));
        log.push(&round_entry(12, &["a", "b"]));
        // Index 11's first event was dropped: resuming at 11 would miss it.
        assert_eq!(
            log.subscribe(None, Some(11)).unwrap_err(),
            SubscribeError::TooFarBehind { oldest: 12 }
        );
        assert_eq!(indexes(&log.subscribe(None, Some(12)).unwrap()).len(), 2);
    }

    #[test]
    fn from_zero_streams_everything_while_the_whole_history_is_kept() {
        let log = EventLog::with_capacity(0, 3, &EventHub::default());
        assert!(
            indexes(&log.subscribe(None, Some(0)).unwrap()).is_empty(),
            "a fresh node has nothing yet, but nothing is gone"
        );
        log.push(&round_entry(1, &["a"]));
        log.push(&round_entry(2, &["a", "b"]));
        let all = [
            (1, "a".to_owned()),
            (2, "a".to_owned()),
            (2, "b".to_owned()),
        ];
        assert_eq!(indexes(&log.subscribe(None, Some(0)).unwrap()), all);
        assert_eq!(indexes(&log.subscribe(None, Some(1)).unwrap()), all);
        // Index 1's event is dropped: now events really are gone.
        log.push(&round_entry(3, &["a"]));
        assert_eq!(
            log.subscribe(None, Some(0)).unwrap_err(),
            SubscribeError::TooFarBehind { oldest: 2 }
        );
    }

    #[test]
    fn from_zero_is_too_far_behind_after_a_restart_or_a_snapshot() {
        // Started on state applied by a previous process: its events are gone.
        let restarted = EventLog::with_capacity(5, 100, &EventHub::default());
        assert_eq!(
            restarted.subscribe(None, Some(0)).unwrap_err(),
            SubscribeError::TooFarBehind { oldest: 6 }
        );
        let log = EventLog::with_capacity(0, 100, &EventHub::default());
        log.push(&round_entry(1, &["a"]));
        let mut snapshot = round_entry(9, &[]);
        snapshot.installed_snapshot = true;
        log.push(&snapshot);
        assert_eq!(
            log.subscribe(None, Some(0)).unwrap_err(),
            SubscribeError::TooFarBehind { oldest: 10 }
        );
    }

    #[test]
    fn a_snapshot_or_lost_notices_restart_the_log() {
        let log = EventLog::with_capacity(0, 100, &EventHub::default());
        log.push(&round_entry(1, &["a"]));
        let mut snapshot = round_entry(50, &[]);
        snapshot.installed_snapshot = true;
        log.push(&snapshot);
        assert_eq!(
            log.subscribe(None, Some(1)).unwrap_err(),
            SubscribeError::TooFarBehind { oldest: 51 }
        );
        log.push(&round_entry(51, &["a"]));
        log.lost_notices();
        assert_eq!(
            log.subscribe(None, Some(52)).unwrap_err(),
            SubscribeError::MissedEntries,
            "which entries were missed is unknown until the next one"
        );
        log.push(&round_entry(54, &["a"]));
        assert_eq!(
            log.subscribe(None, Some(51)).unwrap_err(),
            SubscribeError::TooFarBehind { oldest: 54 }
        );
    }

    /// What happens to the log next, in a generated history.
    #[derive(Debug, Clone)]
    enum Step {
        /// An entry with events for these keys (indexes 0..3 name "k0".."k2").
        Entry(Vec<u8>),
        /// A snapshot installed at the next index.
        Snapshot,
        /// Entries whose notices never reached the log, then `lost_notices`.
        Lost(Vec<Vec<u8>>),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        let keys = prop::collection::vec(0u8..3, 0..4);
        prop_oneof![
            8 => keys.clone().prop_map(Step::Entry),
            1 => Just(Step::Snapshot),
            1 => prop::collection::vec(keys, 1..3).prop_map(Step::Lost),
        ]
    }

    fn entry(index: u64, keys: &[u8]) -> Applied {
        let names: Vec<String> = keys.iter().map(|key| format!("k{key}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        round_entry(index, &names)
    }

    proptest::proptest! {
        /// Whatever happened, a resume that is accepted gets exactly the events
        /// of the asked key with index ≥ `from` that the node's entries produced
        /// (none missing, none repeated, in log order); one from past the last
        /// entry is always accepted; the log never holds more than its capacity.
        #[test]
        fn an_accepted_resume_misses_nothing(
            steps in proptest::collection::vec(step(), 1..60),
            capacity in 1usize..12,
            from in 0u64..80,
            key in proptest::option::of(0u8..3),
        ) {
            let log = EventLog::with_capacity(0, capacity, &EventHub::default());
            let mut produced: Vec<(u64, String)> = Vec::new();
            let mut index = 0u64;
            for step in &steps {
                match step {
                    Step::Entry(keys) => {
                        index += 1;
                        log.push(&entry(index, keys));
                        produced.extend(keys.iter().map(|key| (index, format!("k{key}"))));
                    }
                    Step::Snapshot => {
                        index += 1;
                        let mut snapshot = entry(index, &[]);
                        snapshot.installed_snapshot = true;
                        log.push(&snapshot);
                    }
                    Step::Lost(entries) => {
                        for keys in entries {
                            index += 1;
                            produced.extend(keys.iter().map(|key| (index, format!("k{key}"))));
                        }
                        log.lost_notices();
                    }
                }
                proptest::prop_assert!(log.lock().records.len() <= capacity);
            }
            let key = key.map(|key| format!("k{key}"));
            if let Ok(subscription) = log.subscribe(key.as_deref(), Some(from)) {
                let expected: Vec<(u64, String)> = produced
                    .iter()
                    .filter(|(at, name)| *at >= from && key.as_ref().is_none_or(|key| key == name))
                    .cloned()
                    .collect();
                proptest::prop_assert_eq!(indexes(&subscription), expected);
            }
            if !matches!(steps.last(), Some(Step::Lost(_))) {
                proptest::prop_assert!(log.subscribe(key.as_deref(), Some(index + 1)).is_ok());
            }
        }
    }

    #[test]
    fn subscribers_are_bounded_over_every_shard_and_freed_when_dropped() {
        let hub = EventHub::with_max_subscribers(1);
        let first = hub.admit().unwrap();
        assert!(matches!(
            hub.admit(),
            Err(SubscribeError::TooManySubscribers { max: 1 })
        ));
        drop(first);
        assert!(hub.admit().is_ok());
    }

    #[test]
    fn the_shards_of_a_node_stamp_their_entries_in_push_order() {
        let hub = EventHub::default();
        let (zero, one) = (
            EventLog::with_capacity(0, 10, &hub),
            EventLog::with_capacity(0, 10, &hub),
        );
        zero.push(&round_entry(1, &["a", "b"]));
        one.push(&round_entry(1, &["c"]));
        zero.push(&round_entry(2, &["a"]));
        let order = |log: &EventLog| -> Vec<u64> {
            let subscription = log.subscribe(None, Some(0)).unwrap();
            subscription
                .backlog
                .iter()
                .map(|record| record.applied_order)
                .collect()
        };
        assert_eq!((order(&zero), order(&one)), (vec![0, 0, 2], vec![1]));
    }

    #[test]
    fn a_subscription_starts_after_from_or_after_the_last_index_seen() {
        let log = EventLog::with_capacity(0, 10, &EventHub::default());
        log.push(&round_entry(4, &["a"]));
        assert_eq!(log.subscribe(None, None).unwrap().after, 4);
        assert_eq!(log.subscribe(None, Some(3)).unwrap().after, 2);
        assert_eq!(log.subscribe(None, Some(0)).unwrap().after, 0);
    }

    #[test]
    fn live_events_follow_the_backlog_without_repeats() {
        let log = EventLog::with_capacity(0, 10, &EventHub::default());
        log.push(&round_entry(1, &["a"]));
        let mut subscription = log.subscribe(None, Some(1)).unwrap();
        log.push(&round_entry(2, &["a"]));
        assert_eq!(indexes(&subscription), [(1, "a".to_owned())]);
        let next = subscription.live.try_recv().unwrap();
        assert_eq!(next.log_index, 2);
        assert!(subscription.live.try_recv().is_err());
    }
}
