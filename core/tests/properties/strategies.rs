//! proptest strategies for the world and its operations.

use super::*;

/// Which lease policies a property runs under.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Modes {
    NoneStrictOrUnder,
    Over,
    /// Any policy, and policy switches in the middle of a sequence.
    Any,
}

pub(crate) fn amount() -> impl Strategy<Value = Amount> {
    prop_oneof![
        (0u64..=12).prop_map(Amount::Permits),
        // Eighths are exact in binary: ratios without float surprises.
        (0u32..=12).prop_map(|eighths| Amount::Ratio {
            ratio: f64::from(eighths) / 8.0
        }),
    ]
}

pub(crate) fn provisioning(modes: Modes) -> BoxedStrategy<Option<Provisioning>> {
    let under = amount().prop_map(|reserve| Some(Provisioning::Under { reserve }));
    let over = amount().prop_map(|extra| Some(Provisioning::Over { extra }));
    match modes {
        Modes::NoneStrictOrUnder => {
            prop_oneof![Just(None), Just(Some(Provisioning::Strict)), under].boxed()
        }
        Modes::Over => over.boxed(),
        Modes::Any => {
            prop_oneof![Just(None), Just(Some(Provisioning::Strict)), under, over].boxed()
        }
    }
}

pub(crate) fn lease_policy(modes: Modes) -> impl Strategy<Value = Option<LeasePolicy>> {
    (
        provisioning(modes),
        1u64..=8,
        1_000u64..=MAX_TTL_MS,
        1u64..=3,
        1u64..=4,
        any::<bool>(),
    )
        .prop_map(
            |(provisioning, per_lease, ttl_ms, groups, clients, within)| {
                provisioning.map(|provisioning| LeasePolicy {
                    provisioning,
                    permits_per_lease: per_lease,
                    ttl_ms,
                    max_groups: groups,
                    max_clients_per_group: clients,
                    limited_groups: if within {
                        LimitedGroups::WithinGroupLimit
                    } else {
                        LimitedGroups::Exclude
                    },
                })
            },
        )
}

pub(crate) fn setup(modes: Modes) -> impl Strategy<Value = Setup> {
    (
        [0u64..=24, 0u64..=24],
        500u64..=5_000,
        1u64..=3_000,
        lease_policy(modes),
        [any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()],
    )
        .prop_map(
            |(limits, grant_timeout_ms, round_period_ms, leases, lease_clients)| Setup {
                limits,
                grant_timeout_ms,
                round_period_ms,
                leases,
                lease_clients,
            },
        )
}

pub(crate) fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        6 => (0u64..=2_000).prop_map(When::Later),
        1 => Just(When::PastClaimDeadlines),
        1 => Just(When::PastLeaseTtl),
        1 => (1u64..=5_000).prop_map(When::Earlier),
    ]
}

pub(crate) fn noise() -> impl Strategy<Value = Noise> {
    let count = || 0u64..=20;
    prop_oneof![
        (any::<u32>(), count(), count()).prop_map(|(n, a, b)| Noise::UnknownGrant(n, a, b)),
        (any::<u32>(), count(), count()).prop_map(|(n, a, b)| Noise::UnknownLease(n, a, b)),
        Just(Noise::NotAnId),
        (any::<Index>(), count(), count()).prop_map(|(i, a, b)| Noise::OthersGrant(i, a, b)),
        (any::<Index>(), count(), count()).prop_map(|(i, a, b)| Noise::OthersLease(i, a, b)),
    ]
}

pub(crate) fn report_plan() -> impl Strategy<Value = ReportPlan> {
    let kind = prop_oneof![
        8 => Just(ReportKind::Current),
        2 => any::<Index>().prop_map(ReportKind::Stale),
        1 => Just(ReportKind::Nothing),
    ];
    let noise = prop_oneof![3 => Just(vec![]), 1 => vec(noise(), 1..=2)];
    (kind, noise).prop_map(|(kind, noise)| ReportPlan { kind, noise })
}

pub(crate) fn request_plan() -> impl Strategy<Value = RequestPlan> {
    let request_id = prop_oneof![
        3 => Just(RequestIdPlan::None),
        2 => Just(RequestIdPlan::Fresh),
        1 => any::<Index>().prop_map(RequestIdPlan::Retry),
    ];
    (
        0..CLIENTS.len(),
        vec((0..GROUPS.len(), 0u64..=8, 0u64..=5_000), 0..=3),
        report_plan(),
        request_id,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
    )
        .prop_map(
            |(client, demand, reports, request_id, lose_reply, duplicate)| RequestPlan {
                client,
                demand,
                reports,
                request_id,
                lose_reply,
                duplicate,
            },
        )
}

pub(crate) fn work() -> impl Strategy<Value = Work> {
    prop_oneof![
        3 => (any::<Index>(), 1u64..=8).prop_map(|(i, n)| Work::Claim(i, n)),
        3 => (any::<Index>(), 1u64..=8).prop_map(|(i, n)| Work::Release(i, n)),
        3 => (any::<Index>(), 1u64..=8).prop_map(|(i, n)| Work::Draw(i, n)),
        2 => (any::<Index>(), 1u64..=8).prop_map(|(i, n)| Work::ReturnDrawn(i, n)),
        1 => any::<Index>().prop_map(Work::Retire),
    ]
}

pub(crate) fn op(modes: Modes) -> BoxedStrategy<Op> {
    let key = || 0..KEYS.len();
    let round =
        (key(), when(), vec(request_plan(), 1..=4)).prop_map(|(key, when, requests)| Op::Round {
            key,
            when,
            requests,
        });
    let sync = (
        key(),
        when(),
        0..CLIENTS.len(),
        report_plan(),
        any::<Index>(),
    )
        .prop_map(|(key, when, client, reports, stale)| Op::Sync {
            key,
            when,
            client,
            reports,
            stale,
        });
    let reclaim = (key(), when()).prop_map(|(key, when)| Op::Reclaim { key, when });
    let work = (0..CLIENTS.len(), key(), vec(work(), 1..=4))
        .prop_map(|(client, key, steps)| Op::Work { client, key, steps });
    let set_limit = (key(), 0u64..=24).prop_map(|(key, limit)| Op::SetLimit { key, limit });
    let set_group = (
        key(),
        0..GROUPS.len(),
        prop::option::of(0u64..=6),
        prop::bool::weighted(0.8),
    )
        .prop_map(|(key, group, limit, permitted)| Op::SetGroup {
            key,
            group,
            limit,
            permitted,
        });
    let remove_group =
        (key(), 0..GROUPS.len()).prop_map(|(key, group)| Op::RemoveGroup { key, group });
    let force_release = (key(), 0..CLIENTS.len(), when())
        .prop_map(|(key, client, when)| Op::ForceRelease { key, client, when });
    let delete_key = (key(), prop::bool::ANY, when())
        .prop_map(|(key, force, when)| Op::DeleteKey { key, force, when });
    match modes {
        Modes::Any => {
            let set_leases = (key(), lease_policy(Modes::Any))
                .prop_map(|(key, leases)| Op::SetLeases { key, leases });
            prop_oneof![
                6 => round,
                2 => sync,
                5 => work,
                1 => reclaim,
                1 => set_limit,
                1 => set_group,
                1 => remove_group,
                1 => set_leases,
                1 => force_release,
                1 => delete_key,
            ]
            .boxed()
        }
        _ => prop_oneof![
            6 => round,
            2 => sync,
            5 => work,
            1 => reclaim,
            1 => set_limit,
            1 => set_group,
            1 => remove_group,
            1 => force_release,
            1 => delete_key,
        ]
        .boxed(),
    }
}

pub(crate) fn scenario(modes: Modes) -> impl Strategy<Value = (Setup, Vec<Op>)> {
    (setup(modes), vec(op(modes), 1..=MAX_OPS))
}

pub(crate) fn pick(index: &Index, len: usize) -> Option<usize> {
    (len > 0).then(|| index.index(len))
}
