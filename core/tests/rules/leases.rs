//! Leases: how they are shared out, heartbeated, retired, settled and counted
//! (docs/protocol.md, "Sharing leases out", "Retirement and settling",
//! "Contended").

use crate::support::*;

#[test]
fn lease_share_is_the_remaining_budget_split_over_candidates() {
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
    let update = permitd_core::config::KeyConfigUpdate {
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
