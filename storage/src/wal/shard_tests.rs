//! Tests of several shards in one log: each shard's entries, vote, committed
//! and purge point are its own across rollovers, truncations, purges and
//! reopens; a segment is deleted only once no shard has a live entry in it;
//! one group commit covers every shard's appends.

use std::collections::BTreeMap;
use std::path::Path;

use openraft::{CommittedLeaderId, EntryPayload};
use proptest::prelude::*;
use tokio::sync::oneshot;

use super::*;

/// Small enough that a few dozen entries span many segments.
const TINY_SEGMENT_BYTES: u64 = 300;

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn blanks(term: u64, indexes: std::ops::Range<u64>) -> Vec<Entry<TypeConfig>> {
    indexes
        .map(|index| Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Blank,
        })
        .collect()
}

fn open(dir: &Path) -> Wal {
    let options = WalOptions {
        segment_max_bytes: TINY_SEGMENT_BYTES,
        ..WalOptions::new(Presence::CreateIfMissing)
    };
    Wal::open(dir, options).expect("open the wal")
}

fn append(
    wal: &Wal,
    shard: ShardId,
    entries: Vec<Entry<TypeConfig>>,
) -> oneshot::Receiver<Result<(), SyncFailed>> {
    let (sender, receiver) = oneshot::channel();
    let done: AppendDone = Box::new(move |result| {
        let _ = sender.send(result);
    });
    wal.append(shard, entries, done).expect("append");
    receiver
}

async fn append_synced(wal: &Wal, shard: ShardId, entries: Vec<Entry<TypeConfig>>) {
    append(wal, shard, entries).await.unwrap().expect("synced");
}

fn log_ids(wal: &Wal, shard: ShardId) -> Vec<LogId<NodeId>> {
    let entries = wal.read(shard, .., usize::MAX, u64::MAX).expect("read");
    entries.into_iter().map(|entry| entry.log_id).collect()
}

/// The sequence numbers of the oldest and the newest segment on disk.
fn segment_span(dir: &Path) -> (u64, u64) {
    let listed = segment::list(&crate::disk::OsDisk, dir).unwrap();
    (listed[0].0, listed[listed.len() - 1].0)
}

#[tokio::test]
async fn a_segment_is_deleted_only_once_no_shard_has_a_live_entry_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let wal = open(dir.path());
    // Shard 1 writes a little, then shard 2 a lot: shard 1's entries sit in
    // the first segments, which shard 2's purge must not delete.
    append_synced(&wal, 1, blanks(1, 1..4)).await;
    for index in 1..60 {
        append_synced(&wal, 2, blanks(1, index..index + 1)).await;
    }
    let (oldest, newest) = segment_span(dir.path());
    assert!(
        newest - oldest > 5,
        "{oldest}..={newest}: the test needs rollovers"
    );
    wal.purge(2, log_id(1, 59)).await.unwrap();
    assert_eq!(
        segment_span(dir.path()).0,
        oldest,
        "shard 1 still needs the oldest segment"
    );
    assert_eq!(
        log_ids(&wal, 1),
        vec![log_id(1, 1), log_id(1, 2), log_id(1, 3)]
    );
    wal.purge(1, log_id(1, 3)).await.unwrap();
    let (oldest_left, newest_left) = segment_span(dir.path());
    assert_eq!(oldest_left, newest_left, "only the active segment is left");
    assert!(log_ids(&wal, 2).is_empty());
    drop(wal);

    let wal = open(dir.path());
    assert!(log_ids(&wal, 1).is_empty() && log_ids(&wal, 2).is_empty());
    assert_eq!(wal.last_log_id(1), Some(log_id(1, 3)));
    assert_eq!(wal.last_log_id(2), Some(log_id(1, 59)));
}

#[tokio::test]
async fn one_group_commit_covers_appends_of_many_shards() {
    const SHARDS: ShardId = 8;
    const ROUNDS: u64 = 60;
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), WalOptions::new(Presence::CreateIfMissing)).unwrap();
    let (_, fdatasyncs_before) = wal.sync_counts();
    let mut pending = Vec::new();
    for index in 1..=ROUNDS {
        for shard in 0..SHARDS {
            pending.push(append(&wal, shard, blanks(1, index..index + 1)));
        }
    }
    for receiver in pending {
        receiver.await.unwrap().expect("synced");
    }
    let fdatasyncs = wal.sync_counts().1 - fdatasyncs_before;
    let appends = ROUNDS * u64::from(SHARDS);
    assert!(
        fdatasyncs < appends,
        "{fdatasyncs} fdatasyncs for {appends} appends"
    );
    for shard in 0..SHARDS {
        assert_eq!(log_ids(&wal, shard).len() as u64, ROUNDS);
    }
}

/// One step on one shard of the log.
#[derive(Debug, Clone)]
enum Step {
    /// Appends `count` entries of `term`, starting `back` entries before the end.
    Append {
        shard: ShardId,
        back: u64,
        count: u64,
        term: u64,
    },
    /// Truncates `back` entries before the end.
    Truncate {
        shard: ShardId,
        back: u64,
    },
    /// Purges through `ahead` entries past the first live one.
    Purge {
        shard: ShardId,
        ahead: u64,
    },
    Vote {
        shard: ShardId,
        term: u64,
    },
    Commit {
        shard: ShardId,
        back: u64,
    },
    /// Closes and opens the log again.
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    let shard = 0..3 as ShardId;
    prop_oneof![
        6 => (shard.clone(), 0..3u64, 1..6u64, 1..4u64)
            .prop_map(|(shard, back, count, term)| Step::Append { shard, back, count, term }),
        1 => (shard.clone(), 0..4u64).prop_map(|(shard, back)| Step::Truncate { shard, back }),
        1 => (shard.clone(), 0..8u64).prop_map(|(shard, ahead)| Step::Purge { shard, ahead }),
        1 => (shard.clone(), 1..9u64).prop_map(|(shard, term)| Step::Vote { shard, term }),
        1 => (shard, 0..3u64).prop_map(|(shard, back)| Step::Commit { shard, back }),
        1 => Just(Step::Reopen),
    ]
}

/// What one shard's log must hold.
#[derive(Debug, Default, Clone, PartialEq)]
struct Model {
    entries: Vec<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

impl Model {
    /// The index after the last entry (or after the purge point).
    fn end(&self) -> u64 {
        let last = self.entries.last().copied().max(self.purged);
        last.map_or(1, |last| last.index + 1)
    }

    fn first(&self) -> u64 {
        self.entries
            .first()
            .map_or_else(|| self.end(), |first| first.index)
    }
}

/// Runs one step other than a reopen on the log and on the model.
async fn run(wal: &Wal, models: &mut BTreeMap<ShardId, Model>, step: Step) {
    match step {
        Step::Append {
            shard,
            back,
            count,
            term,
        } => {
            let model = models.entry(shard).or_default();
            let start = model.end().saturating_sub(back).max(model.first());
            // A term never goes down along a log, the purged part included.
            let last = model.entries.last().copied().max(model.purged);
            let term = last.map_or(term, |last| last.leader_id.term.max(term));
            let entries = blanks(term, start..start + count);
            model.entries.retain(|id| id.index < start);
            model
                .entries
                .extend(entries.iter().map(|entry| entry.log_id));
            append_synced(wal, shard, entries).await;
        }
        Step::Truncate { shard, back } => {
            let model = models.entry(shard).or_default();
            let at = model.end().saturating_sub(back).max(model.first());
            model.entries.retain(|id| id.index < at);
            wal.truncate(shard, at).await.unwrap();
        }
        Step::Purge { shard, ahead } => {
            let model = models.entry(shard).or_default();
            let Some(&through) = model.entries.get(ahead as usize) else {
                return;
            };
            model.entries.retain(|id| id.index > through.index);
            model.purged = model.purged.max(Some(through));
            wal.purge(shard, through).await.unwrap();
        }
        Step::Vote { shard, term } => {
            let vote = Vote::new(term, 1);
            models.entry(shard).or_default().vote = Some(vote);
            wal.save_vote(shard, vote).await.unwrap();
        }
        Step::Commit { shard, back } => {
            let model = models.entry(shard).or_default();
            let at = model.entries.len().saturating_sub(1 + back as usize);
            let committed = model.entries.get(at).copied();
            model.committed = committed;
            wal.save_committed(shard, committed).unwrap();
            // It becomes durable with the next sync: a truncation that drops
            // nothing waits for one.
            wal.truncate(shard, model.end()).await.unwrap();
        }
        Step::Reopen => unreachable!("the caller reopens"),
    }
}

fn check(wal: &Wal, models: &BTreeMap<ShardId, Model>) -> Result<(), TestCaseError> {
    for (&shard, model) in models {
        prop_assert_eq!(&log_ids(wal, shard), &model.entries, "shard {}", shard);
        let raft = wal.raft_state(shard);
        prop_assert_eq!(raft.purged, model.purged, "shard {}", shard);
        prop_assert_eq!(raft.vote, model.vote, "shard {}", shard);
        prop_assert_eq!(raft.committed, model.committed, "shard {}", shard);
        let last = model.entries.last().copied().max(model.purged);
        prop_assert_eq!(wal.last_log_id(shard), last, "shard {}", shard);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever the steps, each shard reads back what a plain model of its own
    /// log says, before and after every reopen.
    #[test]
    fn every_shard_keeps_its_own_log_across_rollovers_and_reopens(
        steps in proptest::collection::vec(step(), 1..50)
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut wal = open(dir.path());
        let mut models: BTreeMap<ShardId, Model> = BTreeMap::new();
        for step in steps {
            if let Step::Reopen = step {
                // Dropping the log joins its sync thread first.
                drop(wal);
                wal = open(dir.path());
            } else {
                runtime.block_on(run(&wal, &mut models, step));
            }
            check(&wal, &models)?;
        }
        drop(wal);
        let wal = open(dir.path());
        check(&wal, &models)?;
    }
}
