//! One named test per rule of the seed's semaphore-server.ts and
//! semaphore-leases.ts, plus the rules permitd adds (fence, requestId, clock).
//!
//! Each test drives [`Semaphores`] through the same operations a log would: rounds
//! with increasing log indexes at the leader's `now`, syncs and reclaim passes.

use crate::config::{Amount, GroupConfig, KeyConfig, LeasePolicy, LimitedGroups, Provisioning};
use crate::events::Event;
use crate::ids::IdAllocator;
use crate::protocol::{
    Blocked, BlockedReason, Demand, GrantReport, GrantStatus, LeaseGrant, LeaseReport, PermitGrant,
    PermitRequest, PermitSync, V1,
};
use crate::round::RoundOutcome;
use crate::semaphores::Semaphores;
use crate::state::{KeyImage, KeyMeta, KeyState};
use crate::sync::SyncOutcome;
use crate::usage::Usage;

const KEY: &str = "account-1";
const T0: u64 = 1_764_460_800_000;

/// A log in miniature: one key, a clock, increasing log indexes.
struct Log {
    semaphores: Semaphores,
    index: u64,
    now_ms: u64,
}

impl Log {
    fn new(config: KeyConfig) -> Self {
        Self {
            semaphores: Semaphores::new(config).unwrap(),
            index: 0,
            now_ms: T0,
        }
    }

    fn with_limit(limit: u64) -> Self {
        Self::new(KeyConfig {
            limit,
            ..KeyConfig::default()
        })
    }

    fn with_leases(limit: u64, policy: LeasePolicy) -> Self {
        Self::new(KeyConfig {
            limit,
            leases: Some(policy),
            ..KeyConfig::default()
        })
    }

    fn round(&mut self, requests: &[PermitRequest]) -> RoundOutcome {
        self.index += 1;
        let mut ids = IdAllocator::new(self.index);
        let outcome = self.semaphores.round(KEY, &mut ids, self.now_ms, requests);
        self.check_tally();
        outcome
    }

    /// A round of one request; its answer.
    fn ask(&mut self, request: PermitRequest) -> PermitGrant {
        self.round(&[request]).answers.remove(0)
    }

    fn sync(&mut self, sync: PermitSync) -> SyncOutcome {
        self.index += 1;
        let outcome = self.semaphores.sync(KEY, self.now_ms, &sync);
        self.check_tally();
        outcome
    }

    fn reclaim(&mut self) -> Vec<Event> {
        self.index += 1;
        let events = self.semaphores.reclaim(KEY, self.now_ms);
        self.check_tally();
        events
    }

    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    fn usage(&self) -> Usage {
        self.semaphores.usage(KEY, self.now_ms)
    }

    fn state(&self) -> &KeyState {
        self.semaphores.key(KEY).expect("key has state")
    }

    fn set_group(&mut self, group: &str, limit: Option<u64>, permitted: bool) {
        self.semaphores
            .set_group(KEY, group, GroupConfig { limit, permitted })
            .unwrap();
    }

    fn set_limit(&mut self, limit: u64) {
        let mut config = self.semaphores.config(KEY).clone();
        config.limit = limit;
        self.semaphores.set_defaults(config).unwrap();
    }

    fn check_tally(&self) {
        if let Some(state) = self.semaphores.key(KEY) {
            assert_eq!(
                state.tally(),
                &state.recount(),
                "tally drifted from a recount"
            );
        }
    }
}

fn request(client: &str) -> PermitRequest {
    PermitRequest {
        v: V1,
        client_id: client.to_owned(),
        request_id: None,
        demand: vec![],
        grants: vec![],
        leases: None,
    }
}

fn wants(client: &str, group: &str, count: u64, oldest_at_ms: u64) -> PermitRequest {
    PermitRequest {
        demand: vec![Demand {
            group: group.to_owned(),
            count,
            oldest_at_ms,
        }],
        ..request(client)
    }
}

fn leasing(client: &str, group: &str, count: u64, oldest_at_ms: u64) -> PermitRequest {
    PermitRequest {
        leases: Some(vec![]),
        ..wants(client, group, count, oldest_at_ms)
    }
}

/// `request` tagged with a requestId, as a client that may retry sends it.
fn retry_of(request_id: &str, request: PermitRequest) -> PermitRequest {
    PermitRequest {
        request_id: Some(request_id.to_owned()),
        ..request
    }
}

fn report(grant_id: &str, claimed: u64, released: u64) -> GrantReport {
    GrantReport {
        grant_id: grant_id.to_owned(),
        claimed,
        released,
    }
}

fn lease_report(lease_id: &str, drawn: u64, released: u64, retired: bool) -> LeaseReport {
    LeaseReport {
        lease_id: lease_id.to_owned(),
        drawn,
        released,
        retired,
    }
}

fn reports(client: &str, grants: Vec<GrantReport>) -> PermitSync {
    PermitSync {
        v: V1,
        client_id: client.to_owned(),
        grants,
        leases: None,
    }
}

fn lease_sync(client: &str, leases: Vec<LeaseReport>) -> PermitSync {
    PermitSync {
        v: V1,
        client_id: client.to_owned(),
        grants: vec![],
        leases: Some(leases),
    }
}

fn granted(answer: &PermitGrant) -> u64 {
    answer.grants.iter().map(|grant| grant.permits).sum()
}

fn grant_id(answer: &PermitGrant) -> String {
    answer.grants[0].grant_id.to_string()
}

fn leases_of(answer: &PermitGrant) -> &[LeaseGrant] {
    answer.leases.as_deref().unwrap_or_default()
}

fn strict(permits_per_lease: u64) -> LeasePolicy {
    LeasePolicy {
        permits_per_lease,
        ..LeasePolicy::with_provisioning(Provisioning::Strict)
    }
}

// ---- grants and reports -------------------------------------------------------

#[test]
fn reports_are_cumulative_clamped_and_monotone() {
    let mut log = Log::with_limit(10);
    let id = grant_id(&log.ask(wants("a", "g", 5, T0)));
    // Claims beyond the grant clamp to it; releases beyond the claims clamp to them.
    let result = log
        .sync(reports("a", vec![report(&id, 9, 3)]))
        .answer
        .grant_results;
    assert_eq!((result[0].claimed, result[0].status), (5, GrantStatus::Ok));
    let grant = log.state().grants().values().next().unwrap();
    assert_eq!((grant.claimed, grant.released), (5, 3));
    let result = log
        .sync(reports("a", vec![report(&id, 5, 9)]))
        .answer
        .grant_results;
    assert_eq!(result[0].claimed, 5);
    assert!(
        log.semaphores.key(KEY).is_none(),
        "released past the claims clamps to all"
    );
    // A stale, lower report moves nothing back.
    let mut log = Log::with_limit(10);
    let id = grant_id(&log.ask(wants("a", "g", 5, T0)));
    log.sync(reports("a", vec![report(&id, 4, 2)]));
    log.sync(reports("a", vec![report(&id, 1, 0)]));
    let grant = log.state().grants().values().next().unwrap();
    assert_eq!((grant.claimed, grant.released), (4, 2));
    assert_eq!(log.usage().granted, 3);
    // The same report again frees nothing twice.
    log.sync(reports("a", vec![report(&id, 4, 2)]));
    assert_eq!(log.usage().granted, 3);
}

#[test]
fn fully_released_grant_is_deleted() {
    let mut log = Log::new(KeyConfig::default());
    let id = grant_id(&log.ask(wants("a", "g", 3, T0)));
    log.sync(reports("a", vec![report(&id, 3, 3)]));
    assert!(log
        .semaphores
        .key(KEY)
        .is_none_or(|state| state.grants().is_empty()));
    assert_eq!(log.usage().granted, 0);
}

#[test]
fn unknown_grant_is_not_found() {
    let mut log = Log::new(KeyConfig::default());
    let answer = log.sync(reports(
        "a",
        vec![
            report("no-such-grant", 1, 0),
            report(&uuid::Uuid::nil().to_string(), 1, 0),
        ],
    ));
    for result in answer.answer.grant_results {
        assert_eq!((result.claimed, result.status), (0, GrantStatus::NotFound));
    }
}

#[test]
fn another_clients_grant_is_not_found() {
    let mut log = Log::new(KeyConfig::default());
    let id = grant_id(&log.ask(wants("a", "g", 3, T0)));
    let result = log
        .sync(reports("b", vec![report(&id, 3, 3)]))
        .answer
        .grant_results;
    assert_eq!(
        (result[0].grant_id.as_str(), result[0].status),
        (id.as_str(), GrantStatus::NotFound)
    );
    assert_eq!(
        log.usage().granted,
        3,
        "another client's report frees nothing"
    );
}

#[test]
fn reclaim_shrinks_expired_grant_to_its_claimed_count() {
    let mut log = Log::new(KeyConfig::default());
    let id = grant_id(&log.ask(wants("a", "g", 5, T0)));
    log.sync(reports("a", vec![report(&id, 2, 0)]));
    log.advance(10_000);
    let events = log.reclaim();
    assert!(
        matches!(&events[..], [Event::GrantReclaimed { permits: 3, .. }]),
        "{events:?}"
    );
    let grant = log.state().grants().values().next().unwrap();
    assert_eq!((grant.permits, grant.claimed), (2, 2));
    assert_eq!(log.usage().granted, 2);
    assert_eq!(log.state().next_claim_deadline_ms(), None);
}

#[test]
fn reclaim_deletes_grant_when_all_claimed_are_released() {
    let mut log = Log::new(KeyConfig::default());
    let id = grant_id(&log.ask(wants("a", "g", 5, T0)));
    log.sync(reports("a", vec![report(&id, 2, 2)]));
    log.advance(10_000);
    log.reclaim();
    assert!(log
        .semaphores
        .key(KEY)
        .is_none_or(|state| state.grants().is_empty()));
}

#[test]
fn reclaim_runs_at_the_start_of_every_round() {
    let mut log = Log::with_limit(5);
    log.ask(wants("a", "g", 5, T0));
    log.advance(10_000);
    let outcome = log.round(&[wants("b", "g", 5, T0 + 1)]);
    assert_eq!(
        granted(&outcome.answers[0]),
        5,
        "a's unclaimed permits came back first"
    );
    assert!(outcome
        .events
        .iter()
        .any(|event| event.name() == "grant_reclaimed"));
}

#[test]
fn late_claim_is_clamped_with_status_expired() {
    let mut log = Log::new(KeyConfig::default());
    let id = grant_id(&log.ask(wants("a", "g", 5, T0)));
    log.sync(reports("a", vec![report(&id, 1, 0)]));
    log.advance(10_000);
    let outcome = log.sync(reports("a", vec![report(&id, 4, 0)]));
    let result = &outcome.answer.grant_results[0];
    assert_eq!((result.claimed, result.status), (1, GrantStatus::Expired));
    assert_eq!(log.usage().granted, 1);
    assert!(outcome
        .events
        .iter()
        .any(|event| event.name() == "grant_reclaimed"));
    // A claim within what survived is fine even after the deadline.
    let result = log
        .sync(reports("a", vec![report(&id, 1, 1)]))
        .answer
        .grant_results;
    assert_eq!(result[0].status, GrantStatus::Ok);
}

#[test]
fn usage_counts_overdue_unclaimed_grants_as_reclaimed() {
    let mut log = Log::with_limit(10);
    log.ask(wants("a", "g", 4, T0));
    assert_eq!((log.usage().granted, log.usage().available), (4, 6));
    log.advance(10_000);
    let usage = log.usage();
    assert_eq!(
        (usage.granted, usage.available, usage.groups["g"].granted),
        (0, 10, 0)
    );
}

#[test]
fn demand_is_granted_oldest_first_then_by_client_id() {
    let mut log = Log::with_limit(3);
    let outcome = log.round(&[
        wants("c", "g", 1, T0 + 5),
        wants("b", "g", 1, T0),
        wants("a", "g", 1, T0),
        wants("d", "g", 1, T0 + 9),
    ]);
    let given: Vec<u64> = outcome.answers.iter().map(granted).collect();
    // a and b tie on oldestAt and go by clientId; c is next; d is left.
    assert_eq!(given, vec![1, 1, 1, 0]);
    assert_eq!(
        outcome.answers[3].blocked,
        vec![Blocked {
            group: "g".into(),
            reason: BlockedReason::Limit
        }]
    );
}

#[test]
fn client_ids_compare_as_bytes() {
    let mut log = Log::with_limit(1);
    // 'B' (0x42) sorts before 'a' (0x61) as bytes, unlike a locale compare.
    let outcome = log.round(&[wants("a", "g", 1, T0), wants("B", "g", 1, T0)]);
    assert_eq!(
        (granted(&outcome.answers[0]), granted(&outcome.answers[1])),
        (0, 1)
    );
}

#[test]
fn group_gate_is_checked_before_the_key_gate_in_blocked_attribution() {
    let mut log = Log::with_limit(4);
    log.set_group("wf", Some(4), true);
    // Group room and key room tie at 4: attribution names the group.
    let answer = log.ask(wants("a", "wf", 6, T0));
    assert_eq!(granted(&answer), 4);
    assert_eq!(answer.blocked[0].reason, BlockedReason::GroupLimit);
    // A tighter key gate is named as the limit.
    let mut log = Log::with_limit(2);
    log.set_group("wf", Some(5), true);
    assert_eq!(
        log.ask(wants("a", "wf", 6, T0)).blocked[0].reason,
        BlockedReason::Limit
    );
}

#[test]
fn group_limit_caps_a_group_under_the_key_limit() {
    let mut log = Log::with_limit(50);
    log.set_group("wf-1", Some(5), true);
    let outcome = log.round(&[
        wants("a", "wf-1", 8, T0),
        wants("b", "wf-1", 8, T0 + 1),
        wants("b2", "wf-2", 8, T0 + 2),
    ]);
    let given: Vec<u64> = outcome.answers.iter().map(granted).collect();
    assert_eq!(given, vec![5, 0, 8]);
    assert_eq!(
        outcome.answers[1].blocked[0].reason,
        BlockedReason::GroupLimit
    );
    let usage = log.usage();
    assert_eq!(
        (usage.groups["wf-1"].limit, usage.groups["wf-2"].limit),
        (Some(5), None)
    );
}

#[test]
fn not_permitted_group_is_blocked() {
    let mut log = Log::new(KeyConfig::default());
    log.set_group("wf", None, false);
    let answer = log.ask(wants("a", "wf", 2, T0));
    assert_eq!(
        (granted(&answer), answer.blocked[0].reason),
        (0, BlockedReason::NotPermitted)
    );
}

#[test]
fn stored_group_config_that_cannot_be_resolved_fails_closed() {
    let mut meta = KeyMeta::default();
    meta.groups.insert(
        "wf".into(),
        GroupConfig {
            limit: Some(u64::MAX),
            permitted: true,
        },
    );
    let state = KeyState::from(KeyImage {
        meta,
        ..KeyImage::default()
    });
    let mut semaphores =
        Semaphores::from_parts(KeyConfig::default(), T0, [(KEY.to_owned(), state)].into());
    let outcome = semaphores.round(
        KEY,
        &mut IdAllocator::new(1),
        T0,
        &[wants("a", "wf", 2, T0)],
    );
    assert_eq!(
        outcome.answers[0].blocked[0].reason,
        BlockedReason::LimitResolutionError
    );
    assert_eq!(granted(&outcome.answers[0]), 0);
}

#[test]
fn lowering_the_limit_never_evicts() {
    let mut log = Log::with_limit(10);
    let id = grant_id(&log.ask(wants("a", "g", 8, T0)));
    log.sync(reports("a", vec![report(&id, 8, 0)]));
    log.set_limit(4);
    let answer = log.ask(wants("b", "g", 1, T0));
    assert_eq!(granted(&answer), 0);
    let usage = log.usage();
    assert_eq!(
        (usage.granted, usage.available),
        (8, 0),
        "running work is kept"
    );
    // Once usage falls below the new limit, grants resume.
    log.sync(reports("a", vec![report(&id, 8, 5)]));
    assert_eq!(granted(&log.ask(wants("b", "g", 5, T0))), 1);
}

#[test]
fn count_zero_asks_for_nothing() {
    let mut log = Log::with_leases(10, strict(4));
    let answer = log.ask(leasing("a", "g", 0, T0));
    assert!(answer.grants.is_empty() && answer.blocked.is_empty() && leases_of(&answer).is_empty());
}

#[test]
fn next_request_at_is_now_plus_round_period() {
    let mut log = Log::new(KeyConfig {
        round_period_ms: 2_500,
        ..KeyConfig::default()
    });
    assert_eq!(
        log.ask(wants("a", "g", 1, T0)).next_request_at_ms,
        T0 + 2_500
    );
}

#[test]
fn answers_without_leases_support_carry_no_leases_or_contended() {
    let mut log = Log::with_leases(1, strict(4));
    let answer = log.ask(wants("a", "g", 3, T0));
    assert_eq!(answer.leases, None);
    assert!(!answer.contended);
    let json = serde_json::to_value(crate::protocol::SemaphoreResponse::Grant(answer)).unwrap();
    assert!(json.get("leases").is_none() && json.get("contended").is_none());
}

// ---- beyond the seed ----------------------------------------------------------

#[test]
fn fence_is_the_log_index_of_the_creating_round_and_grows_per_key() {
    let mut log = Log::new(KeyConfig::default());
    let first = log.ask(wants("a", "g", 1, T0)).grants[0].fence;
    assert_eq!(first, log.index);
    log.sync(reports("a", vec![]));
    let second = log.ask(wants("a", "g", 1, T0)).grants[0].fence;
    assert!(second > first);
}

#[test]
fn a_retried_request_id_gets_the_same_answer() {
    let mut log = Log::with_limit(10);
    let first = log.ask(retry_of("r-1", wants("a", "g", 4, T0)));
    // The retry's body differs; the answer does not, and nothing new is granted.
    let retry = log.ask(retry_of("r-1", wants("a", "g", 9, T0)));
    assert_eq!(
        serde_json::to_vec(&retry).unwrap(),
        serde_json::to_vec(&first).unwrap()
    );
    assert_eq!(log.usage().granted, 4);
    // A new requestId is a new request.
    assert_eq!(
        granted(&log.ask(retry_of("r-2", wants("a", "g", 1, T0)))),
        1
    );
}

#[test]
fn duplicate_request_ids_in_one_round_share_one_answer() {
    let mut log = Log::with_limit(10);
    let tagged = retry_of("r", wants("a", "g", 3, T0));
    let outcome = log.round(&[tagged.clone(), tagged]);
    assert_eq!(outcome.answers[0], outcome.answers[1]);
    assert_eq!(log.usage().granted, 3);
}

#[test]
fn remembered_answers_are_forgotten_after_the_claim_deadline() {
    let mut log = Log::with_limit(10);
    let tagged = retry_of("r", wants("a", "g", 3, T0));
    log.ask(tagged.clone());
    log.advance(10_000);
    assert_eq!(
        granted(&log.ask(tagged)),
        3,
        "past the deadline a retry is a new request"
    );
    assert_eq!(log.state().answers()["a"].len(), 1);
}

#[test]
fn answers_that_hand_out_nothing_are_not_remembered() {
    let mut log = Log::with_limit(2);
    let id = grant_id(&log.ask(wants("a", "g", 2, T0)));
    let blocked = retry_of("r", wants("b", "g", 1, T0 + 1));
    assert_eq!(granted(&log.ask(blocked.clone())), 0);
    assert!(
        !log.state().answers().contains_key("b"),
        "a blocked answer is not stored"
    );
    // Its retry is a fresh request: it is granted once room frees up.
    log.sync(reports("a", vec![report(&id, 2, 2)]));
    assert_eq!(granted(&log.ask(blocked)), 1);
    assert_eq!(
        log.state().answers()["b"].len(),
        1,
        "this one handed out a grant"
    );
}

#[test]
fn the_clock_never_runs_backwards() {
    let mut log = Log::new(KeyConfig::default());
    log.ask(wants("a", "g", 1, T0));
    log.now_ms = T0 - 60_000;
    let answer = log.ask(wants("a", "g", 1, T0));
    assert_eq!(answer.next_request_at_ms, T0 + 2_000);
    assert_eq!(log.semaphores.last_now_ms(), T0);
}

#[test]
fn rounds_emit_round_and_blocked_events() {
    let mut log = Log::with_limit(2);
    let outcome = log.round(&[wants("a", "g", 3, T0), wants("b", "g", 4, T0 + 1)]);
    let round = outcome.events.iter().find_map(|event| match event {
        Event::Round {
            requested,
            granted,
            usage,
            ..
        } => Some((*requested, *granted, usage.granted)),
        _ => None,
    });
    assert_eq!(round, Some((7, 2, 2)));
    let blocked: Vec<(String, u64)> = outcome
        .events
        .iter()
        .filter_map(|event| match event {
            Event::Blocked {
                group,
                count,
                reason: BlockedReason::Limit,
                ..
            } => Some((group.clone(), *count)),
            _ => None,
        })
        .collect();
    assert_eq!(blocked, vec![("g".to_owned(), 5)]);
}

// ---- leases -------------------------------------------------------------------

#[test]
fn strict_leases_share_the_limit_with_grants() {
    let mut log = Log::with_leases(10, strict(64));
    let answer = log.ask(leasing("a", "g", 3, T0));
    // Grants first (3), then a lease from what is left (7).
    assert_eq!(granted(&answer), 3);
    assert_eq!(leases_of(&answer)[0].permits, 7);
    let usage = log.usage();
    assert_eq!((usage.granted, usage.leased, usage.available), (3, 7, 0));
    assert_eq!(
        granted(&log.ask(wants("b", "g", 1, T0))),
        0,
        "the lease footprint holds the rest"
    );
}

#[test]
fn under_keeps_a_reserve_for_leases() {
    let policy = LeasePolicy::with_provisioning(Provisioning::Under {
        reserve: Amount::Permits(4),
    });
    let mut log = Log::with_leases(10, policy);
    let answer = log.ask(leasing("a", "g", 20, T0));
    assert_eq!(granted(&answer), 6, "grants get limit - reserve");
    assert_eq!(leases_of(&answer)[0].permits, 4, "leases get the reserve");
    assert_eq!(log.usage().granted + log.usage().leased, 10);
}

#[test]
fn under_reserve_never_takes_the_last_permit() {
    let policy = LeasePolicy::with_provisioning(Provisioning::Under {
        reserve: Amount::Ratio { ratio: 2.0 },
    });
    let mut log = Log::with_leases(3, policy);
    let answer = log.ask(wants("a", "g", 5, T0));
    assert_eq!(
        granted(&answer),
        1,
        "clients without lease support still get one permit"
    );
}

#[test]
fn over_adds_extra_above_the_limit() {
    let policy = LeasePolicy::with_provisioning(Provisioning::Over {
        extra: Amount::Ratio { ratio: 0.5 },
    });
    let mut log = Log::with_leases(10, policy);
    let answer = log.ask(leasing("a", "g", 30, T0));
    assert_eq!(granted(&answer), 10);
    assert_eq!(leases_of(&answer)[0].permits, 5);
    assert_eq!(log.usage().available, 0);
}

#[test]
fn lease_share_is_the_remaining_budget_split_over_candidates() {
    // 20 left for 3 candidates: floor(20 / 3) = 6 each, under permitsPerLease.
    let mut log = Log::with_leases(20, strict(64));
    let outcome = log.round(&[
        leasing("a", "g", 0, T0),
        leasing("a", "g1", 1, T0),
        leasing("b", "g2", 1, T0 + 1),
        leasing("c", "g3", 1, T0 + 2),
    ]);
    let sizes: Vec<u64> = outcome
        .answers
        .iter()
        .skip(1)
        .map(|answer| leases_of(answer).iter().map(|lease| lease.permits).sum())
        .collect();
    // Grants took 3 (one each), leaving 17: floor(17 / 3) = 5.
    assert_eq!(sizes, vec![5, 5, 5]);
    // permitsPerLease caps the share.
    let mut log = Log::with_leases(100, strict(8));
    let answer = log.ask(leasing("a", "g", 1, T0));
    assert_eq!(leases_of(&answer)[0].permits, 8);
}

#[test]
fn with_fewer_permits_than_candidates_the_oldest_get_one_each() {
    let mut log = Log::with_leases(
        2,
        LeasePolicy::with_provisioning(Provisioning::Over {
            extra: Amount::Permits(2),
        }),
    );
    let outcome = log.round(&[
        PermitRequest {
            demand: vec![],
            ..leasing("x", "g", 0, T0)
        },
        leasing("c", "g", 0, T0),
        PermitRequest {
            demand: vec![Demand {
                group: "g".into(),
                count: 1,
                oldest_at_ms: T0 + 3,
            }],
            leases: Some(vec![]),
            ..request("c")
        },
        PermitRequest {
            demand: vec![Demand {
                group: "g".into(),
                count: 1,
                oldest_at_ms: T0 + 1,
            }],
            leases: Some(vec![]),
            ..request("a")
        },
        PermitRequest {
            demand: vec![Demand {
                group: "g".into(),
                count: 1,
                oldest_at_ms: T0 + 2,
            }],
            leases: Some(vec![]),
            ..request("b")
        },
    ]);
    let lease_permits = |position: usize| {
        leases_of(&outcome.answers[position])
            .iter()
            .map(|lease| lease.permits)
            .sum::<u64>()
    };
    // Extra budget 2 for 3 candidates: a and b (oldest) get one each, c none.
    assert_eq!(
        (lease_permits(3), lease_permits(4), lease_permits(2)),
        (1, 1, 0)
    );
    assert!(outcome.contended);
}

#[test]
fn max_groups_bounds_the_groups_leased_per_round() {
    let policy = LeasePolicy {
        max_groups: 2,
        ..strict(4)
    };
    let mut log = Log::with_leases(100, policy);
    let demand = (0..4)
        .map(|n| Demand {
            group: format!("g{n}"),
            count: 1,
            oldest_at_ms: T0 + 10 - n,
        })
        .collect();
    let answer = log.ask(PermitRequest {
        demand,
        leases: Some(vec![]),
        ..request("a")
    });
    let mut groups: Vec<&str> = leases_of(&answer)
        .iter()
        .map(|lease| lease.group.as_str())
        .collect();
    groups.sort();
    assert_eq!(groups, vec!["g2", "g3"], "the two oldest groups");
    assert!(answer.contended, "two eligible candidates went unserved");
}

#[test]
fn max_clients_per_group_bounds_the_clients_leased_per_group() {
    let policy = LeasePolicy {
        max_clients_per_group: 1,
        ..strict(4)
    };
    let mut log = Log::with_leases(100, policy);
    let outcome = log.round(&[leasing("a", "g", 1, T0 + 1), leasing("b", "g", 1, T0)]);
    assert!(leases_of(&outcome.answers[0]).is_empty());
    assert_eq!(leases_of(&outcome.answers[1]).len(), 1);
}

#[test]
fn limited_groups_are_excluded_from_leases_by_default() {
    let mut log = Log::with_leases(100, strict(4));
    log.set_group("capped", Some(10), true);
    let answer = log.ask(leasing("a", "capped", 2, T0));
    assert_eq!(granted(&answer), 2);
    assert!(leases_of(&answer).is_empty());
}

#[test]
fn limited_groups_within_group_limit_lease_only_what_the_cap_leaves() {
    let policy = LeasePolicy {
        limited_groups: LimitedGroups::WithinGroupLimit,
        ..strict(64)
    };
    let mut log = Log::with_leases(100, policy);
    log.set_group("capped", Some(10), true);
    let answer = log.ask(leasing("a", "capped", 4, T0));
    assert_eq!(granted(&answer), 4);
    assert_eq!(leases_of(&answer)[0].permits, 6);
    // Grants then see the group's lease footprint: the cap holds for both.
    assert_eq!(granted(&log.ask(wants("b", "capped", 1, T0))), 0);
}

#[test]
fn leases_go_only_to_clients_that_sent_leases() {
    let mut log = Log::with_leases(100, strict(8));
    let outcome = log.round(&[wants("plain", "g", 1, T0), leasing("lessee", "g", 1, T0)]);
    assert_eq!(outcome.answers[0].leases, None);
    assert_eq!(leases_of(&outcome.answers[1]).len(), 1);
}

#[test]
fn no_new_lease_while_the_client_holds_undrawn_permits_of_that_group() {
    let mut log = Log::with_leases(100, strict(8));
    let lease_id = leases_of(&log.ask(leasing("a", "g", 1, T0)))[0]
        .lease_id
        .clone();
    let again = PermitRequest {
        leases: Some(vec![lease_report(&lease_id, 3, 0, false)]),
        ..wants("a", "g", 1, T0)
    };
    let answer = log.ask(again);
    assert_eq!(
        leases_of(&answer).len(),
        1,
        "only the echo of the held lease"
    );
    // Fully drawn: a new lease may come.
    let drawn = PermitRequest {
        leases: Some(vec![lease_report(&lease_id, 8, 0, false)]),
        ..wants("a", "g", 1, T0)
    };
    assert_eq!(leases_of(&log.ask(drawn)).len(), 2);
}

#[test]
fn heartbeat_refreshes_a_reported_lease() {
    let mut log = Log::with_leases(
        100,
        LeasePolicy {
            ttl_ms: 60_000,
            ..strict(8)
        },
    );
    let lease = leases_of(&log.ask(leasing("a", "g", 1, T0)))[0].clone();
    assert_eq!(lease.expires_at_ms, T0 + 60_000);
    log.advance(30_000);
    let echo = log
        .sync(lease_sync(
            "a",
            vec![lease_report(&lease.lease_id, 2, 1, false)],
        ))
        .answer;
    assert_eq!(echo.leases.unwrap()[0].expires_at_ms, T0 + 90_000);
    let held = log.state().leases().values().next().unwrap();
    assert_eq!((held.released, held.drawn), (1, 2));
}

#[test]
fn an_expired_lease_is_retired_never_swept_and_settled_by_its_client() {
    let mut log = Log::with_leases(
        10,
        LeasePolicy {
            ttl_ms: 60_000,
            ..strict(10)
        },
    );
    let lease_id = leases_of(&log.ask(leasing("a", "g", 0, T0).clone_with_count(1)))[0]
        .lease_id
        .clone();
    log.sync(lease_sync("a", vec![lease_report(&lease_id, 0, 0, false)]));
    log.advance(60_000);
    let outcome = log.round(&[wants("b", "g", 1, T0)]);
    assert!(outcome
        .events
        .iter()
        .any(|event| event.name() == "lease_retired"));
    let lease = log.state().leases().values().next().unwrap();
    assert!(lease.retired);
    assert_eq!(log.usage().leased, 9, "the whole footprint stays");
    // a's unclaimed grant was reclaimed: 10 - 9 leased leaves one permit for b.
    assert_eq!(granted(&outcome.answers[0]), 1);
    // The client's retired report settles it to what was drawn...
    let echo = log
        .sync(lease_sync("a", vec![lease_report(&lease_id, 4, 1, true)]))
        .answer;
    assert_eq!(
        echo.leases.unwrap()[0].expires_at_ms,
        log.now_ms,
        "echoed retired"
    );
    assert_eq!(log.usage().leased, 3);
    // ...and it is deleted once all of that is released.
    let echo = log
        .sync(lease_sync("a", vec![lease_report(&lease_id, 4, 4, true)]))
        .answer;
    assert_eq!(echo.leases.unwrap()[0].permits, 4, "echoed settled");
    assert!(log.state().leases().is_empty());
}

#[test]
fn a_stale_retired_report_cannot_shrink_a_lease_below_what_was_drawn() {
    let mut log = Log::with_leases(10, strict(10));
    let lease_id = leases_of(&log.ask(leasing("a", "g", 1, T0)))[0]
        .lease_id
        .clone();
    log.sync(lease_sync("a", vec![lease_report(&lease_id, 6, 0, true)]));
    log.sync(lease_sync("a", vec![lease_report(&lease_id, 2, 0, true)]));
    assert_eq!(log.usage().leased, 6);
}

#[test]
fn an_unknown_lease_is_echoed_retired_and_its_live_footprint_charged_for_the_round() {
    let mut log = Log::with_leases(20, strict(8));
    let unknown = PermitRequest {
        leases: Some(vec![lease_report("forgotten", 50, 0, false)]),
        ..leasing("a", "g", 0, T0)
    };
    let outcome = log.round(&[unknown, leasing("b", "g", 1, T0)]);
    let echo = &leases_of(&outcome.answers[0])[0];
    assert_eq!(
        (echo.group.as_str(), echo.permits, echo.expires_at_ms),
        ("", 0, log.now_ms)
    );
    // 20 - 1 granted = 19 gross, minus the debt clamped to permitsPerLease (8) = 11;
    // b gets min(8, 11) = 8. Without the clamp, 50 would have starved it.
    assert_eq!(leases_of(&outcome.answers[1])[0].permits, 8);
    let mut log = Log::with_leases(10, strict(8));
    let unknown = PermitRequest {
        leases: Some(vec![lease_report("forgotten", 8, 0, false)]),
        ..request("a")
    };
    let outcome = log.round(&[unknown, leasing("b", "g", 1, T0)]);
    // 10 - 1 granted - 8 debt = 1 left for b's lease.
    assert_eq!(leases_of(&outcome.answers[1])[0].permits, 1);
}

#[test]
fn a_lowered_budget_retires_the_newest_leases_with_undrawn_headroom() {
    let mut log = Log::with_leases(20, strict(10));
    let old = leases_of(&log.ask(leasing("a", "g", 0, T0).clone_with_count(1)))[0].clone();
    let new = leases_of(&log.ask(leasing("b", "g", 0, T0).clone_with_count(1)))[0].clone();
    // b's round: 20 - 2 granted - 10 footprint = 8.
    assert_eq!((old.permits, new.permits), (10, 8));
    log.set_limit(12);
    let outcome = log.round(&[
        PermitRequest {
            leases: Some(vec![lease_report(&old.lease_id, 2, 0, false)]),
            ..request("a")
        },
        PermitRequest {
            leases: Some(vec![lease_report(&new.lease_id, 0, 0, false)]),
            ..request("b")
        },
    ]);
    // Footprint 18 over a lease budget of 12 - 2 granted = 10: retiring the newest
    // lease (b's, 8 undrawn) covers the excess, so a's older lease keeps drawing.
    let retired: Vec<&str> = outcome
        .events
        .iter()
        .filter_map(|event| match event {
            Event::LeaseRetired { client_id, .. } => Some(client_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(retired, vec!["b"]);
    assert_eq!(leases_of(&outcome.answers[1])[0].expires_at_ms, log.now_ms);
    assert_eq!(log.usage().leased, 18, "footprint stays until b settles");
}

#[test]
fn contended_is_set_when_lease_demand_goes_unserved_and_echoed_by_sync() {
    let mut log = Log::with_leases(2, strict(8));
    let outcome = log.round(&[leasing("a", "g", 2, T0), leasing("b", "g", 1, T0 + 1)]);
    assert!(outcome.contended);
    assert!(outcome.answers.iter().all(|answer| answer.contended));
    let synced = log.sync(lease_sync("a", vec![])).answer;
    assert!(synced.contended, "the flag is replicated state");
    let synced = log.sync(reports("a", vec![])).answer;
    assert!(!synced.contended, "only lease clients hear it");
}

#[test]
fn settings_changes_retire_leases_of_groups_no_longer_eligible() {
    let mut log = Log::with_leases(100, strict(8));
    log.ask(leasing("a", "g", 1, T0));
    log.set_group("g", None, false);
    let outcome = log.round(&[wants("b", "other", 1, T0)]);
    assert!(outcome
        .events
        .iter()
        .any(|event| event.name() == "lease_retired"));
    assert!(log.state().leases().values().all(|lease| lease.retired));
}

#[test]
fn disabling_leases_retires_them_but_keeps_their_footprint_counted() {
    let mut log = Log::with_leases(10, strict(8));
    log.ask(leasing("a", "g", 1, T0));
    let update = crate::config::KeyConfigUpdate {
        limit: Some(10),
        leases: Some(None),
        ..Default::default()
    };
    log.semaphores.set_key_config(KEY, &update).unwrap();
    let answer = log.ask(wants("b", "g", 10, T0));
    assert_eq!(granted(&answer), 1, "8 leased + 1 granted hold 9 of 10");
    assert!(log.state().leases().values().all(|lease| lease.retired));
}

#[test]
fn lease_events_are_emitted() {
    let mut log = Log::with_leases(10, strict(4));
    let outcome = log.round(&[leasing("a", "g", 1, T0)]);
    assert!(outcome
        .events
        .iter()
        .any(|event| matches!(event, Event::LeaseGranted { permits: 4, .. })));
}

trait WithCount {
    fn clone_with_count(&self, count: u64) -> PermitRequest;
}

impl WithCount for PermitRequest {
    fn clone_with_count(&self, count: u64) -> PermitRequest {
        let mut request = self.clone();
        for demand in &mut request.demand {
            demand.count = count;
        }
        request
    }
}

#[test]
fn under_stays_under_the_limit_after_the_limit_is_lowered() {
    let policy = LeasePolicy {
        permits_per_lease: 1,
        ..LeasePolicy::with_provisioning(Provisioning::Under {
            reserve: Amount::Permits(1),
        })
    };
    let mut log = Log::with_leases(2, policy);
    let lease_id = leases_of(&log.ask(leasing("a", "g", 1, T0)))[0]
        .lease_id
        .clone();
    log.sync(lease_sync("a", vec![lease_report(&lease_id, 0, 0, false)]));
    assert_eq!((log.usage().granted, log.usage().leased), (1, 1));
    // Limit 1: the reserve shrinks to 0 and grants may use 1, but the lease still
    // holds it. The seed would grant here and pass the limit.
    log.set_limit(1);
    log.advance(10_000);
    assert_eq!(granted(&log.ask(wants("b", "g", 1, T0))), 0);
    assert_eq!(log.usage().granted + log.usage().leased, 1);
}

#[test]
fn over_stays_under_limit_plus_extra_after_the_limit_is_lowered() {
    let policy = LeasePolicy {
        permits_per_lease: 2,
        ..LeasePolicy::with_provisioning(Provisioning::Over {
            extra: Amount::Permits(2),
        })
    };
    let mut log = Log::with_leases(8, policy);
    let id = grant_id(&log.ask(wants("a", "g", 8, T0)));
    log.sync(reports("a", vec![report(&id, 8, 0)]));
    log.set_limit(2);
    let answer = log.ask(leasing("b", "g", 1, T0));
    assert!(
        leases_of(&answer).is_empty(),
        "8 running is above the ceiling of 4"
    );
    assert_eq!(log.usage().granted + log.usage().leased, 8);
}

#[test]
fn a_key_emptied_and_recreated_in_one_window_reports_every_changed_row() {
    let mut log = Log::new(KeyConfig::default());
    let id = grant_id(&log.ask(wants("a", "g", 1, T0)));
    log.semaphores.take_changes();
    log.sync(reports("a", vec![report(&id, 1, 1)]));
    assert!(
        log.semaphores.key(KEY).is_none(),
        "the key held nothing and was dropped"
    );
    log.ask(wants("a", "g", 1, T0));
    let changes = log.semaphores.take_changes();
    let (_, Some(rows)) = &changes.keys[0] else {
        panic!("the key exists again")
    };
    assert!(
        rows.grants
            .contains(&crate::ids::GrantId::parse(&id).unwrap()),
        "the deleted row is reported"
    );
}

#[test]
fn removing_a_key_reports_all_its_rows_and_frees_everything() {
    let mut log = Log::new(KeyConfig::default());
    log.ask(wants("a", "g", 3, T0));
    log.semaphores.take_changes();
    log.semaphores.remove_key(KEY);
    assert_eq!(log.usage().granted, 0);
    assert_eq!(
        log.semaphores.take_changes().keys,
        vec![(KEY.to_owned(), None)]
    );
}

#[test]
fn an_unacknowledged_lease_is_reclaimed_at_its_claim_deadline() {
    let mut log = Log::with_leases(10, strict(4));
    let lease_id = leases_of(&log.ask(leasing("a", "g", 1, T0)))[0]
        .lease_id
        .clone();
    assert_eq!(log.state().next_claim_deadline_ms(), Some(T0 + 10_000));
    log.advance(10_000);
    assert_eq!(
        log.usage().leased,
        0,
        "usage counts it as reclaimed already"
    );
    let events = log.reclaim();
    assert!(events
        .iter()
        .any(|event| matches!(event, Event::LeaseReclaimed { permits: 4, .. })));
    assert!(log
        .semaphores
        .key(KEY)
        .is_none_or(|state| state.leases().is_empty()));
    // The client's late report finds nothing: it drops the lease.
    let echo = log.sync(lease_sync("a", vec![lease_report(&lease_id, 0, 0, false)]));
    assert_eq!(echo.answer.leases.unwrap()[0].permits, 0);
}

#[test]
fn a_report_before_the_deadline_acknowledges_the_lease() {
    let mut log = Log::with_leases(10, strict(4));
    let lease_id = leases_of(&log.ask(leasing("a", "g", 1, T0)))[0]
        .lease_id
        .clone();
    log.advance(5_000);
    log.sync(lease_sync("a", vec![lease_report(&lease_id, 0, 0, false)]));
    log.advance(10_000);
    let events = log.reclaim();
    assert!(!events.iter().any(|event| event.name() == "lease_reclaimed"));
    assert_eq!(log.usage().leased, 4);
}

#[test]
fn a_late_first_report_with_nothing_drawn_deletes_the_lease() {
    let mut log = Log::with_leases(10, strict(4));
    let lease_id = leases_of(&log.ask(leasing("a", "g", 1, T0)))[0]
        .lease_id
        .clone();
    log.advance(10_000);
    let outcome = log.sync(lease_sync("a", vec![lease_report(&lease_id, 0, 0, false)]));
    let echo = &outcome.answer.leases.unwrap()[0];
    assert_eq!((echo.permits, echo.expires_at_ms), (0, log.now_ms));
    assert!(outcome
        .events
        .iter()
        .any(|event| event.name() == "lease_reclaimed"));
    assert!(log.state().leases().is_empty());
}

#[test]
fn a_late_first_report_with_draws_keeps_the_lease_counted() {
    let mut log = Log::with_leases(10, strict(4));
    let lease_id = leases_of(&log.ask(leasing("a", "g", 1, T0)))[0]
        .lease_id
        .clone();
    log.advance(10_000);
    log.sync(lease_sync("a", vec![lease_report(&lease_id, 2, 0, false)]));
    log.reclaim();
    assert_eq!(
        log.usage().leased,
        4,
        "draws may be running: the footprint stays"
    );
}
