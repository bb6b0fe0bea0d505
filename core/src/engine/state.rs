//! One key's replicated state: grants, leases, settings and remembered answers.
//!
//! The canonical part (what replicas must agree on byte for byte) is [`KeyMeta`],
//! the grants, the leases and the remembered answers, all in `BTreeMap`s so that
//! iteration is ordered. Beside it, [`KeyState`] keeps a derived [`Tally`]: totals
//! and indexes (claim deadlines, lease expiries) that let a round touch only what it
//! needs instead of rescanning every grant. The tally is never serialised; it is
//! rebuilt from the canonical part on load.
//!
//! Invariants, kept by routing every change through [`KeyState::put_grant`] and
//! [`KeyState::put_lease`]:
//! - `released <= claimed <= permits` for every grant, `released <= permits` for
//!   every lease; a grant or lease with nothing outstanding is deleted.
//! - the tally equals what a full scan of the grants and leases would compute.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize, Serializer};

use crate::config::{GroupConfig, GroupPolicy, KeyConfig};
use crate::contract::protocol::PermitGrant;
use crate::engine::small_map::{SmallMap, SmallSet};
use crate::ids::{GrantId, LeaseId, LogIndex};

/// Permits handed to one client for one group by one round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub client_id: String,
    pub group: String,
    /// Shrinks to `claimed` once the claim deadline passes.
    pub permits: u64,
    /// High-water mark of permits the client reported in use.
    pub claimed: u64,
    /// High-water mark of claimed permits the client returned.
    pub released: u64,
    pub created_at_ms: u64,
    /// Unclaimed permits are reclaimed once `now` reaches this.
    pub claim_deadline_ms: u64,
    /// Log index of the round that created the grant.
    pub fence: LogIndex,
}

impl Grant {
    /// Permits this grant holds against the limit.
    pub fn outstanding(&self) -> u64 {
        self.permits - self.released
    }

    /// Whether the claim deadline can still reclaim something.
    pub fn has_unclaimed(&self) -> bool {
        self.claimed < self.permits
    }
}

/// A block of permits one client draws from locally.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub client_id: String,
    pub group: String,
    /// Shrinks to what was drawn only on the client's own retired report.
    pub permits: u64,
    /// High-water mark of drawn permits the client returned.
    pub released: u64,
    /// High-water mark of permits the client reported drawn. Without it a stale
    /// retired report could shrink a lease below what was drawn and free capacity
    /// twice.
    pub drawn: u64,
    pub created_at_ms: u64,
    /// Refreshed by every report; the lease is retired once `now` reaches this.
    pub expires_at_ms: u64,
    /// No more permits may be drawn; the footprint stays until the client settles.
    pub retired: bool,
    /// The client reported the lease at least once. Until then it must not draw
    /// from it (docs/protocol.md, "Reclaim"): a lease whose answer was lost is
    /// otherwise never reported and its footprint would stay forever.
    #[serde(default)]
    pub acknowledged: bool,
    /// An unacknowledged lease is reclaimed once `now` reaches this.
    #[serde(default)]
    pub claim_deadline_ms: u64,
}

impl Lease {
    /// Lease permits not yet released: what the lease holds against its budget.
    pub fn footprint(&self) -> u64 {
        self.permits - self.released
    }
}

/// A request's answer kept for `requestId` de-duplication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RememberedAnswer {
    pub answer: PermitGrant,
    /// The answer may be forgotten once `now` reaches this: every grant in it is
    /// claimed or past its claim deadline.
    pub forget_at_ms: u64,
}

/// A key's settings and round-to-round flags.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyMeta {
    /// `None` follows the cluster defaults. Boxed: most keys have none, and
    /// every key pays for the slot.
    pub config: Option<Box<KeyConfig>>,
    pub groups: BTreeMap<String, GroupConfig>,
    /// The last round left lease demand unserved or grants blocked by leases.
    pub contended: bool,
    /// Settings changed since the last round: every lease's eligibility is checked
    /// again at the next round (settings only change through log entries, so
    /// checking after a change equals checking every round, and costs less).
    pub recheck_leases: bool,
}

impl KeyMeta {
    /// The resolved policy of a group.
    pub fn group_policy(&self, group: &str) -> GroupPolicy {
        GroupPolicy::resolve(self.groups.get(group))
    }
}

/// Answers remembered per client, then per requestId.
pub type Answers = SmallMap<String, SmallMap<String, RememberedAnswer>>;

/// Rows written since the last [`KeyState::take_changes`]. Storage reads only
/// which keys changed (the applied keys its node is told about); the per-row
/// detail dates from a store that wrote rows, and is kept for the tests that
/// check what an operation touched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub meta: bool,
    pub grants: BTreeSet<GrantId>,
    pub leases: BTreeSet<LeaseId>,
    /// (clientId, requestId) pairs.
    pub answers: BTreeSet<(String, String)>,
}

impl Changes {
    /// Adds `other`'s rows to these.
    pub fn merge(&mut self, other: Changes) {
        self.meta |= other.meta;
        self.grants.extend(other.grants);
        self.leases.extend(other.leases);
        self.answers.extend(other.answers);
    }

    pub fn is_empty(&self) -> bool {
        !self.meta && self.grants.is_empty() && self.leases.is_empty() && self.answers.is_empty()
    }
}

/// Per-group sums of the tally.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupTally {
    /// Outstanding grant permits.
    pub granted: u64,
    /// Live grant rows (a group with rows is listed in usage even at 0).
    pub grants: u64,
    /// Lease footprint.
    pub leased: u64,
    /// Live lease rows.
    pub leases: u64,
}

impl GroupTally {
    fn is_empty(&self) -> bool {
        self.grants == 0 && self.leases == 0
    }
}

/// Totals and indexes derived from the grants and leases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub granted: u64,
    pub leased: u64,
    pub groups: SmallMap<String, GroupTally>,
    /// Grants with unclaimed permits, by claim deadline.
    pub claim_deadlines: SmallSet<(u64, GrantId)>,
    /// Leases not retired, by expiry.
    pub lease_expiries: SmallSet<(u64, LeaseId)>,
    /// Leases not yet acknowledged by their client, by claim deadline.
    pub lease_claim_deadlines: SmallSet<(u64, LeaseId)>,
    /// Remembered answers by the time they may be forgotten; shared by a
    /// copy until either side changes it, as the answers are.
    pub answer_expiries: Arc<SmallSet<(u64, String, String)>>,
}

/// One key's state. See the module docs for its invariants.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(from = "KeyImage")]
pub struct KeyState {
    meta: KeyMeta,
    grants: SmallMap<GrantId, Grant>,
    leases: SmallMap<LeaseId, Lease>,
    /// Shared by a copy until either side changes them: a leader's rehearsal
    /// copies the key for every request it may hold, and in a contended key
    /// the answers remembered for every runner were most of that copy's cost
    /// (docs/scaling.md, "Rehearsals that copy less").
    answers: Arc<Answers>,
    tally: Tally,
    /// Allocated only while changes wait to be taken: an idle key
    /// carries no empty change sets.
    changes: Option<Box<Changes>>,
}

/// The canonical, serialised form of a [`KeyState`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyImage {
    pub meta: KeyMeta,
    pub grants: BTreeMap<GrantId, Grant>,
    pub leases: BTreeMap<LeaseId, Lease>,
    pub answers: BTreeMap<String, BTreeMap<String, RememberedAnswer>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyImageRef<'a> {
    meta: &'a KeyMeta,
    grants: &'a SmallMap<GrantId, Grant>,
    leases: &'a SmallMap<LeaseId, Lease>,
    answers: &'a Answers,
}

impl Serialize for KeyState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        KeyImageRef {
            meta: &self.meta,
            grants: &self.grants,
            leases: &self.leases,
            answers: &self.answers,
        }
        .serialize(serializer)
    }
}

impl PartialEq for KeyState {
    /// Canonical state only: the tally is derived and the change set is bookkeeping.
    fn eq(&self, other: &Self) -> bool {
        self.meta == other.meta
            && self.grants == other.grants
            && self.leases == other.leases
            && self.answers == other.answers
    }
}

impl From<KeyImage> for KeyState {
    fn from(image: KeyImage) -> Self {
        let mut state = KeyState {
            meta: image.meta,
            ..KeyState::default()
        };
        for (id, grant) in image.grants {
            state.put_grant(id, Some(grant));
        }
        for (id, lease) in image.leases {
            state.put_lease(id, Some(lease));
        }
        for (client_id, answers) in image.answers {
            for (request_id, answer) in answers {
                state.put_answer(&client_id, &request_id, Some(answer));
            }
        }
        state.changes = None;
        state
    }
}

impl KeyState {
    pub fn meta(&self) -> &KeyMeta {
        &self.meta
    }

    /// Changes the settings; marks the meta row dirty.
    pub fn meta_mut(&mut self) -> &mut KeyMeta {
        self.changes_mut().meta = true;
        &mut self.meta
    }

    pub fn grants(&self) -> &SmallMap<GrantId, Grant> {
        &self.grants
    }

    pub fn leases(&self) -> &SmallMap<LeaseId, Lease> {
        &self.leases
    }

    pub fn answers(&self) -> &Answers {
        &self.answers
    }

    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// Whether nothing at all is kept for this key, so it can be dropped.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
            && self.leases.is_empty()
            && self.answers.is_empty()
            && self.meta == KeyMeta::default()
    }

    /// Every row of this state, as changes: what deleting the key must remove.
    pub fn all_rows(&self) -> Changes {
        Changes {
            meta: true,
            grants: self.grants.keys().copied().collect(),
            leases: self.leases.keys().copied().collect(),
            answers: self
                .answers
                .iter()
                .flat_map(|(client_id, answers)| {
                    answers
                        .keys()
                        .map(move |request_id| (client_id.clone(), request_id.clone()))
                })
                .collect(),
        }
    }

    /// Records rows changed before this state was (re)created, so none is lost.
    pub fn carry_changes(&mut self, earlier: Changes) {
        if !earlier.is_empty() {
            self.changes_mut().merge(earlier);
        }
    }

    /// The rows changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        self.changes
            .take()
            .map(|changes| *changes)
            .unwrap_or_default()
    }

    fn changes_mut(&mut self) -> &mut Changes {
        self.changes.get_or_insert_with(Box::default)
    }

    /// The earliest time a reclaim entry would change this key: a claim
    /// deadline of a grant or lease, or the forget time of a remembered answer.
    /// The leader's reclaim timer for this key fires then, so unclaimed permits
    /// return and answers age out even when nobody asks about the key.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let grant = self.tally.claim_deadlines.first().map(|(at, _)| *at);
        let lease = self.tally.lease_claim_deadlines.first().map(|(at, _)| *at);
        let answer = self.tally.answer_expiries.first().map(|(at, _, _)| *at);
        [grant, lease, answer].into_iter().flatten().min()
    }

    /// Replaces (or with `None` deletes) a grant, keeping the tally exact.
    pub fn put_grant(&mut self, id: GrantId, grant: Option<Grant>) {
        if let Some(old) = self.grants.remove(&id) {
            self.untally_grant(id, &old);
        }
        if let Some(grant) = grant {
            debug_assert!(grant.released <= grant.claimed && grant.claimed <= grant.permits);
            self.tally_grant(id, &grant);
            self.grants.insert(id, grant);
        }
        self.changes_mut().grants.insert(id);
    }

    fn tally_grant(&mut self, id: GrantId, grant: &Grant) {
        self.tally.granted += grant.outstanding();
        let group = self
            .tally
            .groups
            .get_or_insert_with(grant.group.clone(), GroupTally::default);
        group.granted += grant.outstanding();
        group.grants += 1;
        if grant.has_unclaimed() {
            self.tally
                .claim_deadlines
                .insert((grant.claim_deadline_ms, id));
        }
    }

    fn untally_grant(&mut self, id: GrantId, grant: &Grant) {
        self.tally.granted -= grant.outstanding();
        let group = self
            .tally
            .groups
            .get_mut(&grant.group)
            .expect("tallied grant group");
        group.granted -= grant.outstanding();
        group.grants -= 1;
        if group.is_empty() {
            self.tally.groups.remove(&grant.group);
        }
        self.tally
            .claim_deadlines
            .remove(&(grant.claim_deadline_ms, id));
    }

    /// Replaces (or with `None` deletes) a lease, keeping the tally exact.
    pub fn put_lease(&mut self, id: LeaseId, lease: Option<Lease>) {
        if let Some(old) = self.leases.remove(&id) {
            self.untally_lease(id, &old);
        }
        if let Some(lease) = lease {
            debug_assert!(lease.released <= lease.permits);
            self.tally_lease(id, &lease);
            self.leases.insert(id, lease);
        }
        self.changes_mut().leases.insert(id);
    }

    fn tally_lease(&mut self, id: LeaseId, lease: &Lease) {
        self.tally.leased += lease.footprint();
        let group = self
            .tally
            .groups
            .get_or_insert_with(lease.group.clone(), GroupTally::default);
        group.leased += lease.footprint();
        group.leases += 1;
        if !lease.acknowledged {
            self.tally
                .lease_claim_deadlines
                .insert((lease.claim_deadline_ms, id));
        }
        if !lease.retired {
            self.tally.lease_expiries.insert((lease.expires_at_ms, id));
        }
    }

    fn untally_lease(&mut self, id: LeaseId, lease: &Lease) {
        self.tally.leased -= lease.footprint();
        let group = self
            .tally
            .groups
            .get_mut(&lease.group)
            .expect("tallied lease group");
        group.leased -= lease.footprint();
        group.leases -= 1;
        if group.is_empty() {
            self.tally.groups.remove(&lease.group);
        }
        self.tally.lease_expiries.remove(&(lease.expires_at_ms, id));
        let deadline = (lease.claim_deadline_ms, id);
        self.tally.lease_claim_deadlines.remove(&deadline);
    }

    /// Replaces (or with `None` forgets) a remembered answer.
    pub fn put_answer(
        &mut self,
        client_id: &str,
        request_id: &str,
        answer: Option<RememberedAnswer>,
    ) {
        let all = Arc::make_mut(&mut self.answers);
        let answers = all.get_or_insert_with(client_id.to_owned(), SmallMap::new);
        let expiries = Arc::make_mut(&mut self.tally.answer_expiries);
        if let Some(old) = answers.remove(request_id) {
            expiries.remove(&(
                old.forget_at_ms,
                client_id.to_owned(),
                request_id.to_owned(),
            ));
        }
        if let Some(answer) = answer {
            expiries.insert((
                answer.forget_at_ms,
                client_id.to_owned(),
                request_id.to_owned(),
            ));
            answers.insert(request_id.to_owned(), answer);
        }
        if answers.is_empty() {
            all.remove(client_id);
        }
        self.changes_mut()
            .answers
            .insert((client_id.to_owned(), request_id.to_owned()));
    }

    /// Recomputes the tally from scratch; tests compare it with the kept one.
    pub fn recount(&self) -> Tally {
        let image = KeyImage {
            meta: self.meta.clone(),
            grants: self
                .grants
                .iter()
                .map(|(id, grant)| (*id, grant.clone()))
                .collect(),
            leases: self
                .leases
                .iter()
                .map(|(id, lease)| (*id, lease.clone()))
                .collect(),
            answers: self
                .answers
                .iter()
                .map(|(client_id, answers)| {
                    let answers = answers
                        .iter()
                        .map(|(request_id, answer)| (request_id.clone(), answer.clone()));
                    (client_id.clone(), answers.collect())
                })
                .collect(),
        };
        KeyState::from(image).tally
    }
}
