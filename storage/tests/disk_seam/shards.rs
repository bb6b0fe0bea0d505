//! Power cuts of a store of several shards on the fake disk: whatever any
//! shard was told is durable (an append's flush, a vote, a truncation) is
//! there after the cut, and nothing comes back that its shard never wrote or
//! truncated away, whichever shard's sync happened to carry it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, Vote};
use permitd_storage::{open_shards, NodeId, Opened, TypeConfig};

use super::common::Rng;
use super::fake_disk::FakeDisk;
use super::{options, poll_once, DIR};

const SHARDS: u32 = 3;

/// What one shard was told, and what it wrote.
#[derive(Debug, Default, Clone)]
struct Model {
    /// Every entry written and not truncated away, synced or not.
    written: Vec<LogId<NodeId>>,
    /// How many of `written` were acknowledged: they must survive.
    acknowledged: usize,
    vote: Option<Vote<NodeId>>,
    /// The highest term used, so a new write never reuses an old log id.
    term: u64,
}

type Pending = Pin<Box<dyn Future<Output = ()>>>;

fn entries(term: u64, from: u64, count: u64) -> Vec<Entry<TypeConfig>> {
    (from..from + count)
        .map(|index| Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 0), index),
            payload: EntryPayload::Blank,
        })
        .collect()
}

async fn open_all(disk: &Arc<FakeDisk>) -> Vec<Opened> {
    open_shards(&options(disk, DIR), SHARDS)
        .await
        .unwrap_or_else(|error| panic!("open {SHARDS} shards: {error}"))
}

/// One random step on one random shard.
async fn step(
    rng: &mut Rng,
    shards: &mut [Opened],
    models: &mut [Model],
    pending: &mut Vec<Pending>,
) {
    let shard = rng.below(u64::from(SHARDS)) as usize;
    let (opened, model) = (&mut shards[shard], &mut models[shard]);
    model.term += 1;
    let next = model.written.len() as u64 + 1;
    match rng.below(10) {
        // An append that returns once synced.
        0..=3 => {
            let batch = entries(model.term, next, 1 + rng.below(4));
            model.written.extend(batch.iter().map(|entry| entry.log_id));
            opened.log.blocking_append(batch).await.unwrap();
            model.acknowledged = model.written.len();
        }
        // An append written to the page cache and never waited for.
        4..=6 => {
            let batch = entries(model.term, next, 1 + rng.below(4));
            model.written.extend(batch.iter().map(|entry| entry.log_id));
            let mut writer = opened.log.clone();
            let mut append: Pending = Box::pin(async move {
                writer.blocking_append(batch).await.unwrap();
            });
            assert!(poll_once(append.as_mut()).is_pending());
            pending.push(append);
        }
        7 => {
            let vote = Vote::new(model.term, 1);
            opened.log.save_vote(&vote).await.unwrap();
            model.vote = Some(vote);
        }
        // A truncation of the last few entries, which returns once synced.
        _ => {
            let keep = model
                .written
                .len()
                .saturating_sub(1 + rng.below(3) as usize);
            let Some(&from) = model.written.get(keep) else {
                return;
            };
            opened.log.truncate(from).await.unwrap();
            model.written.truncate(keep);
            model.acknowledged = model.acknowledged.min(keep);
        }
    }
}

async fn check(shards: &mut [Opened], models: &[Model], seed: u64) {
    for (shard, (opened, model)) in shards.iter_mut().zip(models).enumerate() {
        let found: Vec<LogId<NodeId>> = opened
            .log
            .limited_get_log_entries(0, 100_000)
            .await
            .unwrap()
            .iter()
            .map(|entry| entry.log_id)
            .collect();
        let context = format!("seed {seed}, shard {shard}: found {found:?}, model {model:?}");
        assert!(
            found.len() >= model.acknowledged,
            "an acknowledged entry was lost: {context}"
        );
        assert_eq!(
            found[..],
            model.written[..found.len()],
            "an entry came back that was never written or was truncated away: {context}"
        );
        assert_eq!(
            opened.log.read_vote().await.unwrap(),
            model.vote,
            "{context}"
        );
    }
}

/// 60 seeds of 40 random steps, with a power cut after every 10.
#[tokio::test]
async fn a_power_cut_loses_no_shard_anything_it_acknowledged() {
    for seed in 1..=60 {
        let disk = FakeDisk::new();
        let mut rng = Rng::new(seed);
        let mut shards = open_all(&disk).await;
        let mut models = vec![Model::default(); SHARDS as usize];
        let mut pending: Vec<Pending> = Vec::new();
        for _ in 0..4 {
            for _ in 0..10 {
                step(&mut rng, &mut shards, &mut models, &mut pending).await;
            }
            disk.crash();
            pending.clear();
            drop(shards);
            shards = open_all(&disk).await;
            check(&mut shards, &models, seed).await;
            // What survived is now what each shard holds: the unacknowledged
            // entries it kept count as written and acknowledged from here on.
            for (opened, model) in shards.iter_mut().zip(&mut models) {
                let kept = opened.log.get_log_state().await.unwrap().last_log_id;
                let kept = kept.map_or(0, |id| id.index as usize);
                model.written.truncate(kept);
                model.acknowledged = kept;
            }
        }
        super::assert_only_this_thread(&disk);
    }
}
