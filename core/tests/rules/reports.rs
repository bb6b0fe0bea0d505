//! Grant reports: cumulative high-water marks of claimed and released permits,
//! clamped to what the grant can honour (docs/protocol.md, "Reports").

use crate::support::*;

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
