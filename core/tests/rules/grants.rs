//! Granting demand: oldest first, the group gate before the key's room, and the
//! reasons demand stays blocked (docs/protocol.md, "Oldest first", "Group caps",
//! "Blocked reasons", "The key's room and lowered limits").

use crate::support::*;

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
    let json = serde_json::to_value(permitd_core::contract::protocol::SemaphoreResponse::Grant(
        answer,
    ))
    .unwrap();
    assert!(json.get("leases").is_none() && json.get("contended").is_none());
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
