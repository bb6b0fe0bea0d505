//! Elections the faults explain: a leader that nothing disturbed keeps its term.
//!
//! permitd's election guard (`node/src/raft/election_guard.rs`) exists so that
//! a healthy leader is never deposed: a node stands only after a pre-vote that a
//! majority grants, and a voter that hears its leader, or is already in the
//! term the asker would stand in, refuses. A broken guard loses no data, so the
//! budget and fence checkers cannot see it; what it costs is a failover (every
//! parked request fails) where none was needed. This checker makes that
//! visible: once a node leads term `t`, a higher term may only appear after
//! something happened to the cluster since that node was elected. "Something"
//! is any event on the [`Disturbances`] timeline: a fault beginning or ending, a
//! node restarted, a node whose core stopped on its own (a failed sync).
//!
//! Strict on purpose: a fault that began before the election and still holds
//! (the old leader's crash) does not explain a later one. In a cluster of
//! three, the faults the nemesis injects cannot make a majority lose an
//! elected leader without a new event: a link that carried the votes carries
//! the heartbeats. "The election" starts when its term is first seen, not
//! when its winner is first seen leading: between the votes and the winner
//! taking office (its own vote synced on a slow disk) a partition may cut
//! the very links that carried them, and the winner leads nobody (soak seed
//! 4154: node2 took office 56 ms after its link to its last voter was cut).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use permitd_storage::NodeId;

use crate::checker::Violation;

/// What was seen of one term.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TermSeen {
    /// When any node was first seen in this term.
    pub first_seen: Option<Duration>,
    /// When a node was first seen leading it, and which.
    pub led: Option<(Duration, NodeId)>,
    /// Every node seen leading it, in the order they were first seen.
    pub leaders: Vec<NodeId>,
}

/// Every term seen, by shard and number; shared by every node's watchers.
/// Each shard is a Raft group of its own, with terms of its own.
#[derive(Debug, Clone, Default)]
pub struct TermsSeen(Arc<Mutex<BTreeMap<u32, BTreeMap<u64, TermSeen>>>>);

impl TermsSeen {
    /// Notes node `id` seen in `shard`'s `term` at `at`, leading it or not.
    pub fn saw(&self, shard: u32, term: u64, id: NodeId, leading: bool, at: Duration) {
        let mut terms = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seen = terms.entry(shard).or_default().entry(term).or_default();
        seen.first_seen.get_or_insert(at);
        if leading {
            seen.led.get_or_insert((at, id));
            if !seen.leaders.contains(&id) {
                seen.leaders.push(id);
            }
        }
    }

    /// Every shard's terms.
    pub fn snapshot(&self) -> BTreeMap<u32, BTreeMap<u64, TermSeen>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// When anything happened to the cluster that may explain an election: faults,
/// restarts and stops touch every shard; a handover, or a leader leaving the
/// voters of its shard (a membership change goes shard by shard), touches its
/// own shard.
#[derive(Debug, Clone, Default)]
pub struct Disturbances(Arc<Mutex<DisturbanceLog>>);

#[derive(Debug, Default)]
struct DisturbanceLog {
    cluster: BTreeSet<Duration>,
    in_shard: BTreeMap<u32, BTreeSet<Duration>>,
}

impl Disturbances {
    /// Something that touched every shard.
    pub fn at(&self, at: Duration) {
        self.log().cluster.insert(at);
    }

    /// Something that touched `shard` alone: its leader handing it over, or
    /// leaving its voters; an election on purpose.
    pub fn in_shard(&self, shard: u32, at: Duration) {
        self.log().in_shard.entry(shard).or_default().insert(at);
    }

    /// What may explain an election in `shard`.
    pub fn for_shard(&self, shard: u32) -> BTreeSet<Duration> {
        let log = self.log();
        let own = log.in_shard.get(&shard).into_iter().flatten();
        log.cluster.iter().chain(own).copied().collect()
    }

    /// What may explain anything: a request's wait crosses shards only
    /// through its key, and the liveness checks do not map keys to shards.
    pub fn snapshot(&self) -> BTreeSet<Duration> {
        let log = self.log();
        let in_shards = log.in_shard.values().flatten();
        log.cluster.iter().chain(in_shards).copied().collect()
    }

    fn log(&self) -> std::sync::MutexGuard<'_, DisturbanceLog> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Leaders of one term come in increasing node order. permitd builds
/// openraft without `single-term-leader`: a leader is named by (term, node),
/// so a candidate of a higher node id may win a term another node led, which
/// is safe (its vote is greater); a lower one may not.
pub fn check_leaders_per_term(terms: &BTreeMap<u64, TermSeen>) -> Vec<Violation> {
    terms
        .iter()
        .filter(|(_, seen)| seen.leaders.windows(2).any(|pair| pair[0] >= pair[1]))
        .map(|(term, seen)| Violation {
            kind: "leaders_out_of_order",
            detail: format!(
                "term {term}: led by nodes {:?}, in that order",
                seen.leaders
            ),
        })
        .collect()
}

/// A led term followed by a higher one with no disturbance in between.
pub fn check_explained(
    terms: &BTreeMap<u64, TermSeen>,
    disturbances: &BTreeSet<Duration>,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (term, seen) in terms {
        let Some((elected, leader)) = seen.led else {
            continue;
        };
        let election = seen.first_seen.unwrap_or(elected).min(elected);
        let next = terms
            .range(term + 1..)
            .filter_map(|(next, seen)| Some((*next, seen.first_seen?)))
            .min_by_key(|(_, at)| *at);
        let Some((next, deposed)) = next else {
            continue;
        };
        // From the election's start (see the module's doc); a next term
        // begun even earlier is looked at from that moment on.
        let (from, to) = (election.min(deposed), elected.max(deposed));
        let explained = disturbances.range(from..=to).next().is_some();
        if !explained {
            violations.push(Violation {
                kind: "unexplained_election",
                detail: format!(
                    "node{leader} led term {term} from {elected:?}; term {next} began at \
                     {deposed:?} with no fault, restart or stop in between"
                ),
            });
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn term(first: u64, led: Option<(u64, NodeId)>) -> TermSeen {
        TermSeen {
            first_seen: Some(ms(first)),
            led: led.map(|(at, id)| (ms(at), id)),
            leaders: led.map(|(_, id)| id).into_iter().collect(),
        }
    }

    #[test]
    fn a_term_led_by_a_lower_node_after_a_higher_one_is_caught() {
        let seen = TermsSeen::default();
        seen.saw(0, 6, 1, true, ms(10));
        seen.saw(0, 6, 3, true, ms(20));
        // Another shard's term 7 is a term of its own.
        seen.saw(1, 7, 2, true, ms(25));
        assert!(check_leaders_per_term(&seen.snapshot()[&0]).is_empty());
        seen.saw(0, 7, 3, true, ms(30));
        seen.saw(0, 7, 2, true, ms(40));
        assert!(check_leaders_per_term(&seen.snapshot()[&1]).is_empty());
        assert_eq!(
            check_leaders_per_term(&seen.snapshot()[&0])[0].kind,
            "leaders_out_of_order"
        );
    }

    #[test]
    fn a_leader_deposed_with_nothing_happening_is_caught() {
        let terms = BTreeMap::from([(2, term(100, Some((120, 1)))), (3, term(900, None))]);
        let quiet = BTreeSet::from([ms(50)]);
        assert_eq!(
            check_explained(&terms, &quiet)[0].kind,
            "unexplained_election"
        );
        let crash_after = BTreeSet::from([ms(50), ms(500)]);
        assert!(check_explained(&terms, &crash_after).is_empty());
    }

    #[test]
    fn a_handover_explains_elections_in_its_own_shard_only() {
        let log = Disturbances::default();
        log.at(ms(50));
        log.in_shard(2, ms(500));
        let terms = BTreeMap::from([(2, term(100, Some((120, 1)))), (3, term(900, None))]);
        assert!(check_explained(&terms, &log.for_shard(2)).is_empty());
        assert_eq!(
            check_explained(&terms, &log.for_shard(1))[0].kind,
            "unexplained_election"
        );
        assert!(log.snapshot().contains(&ms(500)));
    }

    #[test]
    fn a_fault_between_the_votes_and_the_winner_taking_office_explains_its_fall() {
        // Term 2 first seen at 5,010 ms, its winner leading from 5,305 ms;
        // a partition began at 5,249 ms, between the two.
        let terms = BTreeMap::from([(2, term(5_010, Some((5_305, 2)))), (3, term(5_515, None))]);
        let cut_before_office = BTreeSet::from([ms(5_249)]);
        assert!(check_explained(&terms, &cut_before_office).is_empty());
        let before_the_election = BTreeSet::from([ms(4_310)]);
        assert_eq!(
            check_explained(&terms, &before_the_election)[0].kind,
            "unexplained_election"
        );
    }

    #[test]
    fn terms_without_a_leader_and_the_last_term_need_no_explaining() {
        let terms = BTreeMap::from([(2, term(100, None)), (3, term(200, Some((210, 2))))]);
        assert!(check_explained(&terms, &BTreeSet::new()).is_empty());
    }
}
