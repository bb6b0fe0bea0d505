//! Commit notices ride the next append: an empty append that only tells a
//! follower a new commit index is answered here, not sent, when its answer is
//! already known.
//!
//! openraft 0.9's leader tells every follower of each new commit index at once.
//! When an entry commits, each follower's replication stream, idle since the
//! follower answered the entry's append, sends an empty append that carries
//! nothing but the new index. That is a second round trip per follower per
//! entry: a follower's Raft thread took two appends per entry (an strace of the
//! bench's 1-client row: 682 bytes with the entry, then 346 with the commit
//! index, each with its write to the log, its answer and its wake-ups on both
//! nodes). And openraft sends a follower nothing else while an append is
//! unanswered, so the next entry waited behind it.
//!
//! Raft needs neither. The leader includes its commit index in every later
//! append and heartbeat; a follower that learns it later only applies later.
//! What is committed is decided by the leader's count of the followers'
//! answers, and this leaves that count as it was: the empty append moves no
//! follower's matched index, so its answer adds nothing to it.
//!
//! The answer is known when all of these hold, and only then is it held:
//! - the append is empty and its commit index is news: it differs from the
//!   one of the request before it on this connection. A heartbeat repeats it
//!   and is always sent: it is what keeps the follower hearing its leader.
//! - the follower answered `Success` on this connection, within
//!   [`ANSWERED_WITHIN`], to an append of the same vote that ended at this
//!   append's previous log id. It held that entry then, and a follower's log
//!   below what it accepted from its leader changes only with a new vote, so
//!   it holds it still, and Raft's consistency check would pass.
//! - no append with entries is still being sent on this connection (openraft
//!   stopped waiting for it): then the follower may be slow, and an empty
//!   append is how openraft keeps it hearing from its leader.
//! - every entry it commits that this connection carried since the last
//!   commit index it sent is a round, a sync or a reclaim: what only the
//!   leader acts on. Anything else (a token, the defaults, a key's
//!   configuration, a membership, a restore) is news a follower acts on
//!   itself: it checks tokens for the event streams it serves and, at several
//!   shards, for every call its shards take, and each shard's leader copies
//!   the defaults from its own replica of the meta shard. A token created
//!   through one node and used at once through another was refused while the
//!   follower waited for the next heartbeat (`tests/tests/batch.rs` at 8
//!   shards, in CI), so such notices go at once, as before.
//!
//! The follower learns the index from the next append with entries, or from
//! the next heartbeat, which openraft sends every heartbeat interval (each
//! carries the index; the first after a held notice goes at once even where
//! heartbeats are coalesced: `raft/network.rs`, `Connection::coalesces`).
//! So a follower's applied index lags its leader's by at most one heartbeat
//! interval after the last entry of a burst; under load the next entry
//! carries it within an entry's time.
//!
//! openraft records a held notice as answered at the time it asked. That
//! overstates how recently the follower answered by at most
//! [`ANSWERED_WITHIN`]; it shows in the quorum acknowledgement age of the
//! metrics, which nothing decides on, and never in a linearizable read, which
//! openraft checks with heartbeats on new connections, none of which has an
//! answer to reuse.

use openraft::raft::AppendEntriesRequest;
use openraft::{EntryPayload, LogId, Vote};
use permitd_storage::{Command, NodeId, TypeConfig};
use tokio::time::{Duration, Instant};

/// Empty appends that only told a follower a new commit index, answered
/// without being sent.
pub const COMMIT_NOTICES_HELD: &str = "permitd_raft_commit_notices_held_total";

/// How recent the follower's answer must be for a notice to be held. A commit
/// index moves when a quorum answered, so the notice follows the answer it
/// rides on within the leader's turn (well under a millisecond under load);
/// this bounds how much younger openraft believes the follower's last answer
/// to be than it is.
pub const ANSWERED_WITHIN: Duration = Duration::from_millis(10);

/// What one connection to a follower knows of the follower's last answer and
/// of what openraft last asked it.
#[derive(Debug, Default)]
pub struct CommitRide {
    /// The commit index of the last request openraft made on this connection.
    asked: Option<Option<LogId<NodeId>>>,
    /// The last `Success`: the append's vote, the last log id it covered, when.
    answered: Option<(Vote<NodeId>, Option<LogId<NodeId>>, Instant)>,
    /// The highest index of an entry carried here that followers act on
    /// ([`is_news_to_followers`]), until a commit index past it is sent.
    news_at: Option<u64>,
}

impl CommitRide {
    /// Whether `request` is a commit notice that need not be sent (the module
    /// docs): its answer is `Success`. Notes the request's commit index either
    /// way. `sending` says an append with entries is still being sent.
    pub fn holds(
        &mut self,
        request: &AppendEntriesRequest<TypeConfig>,
        sending: bool,
        now: Instant,
    ) -> bool {
        let moved = self.asked != Some(request.leader_commit);
        self.asked = Some(request.leader_commit);
        let news = request
            .entries
            .iter()
            .filter(|entry| is_news_to_followers(entry));
        if let Some(last) = news.map(|entry| entry.log_id.index).max() {
            self.news_at = self.news_at.max(Some(last));
        }
        let commit = request.leader_commit.map(|id| id.index);
        let tells_news = self.news_at.is_some_and(|news| commit >= Some(news));
        if tells_news {
            self.news_at = None; // this request tells it: it goes
        }
        moved
            && request.entries.is_empty()
            && !sending
            && !tells_news
            && self.answered.is_some_and(|(vote, last, at)| {
                vote == request.vote
                    && last == request.prev_log_id
                    && now.saturating_duration_since(at) <= ANSWERED_WITHIN
            })
    }

    /// The follower answered `Success` to `request`, sent at `now` or before.
    pub fn answered(&mut self, request: (Vote<NodeId>, Option<LogId<NodeId>>), now: Instant) {
        let (vote, last) = request;
        self.answered = Some((vote, last, now));
    }
}

/// The vote of `request` and the last log id it covers: its last entry's, or
/// its previous one when it carries none.
pub fn covered(
    request: &AppendEntriesRequest<TypeConfig>,
) -> (Vote<NodeId>, Option<LogId<NodeId>>) {
    let last = request
        .entries
        .last()
        .map(|entry| entry.log_id)
        .or(request.prev_log_id);
    (request.vote, last)
}

/// Whether followers act on `entry` once they learn it committed: anything
/// but a round, a sync or a reclaim, which only the leader acts on.
fn is_news_to_followers(entry: &openraft::Entry<TypeConfig>) -> bool {
    match &entry.payload {
        EntryPayload::Normal(command) => !matches!(
            **command,
            Command::Round { .. } | Command::Sync { .. } | Command::Reclaim { .. }
        ),
        EntryPayload::Membership(_) => true,
        EntryPayload::Blank => false,
    }
}

pub fn describe() {
    metrics::describe_counter!(
        COMMIT_NOTICES_HELD,
        "Empty appends that only carried a new commit index, not sent: the follower had just answered, and learns the index from the next append or heartbeat."
    );
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn log_id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(2, 1), index)
    }

    fn empty(prev: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(log_id(prev)),
            leader_commit: Some(log_id(commit)),
            entries: Vec::new(),
        }
    }

    /// A ride whose follower answered an append up to entry 5, committed 4.
    fn answered_up_to_5(at: Instant) -> CommitRide {
        let mut ride = CommitRide::default();
        let mut append = empty(4, 4);
        append.entries.push(openraft::Entry {
            log_id: log_id(5),
            payload: EntryPayload::Blank,
        });
        assert!(!ride.holds(&append, false, at), "entries always go");
        ride.answered(covered(&append), at);
        ride
    }

    #[test]
    fn a_new_commit_index_just_after_a_success_is_held_and_a_heartbeat_never() {
        let now = Instant::now();
        let mut ride = answered_up_to_5(now);
        assert!(ride.holds(&empty(5, 5), false, now), "the commit notice");
        assert!(
            !ride.holds(&empty(5, 5), false, now),
            "the heartbeat after it"
        );
        assert!(!ride.holds(&empty(5, 5), false, now), "and every one after");
    }

    #[test]
    fn a_notice_that_commits_an_entry_followers_act_on_goes_at_once() {
        let now = Instant::now();
        let mut ride = CommitRide::default();
        let mut token = empty(4, 4);
        token.entries.push(openraft::Entry {
            log_id: log_id(5),
            payload: EntryPayload::Normal(
                permitd_storage::EncodedCommand::new(Command::RevokeToken { id: 7 })
                    .expect("encodes"),
            ),
        });
        assert!(!ride.holds(&token, false, now));
        ride.answered(covered(&token), now);
        let mut round = empty(5, 4);
        round.entries.push(openraft::Entry {
            log_id: log_id(6),
            payload: EntryPayload::Normal(
                permitd_storage::EncodedCommand::new(Command::Reclaim {
                    now_ms: 1,
                    keys: vec!["k".into()],
                })
                .expect("encodes"),
            ),
        });
        assert!(!ride.holds(&round, false, now));
        ride.answered(covered(&round), now);
        assert!(
            !ride.holds(&empty(6, 5), false, now),
            "commits the revocation"
        );
        assert!(
            ride.holds(&empty(6, 6), false, now),
            "commits the reclaim only"
        );
    }

    #[test]
    fn nothing_is_held_before_any_success() {
        let mut ride = CommitRide::default();
        assert!(!ride.holds(&empty(5, 5), false, Instant::now()));
    }

    #[test]
    fn a_notice_is_sent_when_the_success_is_old_or_of_another_vote_or_entry() {
        let now = Instant::now();
        let mut ride = answered_up_to_5(now);
        let late = now + ANSWERED_WITHIN + Duration::from_millis(1);
        assert!(
            !ride.holds(&empty(5, 5), false, late),
            "answered too long ago"
        );

        let mut ride = answered_up_to_5(now);
        assert!(
            !ride.holds(&empty(4, 5), false, now),
            "another previous entry"
        );

        let mut ride = answered_up_to_5(now);
        let mut other_vote = empty(5, 5);
        other_vote.vote = Vote::new_committed(3, 1);
        assert!(!ride.holds(&other_vote, false, now), "another vote");
    }

    #[test]
    fn a_notice_is_sent_while_an_append_is_still_being_sent() {
        let now = Instant::now();
        let mut ride = answered_up_to_5(now);
        assert!(!ride.holds(&empty(5, 5), true, now));
    }
}
