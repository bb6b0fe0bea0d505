//! A leader-only task's view of the applied-entry notices: subscribed while
//! this node leads its shard, dropped while it follows.
//!
//! Every subscriber of a shard's notices is woken once per applied entry. The
//! leader-only tasks (the reclaim timers, the rounds driver's waker) ignore
//! them on a follower. When they ran on the API runtime, each entry woke that
//! runtime's thread on every follower for nothing (551–592 switches/s against
//! 115 without, in the bench's 1-client row: `scripts/thread-switches`; each
//! follower's CPU per entry ~10 % higher). They run on the Raft runtime now
//! (`shard.rs`), and a follower's feed still holds no receiver: a notice no
//! task wants wakes no task.
//!
//! A feed subscribes when its task sees leadership begin, so notices of entries
//! applied before that are not seen: each task says what it does about them
//! (the reclaimer rebuilds from the state, the waker wakes every held key).

use std::sync::Arc;

use permitd_storage::{Applied, SharedState};
use tokio::sync::broadcast::{self, error::RecvError};

type Notices = broadcast::Receiver<Arc<Applied>>;

/// Notices of a shard's applied entries while [`AppliedFeed::follow`] says
/// this node leads.
pub struct AppliedFeed {
    subscribe: Box<dyn Fn() -> Notices + Send>,
    notices: Option<Notices>,
}

impl std::fmt::Debug for AppliedFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppliedFeed")
            .field("subscribed", &self.notices.is_some())
            .finish_non_exhaustive()
    }
}

/// What [`AppliedFeed::follow`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedChange {
    /// Subscribed just now: notices before this were not seen.
    Started,
    /// Dropped its receiver: this node stopped leading.
    Stopped,
    /// Nothing: the feed already matched the leadership.
    Unchanged,
}

impl AppliedFeed {
    /// A feed of `state`'s notices, not yet subscribed.
    pub fn new(state: SharedState) -> Self {
        Self::of(move || state.subscribe())
    }

    /// A feed whose receivers `subscribe` makes.
    fn of(subscribe: impl Fn() -> Notices + Send + 'static) -> Self {
        Self {
            subscribe: Box::new(subscribe),
            notices: None,
        }
    }

    /// Subscribes while `leading`, drops the receiver otherwise.
    pub fn follow(&mut self, leading: bool) -> FeedChange {
        match (leading, self.notices.is_some()) {
            (true, false) => {
                self.notices = Some((self.subscribe)());
                FeedChange::Started
            }
            (false, true) => {
                self.notices = None;
                FeedChange::Stopped
            }
            _ => FeedChange::Unchanged,
        }
    }

    /// The next notice; pending for ever while not subscribed (a `select!`
    /// branch that never fires).
    pub async fn recv(&mut self) -> Result<Arc<Applied>, RecvError> {
        match &mut self.notices {
            Some(notices) => notices.recv().await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_follower_feed_holds_no_receiver_and_a_leader_feed_sees_entries_from_its_start() {
        let (sender, _) = broadcast::channel(8);
        let mut feed = AppliedFeed::of({
            let sender = sender.clone();
            move || sender.subscribe()
        });
        let notice = |log_index| {
            Arc::new(Applied {
                log_index,
                keys: Vec::new(),
                events: Vec::new(),
                installed_snapshot: false,
            })
        };
        let _ = sender.send(notice(6));
        assert_eq!(sender.receiver_count(), 0);
        let idle = tokio::time::timeout(Duration::from_millis(10), feed.recv()).await;
        assert!(idle.is_err(), "an unsubscribed feed never yields");

        assert_eq!(feed.follow(true), FeedChange::Started);
        assert_eq!(feed.follow(true), FeedChange::Unchanged);
        assert_eq!(sender.receiver_count(), 1);
        let _ = sender.send(notice(7));
        let first = feed.recv().await.expect("a notice");
        assert_eq!(first.log_index, 7, "notices from the subscription on");

        assert_eq!(feed.follow(false), FeedChange::Stopped);
        assert_eq!(sender.receiver_count(), 0, "a follower's feed wakes nobody");
        assert_eq!(feed.follow(false), FeedChange::Unchanged);
    }
}
