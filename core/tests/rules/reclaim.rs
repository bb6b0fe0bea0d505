//! The claim deadline: unclaimed grant permits and unacknowledged leases return
//! to the pool, at the start of each round and in reclaim entries
//! (docs/protocol.md, "Reclaim").

use crate::support::*;

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
    assert_eq!(log.state().next_deadline_ms(), None);
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
fn an_unacknowledged_lease_is_reclaimed_at_its_claim_deadline() {
    let mut log = Log::with_leases(10, strict(4));
    let lease_id = leases_of(&log.ask(leasing("a", "g", 1, T0)))[0]
        .lease_id
        .clone();
    assert_eq!(log.state().next_deadline_ms(), Some(T0 + 10_000));
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
