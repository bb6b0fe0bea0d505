//! What a replicated log adds: fences, `requestId` answers, a clock that never
//! runs backwards, and the changed rows each entry reports for storage
//! (docs/protocol.md, "Fences, retries and the clock").

use crate::support::*;

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
fn a_reclaim_entry_alone_ages_out_an_answer_whose_grants_were_claimed() {
    let mut log = Log::with_limit(10);
    let id = grant_id(&log.ask(retry_of("r", wants("a", "g", 3, T0))));
    log.sync(reports("a", vec![report(&id, 3, 0)]));
    // Nothing is left to reclaim; only the answer's forget time is due.
    assert_eq!(log.state().next_deadline_ms(), Some(T0 + 10_000));
    log.advance(10_000);
    log.reclaim();
    assert!(
        log.state().answers().is_empty(),
        "forgotten without a later round"
    );
    assert_eq!(log.state().next_deadline_ms(), None);
    assert_eq!(log.usage().granted, 3, "the claimed grant stays");
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
    assert_eq!(
        answer.next_request_at_ms,
        T0 + KeyConfig::default().round_period_ms
    );
    assert_eq!(log.semaphores.last_now_ms(), T0);
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
            .contains(&permitd_core::ids::GrantId::parse(&id).unwrap()),
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
