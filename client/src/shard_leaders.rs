//! Which node leads each shard, as the answers said: the table behind a keyed
//! call's first pick in a cluster of several shards ([`crate::leader`] holds it).
//!
//! A cluster of S shards runs S Raft groups, each with its own leader, and a
//! key's calls are served by the leader of `shard_of(key, S)`
//! ([`permitd_core::shard::shard_of`]). Every v1 answer names the shard that
//! answered ([`permitd_core::contract::headers::SHARD`]) and that shard's leader
//! ([`permitd_core::contract::headers::LEADER`]); answers of clusters of more
//! than one shard add the count ([`permitd_core::contract::headers::SHARDS`]).
//! This table remembers the count and one leader per shard, so that a call
//! for a key goes to its shard's leader instead of taking a forwarding hop.
//!
//! Invariants:
//! - the count is in `1..=`[`MAX_SHARDS`], 1 until an answer says otherwise;
//!   a bigger or zero count is ignored, so the table never holds more than
//!   [`MAX_SHARDS`] entries;
//! - there is exactly one entry per shard of the current count; a new count
//!   forgets every entry (shard numbers of another count name other key sets).

use permitd_core::shard::{shard_of, MAX_SHARDS};

/// The shard that serves calls naming no key (tokens, defaults, membership):
/// its leader is the one the client follows for them.
pub const META_SHARD: u32 = 0;

/// Where a shard's leader is, as an answer named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardLeader {
    /// A node id (what permitd sends): asked once an endpoint is known to be it.
    Node(u64),
    /// An endpoint, by its position in the tracker's endpoint list (which only
    /// grows, so a position never changes meaning).
    Endpoint(usize),
}

/// What an answer's shard headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHint {
    /// The shard that answered; `None` on an answer that covered every shard
    /// (a listing, a batch).
    pub shard: Option<u32>,
    /// The cluster's shard count (1 when the answer named a shard but no count).
    pub shards: u32,
}

/// The shard count and each shard's known leader.
#[derive(Debug, Clone)]
pub struct ShardLeaders {
    /// Position k holds shard k's leader, if known; as long as the count.
    leaders: Vec<Option<ShardLeader>>,
}

impl Default for ShardLeaders {
    fn default() -> Self {
        Self::new()
    }
}

impl ShardLeaders {
    /// One shard, its leader unknown.
    pub fn new() -> Self {
        Self {
            leaders: vec![None],
        }
    }

    /// The shard count the table follows.
    pub fn count(&self) -> u32 {
        u32::try_from(self.leaders.len()).expect("at most MAX_SHARDS entries")
    }

    /// Takes `count` as the cluster's shard count; a count outside
    /// `1..=MAX_SHARDS` is ignored. Returns whether the count changed (every
    /// entry was forgotten then).
    pub fn learn_count(&mut self, count: u32) -> bool {
        if !(1..=MAX_SHARDS).contains(&count) || count == self.count() {
            return false;
        }
        self.leaders = vec![None; count as usize];
        true
    }

    /// The shard of `key` under the current count.
    pub fn shard_of(&self, key: &str) -> u32 {
        shard_of(key, self.count()).expect("the count is always in range")
    }

    /// The known leader of `shard`, if any.
    pub fn leader(&self, shard: u32) -> Option<ShardLeader> {
        self.leaders.get(shard as usize).copied().flatten()
    }

    /// Records `leader` as the leader of `shard`; a shard outside the count is
    /// ignored.
    pub fn set(&mut self, shard: u32, leader: ShardLeader) {
        if let Some(entry) = self.leaders.get_mut(shard as usize) {
            *entry = Some(leader);
        }
    }

    /// Forgets the leader of `shard`.
    pub fn forget(&mut self, shard: u32) {
        if let Some(entry) = self.leaders.get_mut(shard as usize) {
            *entry = None;
        }
    }

    /// Forgets every leader for which `matches` holds.
    pub fn forget_where(&mut self, mut matches: impl FnMut(ShardLeader) -> bool) {
        for entry in &mut self.leaders {
            if entry.is_some_and(&mut matches) {
                *entry = None;
            }
        }
    }

    /// Every known leader.
    pub fn known(&self) -> impl Iterator<Item = ShardLeader> + '_ {
        self.leaders.iter().filter_map(|entry| *entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_until_an_answer_says_otherwise() {
        let table = ShardLeaders::new();
        assert_eq!(table.count(), 1);
        assert_eq!(table.shard_of("any key"), 0);
        assert_eq!(table.leader(0), None);
    }

    #[test]
    fn counts_outside_the_protocols_range_are_ignored() {
        let mut table = ShardLeaders::new();
        assert!(!table.learn_count(0));
        assert!(!table.learn_count(MAX_SHARDS + 1));
        assert!(!table.learn_count(u32::MAX));
        assert_eq!(table.count(), 1);
        assert!(table.learn_count(MAX_SHARDS));
        assert_eq!(table.count(), MAX_SHARDS);
        assert!(table.learn_count(3));
        assert!(!table.learn_count(3), "the same count changes nothing");
        assert_eq!(table.count(), 3);
    }

    #[test]
    fn keys_map_to_their_shard_under_the_learned_count() {
        let mut table = ShardLeaders::new();
        table.learn_count(3);
        for key in ["a", "acct-1", "acct/7 b", ""] {
            assert_eq!(table.shard_of(key), shard_of(key, 3).unwrap(), "{key:?}");
        }
    }

    #[test]
    fn leaders_are_learned_replaced_and_forgotten_per_shard() {
        let mut table = ShardLeaders::new();
        table.learn_count(3);
        table.set(1, ShardLeader::Node(2));
        table.set(2, ShardLeader::Endpoint(0));
        table.set(3, ShardLeader::Node(9)); // no shard 3 of 3
        assert_eq!(table.leader(0), None);
        assert_eq!(table.leader(1), Some(ShardLeader::Node(2)));
        assert_eq!(table.leader(2), Some(ShardLeader::Endpoint(0)));
        assert_eq!(table.leader(3), None);
        table.set(1, ShardLeader::Node(3));
        assert_eq!(table.leader(1), Some(ShardLeader::Node(3)));
        table.forget(1);
        assert_eq!(table.leader(1), None);
        assert_eq!(
            table.known().collect::<Vec<_>>(),
            [ShardLeader::Endpoint(0)]
        );
    }

    #[test]
    fn forgetting_a_node_clears_every_shard_it_led() {
        let mut table = ShardLeaders::new();
        table.learn_count(4);
        for shard in 0..4 {
            table.set(shard, ShardLeader::Node(u64::from(shard % 2)));
        }
        table.forget_where(|leader| leader == ShardLeader::Node(1));
        let known: Vec<_> = (0..4).map(|shard| table.leader(shard)).collect();
        let zero = Some(ShardLeader::Node(0));
        assert_eq!(known, [zero, None, zero, None]);
    }

    #[test]
    fn a_new_count_forgets_every_leader() {
        let mut table = ShardLeaders::new();
        table.learn_count(3);
        table.set(0, ShardLeader::Node(1));
        table.set(2, ShardLeader::Node(3));
        assert!(table.learn_count(5));
        assert_eq!(table.known().count(), 0);
        // A count ignored keeps what is known.
        table.set(4, ShardLeader::Node(2));
        table.learn_count(5_000);
        assert_eq!(table.leader(4), Some(ShardLeader::Node(2)));
    }
}
