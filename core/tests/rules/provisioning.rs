//! How one limit splits between grants and leases: `strict`, `under` and `over`,
//! also after the limit is lowered (docs/protocol.md, "Leases and provisioning").

use crate::support::*;

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
    // holds it. Checking the grant budget alone would grant here and pass the limit.
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
