//! Observations of the engine's state and the checks the properties make.

use super::*;

/// Permits a key holds, counted from its grants and leases directly.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Exposure {
    pub(crate) granted: u64,
    pub(crate) leased: u64,
    /// Grant and lease permits outstanding per group.
    pub(crate) groups: BTreeMap<String, u64>,
}

impl Exposure {
    pub(crate) fn of(state: Option<&KeyState>) -> Self {
        Self::of_rows(state, |_| true)
    }

    /// The exposure of `client`'s rows alone.
    pub(crate) fn of_client(state: Option<&KeyState>, client: &str) -> Self {
        Self::of_rows(state, |owner| owner == client)
    }

    /// The exposure of the rows whose client `counts`.
    fn of_rows(state: Option<&KeyState>, counts: impl Fn(&str) -> bool) -> Self {
        let mut exposure = Exposure::default();
        let Some(state) = state else {
            return exposure;
        };
        for grant in state.grants().values().filter(|g| counts(&g.client_id)) {
            let outstanding = grant.permits - grant.released;
            exposure.granted += outstanding;
            *exposure.groups.entry(grant.group.clone()).or_default() += outstanding;
        }
        for lease in state.leases().values().filter(|l| counts(&l.client_id)) {
            let footprint = lease.permits - lease.released;
            exposure.leased += footprint;
            *exposure.groups.entry(lease.group.clone()).or_default() += footprint;
        }
        exposure
    }

    pub(crate) fn total(&self) -> u64 {
        self.granted + self.leased
    }

    pub(crate) fn group(&self, group: &str) -> u64 {
        self.groups.get(group).copied().unwrap_or(0)
    }
}

pub(crate) fn exposures(sem: &Semaphores) -> Vec<Exposure> {
    KEYS.iter().map(|key| Exposure::of(sem.key(key))).collect()
}

/// The most permits grants plus lease footprint may reach under a configuration.
pub(crate) fn ceiling(config: &KeyConfig) -> u64 {
    match config.leases.as_ref().map(|policy| &policy.provisioning) {
        None | Some(Provisioning::Strict) | Some(Provisioning::Under { .. }) => config.limit,
        Some(Provisioning::Over { extra }) => config.limit + extra.of(config.limit),
    }
}

/// Usage can be computed at any step without panicking and agrees with the state.
pub(crate) fn check_usage(sem: &Semaphores, step: usize) -> Result<(), TestCaseError> {
    for key in KEYS {
        let usage = sem.usage(key, sem.last_now_ms());
        let exposure = Exposure::of(sem.key(key));
        prop_assert!(
            // Usage counts overdue unclaimed grants and unacknowledged leases as
            // reclaimed already; the state holds them until the reclaim runs.
            usage.granted <= exposure.granted && usage.leased <= exposure.leased,
            "step {step}: usage of {key} ({} granted, {} leased) disagrees with its \
             grants and leases ({} granted, {} leased)",
            usage.granted,
            usage.leased,
            exposure.granted,
            exposure.leased
        );
    }
    check_usage_sums(sem, step)
}

/// The all-keys sums the node's gauges export, added up a slice at a time (of
/// 1 to 3 keys, by step), equal every key's own usage added up.
fn check_usage_sums(sem: &Semaphores, step: usize) -> Result<(), TestCaseError> {
    let now_ms = sem.last_now_ms();
    let mut expected = UsageCounts::default();
    for key in sem.keys().keys() {
        let usage = sem.usage(key, now_ms);
        expected += UsageCounts {
            granted: usage.granted,
            leased: usage.leased,
            available: usage.available,
        };
    }
    let (mut sum, mut after) = (UsageCounts::default(), None::<std::sync::Arc<str>>);
    loop {
        let (slice, next) = sem.add_up_usage(after.as_deref(), 1 + step % 3, now_ms);
        sum += slice;
        match next {
            Some(key) => after = Some(key),
            None => break,
        }
    }
    prop_assert_eq!(sum, expected, "step {}: the sliced sums disagree", step);
    Ok(())
}

/// No step takes a key's total above its ceiling, and while a lowered limit leaves
/// it above, no step increases it; likewise for each group's cap, and a group that
/// is not permitted never grows.
pub(crate) fn check_ceilings(
    sem: &Semaphores,
    before: &[Exposure],
    step: usize,
    op: &Op,
) -> Result<(), TestCaseError> {
    for (k, key) in KEYS.iter().enumerate() {
        let after = Exposure::of(sem.key(key));
        let ceiling = ceiling(sem.config(key));
        prop_assert!(
            after.total() <= ceiling.max(before[k].total()),
            "step {step} took {key} from {} to {} granted + {} leased = {}, over its \
             ceiling of {ceiling} (config {:?})\nop: {op:?}",
            before[k].total(),
            after.granted,
            after.leased,
            after.total(),
            sem.config(key)
        );
        let groups = sem.key(key).map(|state| &state.meta().groups);
        for group in GROUPS {
            let Some(config) = groups.and_then(|groups| groups.get(group)) else {
                continue;
            };
            let (was, is) = (before[k].group(group), after.group(group));
            let cap = if config.permitted {
                config.limit
            } else {
                Some(0)
            };
            if let Some(cap) = cap {
                prop_assert!(
                    is <= cap.max(was),
                    "step {step} took group {group} of {key} from {was} to {is} permits, \
                     over its cap {cap} ({config:?})\nop: {op:?}"
                );
            }
        }
    }
    Ok(())
}

pub(crate) fn run_never_over(setup: &Setup, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut harness = Harness::new(setup);
    for (step, op) in ops.iter().enumerate() {
        let before = exposures(&harness.sem);
        harness.step(op);
        check_usage(&harness.sem, step)?;
        check_ceilings(&harness.sem, &before, step, op)?;
    }
    Ok(())
}

/// Runs a sequence, optionally restoring from a snapshot (a JSON round trip) before
/// one step; returns every outcome and the state's bytes after every step.
pub(crate) fn run_recorded(
    setup: &Setup,
    ops: &[Op],
    restore_before: Option<usize>,
) -> (Vec<Outcome>, Vec<Vec<u8>>) {
    let mut harness = Harness::new(setup);
    let mut outcomes = Vec::with_capacity(ops.len());
    let mut images = Vec::with_capacity(ops.len());
    for (step, op) in ops.iter().enumerate() {
        if restore_before == Some(step) {
            let bytes = serde_json::to_vec(&harness.sem).expect("state serialises");
            harness.sem = serde_json::from_slice(&bytes).expect("snapshot loads");
        }
        outcomes.push(harness.step(op));
        images.push(serde_json::to_vec(&harness.sem).expect("state serialises"));
    }
    (outcomes, images)
}

/// The canonical state of every key, for comparisons that ignore the clock.
pub(crate) fn canonical_keys(sem: &Semaphores) -> String {
    serde_json::to_string(sem.keys()).expect("state serialises")
}

/// sync(m); sync(m) == sync(m), and a stale report after a newer one changes nothing.
pub(crate) fn check_report_idempotence(
    harness: &Harness,
    key: usize,
    now_ms: u64,
    sync: &PermitSync,
    newer: &PermitSync,
    stale: Option<&PermitSync>,
    step: usize,
) -> Result<(), TestCaseError> {
    let key = KEYS[key];
    let mut once = harness.sem.clone();
    once.sync(key, now_ms, sync);
    let mut twice = once.clone();
    twice.sync(key, now_ms, sync);
    prop_assert_eq!(
        canonical_keys(&once),
        canonical_keys(&twice),
        "step {}: applying {:?} to {} twice changed the state again",
        step,
        sync,
        key
    );
    if let Some(stale) = stale {
        let mut newest = once.clone();
        newest.sync(key, now_ms, newer);
        let mut then_stale = newest.clone();
        then_stale.sync(key, now_ms, stale);
        prop_assert_eq!(
            canonical_keys(&newest),
            canonical_keys(&then_stale),
            "step {}: stale report {:?} after {:?} changed {}",
            step,
            stale,
            newer,
            key
        );
    }
    Ok(())
}
