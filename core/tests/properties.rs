//! Property tests of the round engine.
//!
//! Each case builds a small world: two keys, three groups, four clients (some of
//! which support leases), one lease policy, and a sequence of up to 30 log entries
//! (rounds, syncs, reclaim passes, settings changes, operators' force releases)
//! interleaved with client-local
//! work (claiming, releasing, drawing from leases, retiring them). The clients are
//! modelled: each keeps, per key, the grants and leases it was told about and the
//! cumulative counts it reports, as the seed's queue does. On top of that honest
//! behaviour the generators add what a network does to reports: duplicates (the
//! same request twice in one round), stale reports replayed from a client's
//! history, reports of unknown ids and of other clients' ids, requestId retries and
//! lost replies (only for clients without lease support: a lost lease reply strands
//! its footprint by design).
//!
//! Time comes from the entries: mostly forward, sometimes past every claim deadline
//! or lease TTL, sometimes backwards (the state keeps the max). Log indexes grow
//! strictly, as Raft's do.
//!
//! Any panic inside the engine (u64 underflow included) fails a case like a broken
//! assertion does.

use std::collections::{BTreeMap, BTreeSet};

use permitd_core::config::{Amount, LimitedGroups};
use permitd_core::force_release::ForceReleased;
use permitd_core::protocol::{
    Demand, GrantReport, GrantResult, GrantStatus, GrantedPermits, LeaseGrant, LeaseReport,
    PermitRequest, PermitSync, SemaphoreRequest, V1,
};
use permitd_core::round::RoundOutcome;
use permitd_core::state::KeyState;
use permitd_core::sync::SyncOutcome;
use permitd_core::validate::validate_request;
use permitd_core::{
    Event, GroupConfig, IdAllocator, InvalidInput, KeyConfig, KeyConfigUpdate, LeasePolicy,
    Provisioning, Semaphores,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

/// 2025-11-30T00:00:00Z: the first entry's clock.
const T0: u64 = 1_764_460_800_000;
const KEYS: [&str; 2] = ["acct-a", "acct-b"];
const GROUPS: [&str; 3] = ["wf-1", "wf-2", "wf-3"];
const CLIENTS: [&str; 4] = ["runner-0", "runner-1", "runner-2", "runner-3"];
/// Longest operation sequence: keeps 1000 cases of every property in a few seconds.
const MAX_OPS: usize = 30;
/// Longest lease TTL the generators pick.
const MAX_TTL_MS: u64 = 20_000;

/// Honours `PROPTEST_CASES` (CI sets 1000). Persistence is off: a failure prints
/// its minimal case, which belongs in a named regression test, not a side file.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// The world and the operations on it
// ---------------------------------------------------------------------------

/// What stays fixed for one case.
#[derive(Debug, Clone)]
struct Setup {
    limits: [u64; 2],
    grant_timeout_ms: u64,
    round_period_ms: u64,
    leases: Option<LeasePolicy>,
    /// Clients that send `leases` in every message.
    lease_clients: [bool; 4],
}

impl Setup {
    fn key_config(&self, limit: u64) -> KeyConfig {
        KeyConfig {
            limit,
            round_wait_ms: 1_000,
            round_period_ms: self.round_period_ms,
            grant_timeout_ms: self.grant_timeout_ms,
            leases: self.leases.clone(),
        }
    }
}

/// The clock of an entry, relative to the largest clock applied so far.
#[derive(Debug, Clone, Copy)]
enum When {
    Later(u64),
    /// Past every claim deadline set so far.
    PastClaimDeadlines,
    /// Past every lease expiry set so far.
    PastLeaseTtl,
    /// A leader with a slower clock: the state must keep its max.
    Earlier(u64),
}

#[derive(Debug, Clone)]
enum Op {
    /// One round entry with requests in arrival order.
    Round {
        key: usize,
        when: When,
        requests: Vec<RequestPlan>,
    },
    Sync {
        key: usize,
        when: When,
        client: usize,
        reports: ReportPlan,
        /// Picks a stale report from the client's history (idempotence property).
        stale: Index,
    },
    /// The leader's claim-deadline timer.
    Reclaim {
        key: usize,
        when: When,
    },
    /// Client-local work between messages: no log entry.
    Work {
        client: usize,
        key: usize,
        steps: Vec<Work>,
    },
    SetLimit {
        key: usize,
        limit: u64,
    },
    SetGroup {
        key: usize,
        group: usize,
        limit: Option<u64>,
        permitted: bool,
    },
    RemoveGroup {
        key: usize,
        group: usize,
    },
    /// Switches the key's lease policy (only where the property allows it).
    SetLeases {
        key: usize,
        leases: Option<LeasePolicy>,
    },
    /// An operator drops one client's footprint; the client, not dead after
    /// all, keeps working and reporting the grants and leases it knew.
    ForceRelease {
        key: usize,
        client: usize,
        when: When,
    },
}

#[derive(Debug, Clone)]
struct RequestPlan {
    client: usize,
    /// (group, count, age of the oldest queued item in ms).
    demand: Vec<(usize, u64, u64)>,
    reports: ReportPlan,
    request_id: RequestIdPlan,
    /// The reply never reaches the client (honoured for clients without leases).
    lose_reply: bool,
    /// The same message arrives twice in this round.
    duplicate: bool,
}

#[derive(Debug, Clone)]
enum RequestIdPlan {
    None,
    Fresh,
    /// Reuses one of the client's earlier requestIds (a retry), with today's body.
    Retry(Index),
}

#[derive(Debug, Clone)]
struct ReportPlan {
    kind: ReportKind,
    noise: Vec<Noise>,
}

#[derive(Debug, Clone)]
enum ReportKind {
    /// The client's current cumulative counts.
    Current,
    /// A report the client sent earlier, replayed (a delayed or retried message).
    Stale(Index),
    /// No reports at all.
    Nothing,
}

/// Reports no honest client of this key would send about its own holdings.
#[derive(Debug, Clone)]
enum Noise {
    /// A well-formed id the holder never minted.
    UnknownGrant(u32, u64, u64),
    UnknownLease(u32, u64, u64),
    /// Not a UUID at all.
    NotAnId,
    /// Another client's live grant, with made-up counts.
    OthersGrant(Index, u64, u64),
    /// Another client's live lease, with made-up counts.
    OthersLease(Index, u64, u64),
}

#[derive(Debug, Clone)]
enum Work {
    Claim(Index, u64),
    Release(Index, u64),
    Draw(Index, u64),
    ReturnDrawn(Index, u64),
    Retire(Index),
}

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/// Which lease policies a property runs under.
#[derive(Debug, Clone, Copy)]
enum Modes {
    NoneStrictOrUnder,
    Over,
    /// Any policy, and policy switches in the middle of a sequence.
    Any,
}

fn amount() -> impl Strategy<Value = Amount> {
    prop_oneof![
        (0u64..=12).prop_map(Amount::Permits),
        // Eighths are exact in binary: ratios without float surprises.
        (0u32..=12).prop_map(|eighths| Amount::Ratio {
            ratio: f64::from(eighths) / 8.0
        }),
    ]
}

fn provisioning(modes: Modes) -> BoxedStrategy<Option<Provisioning>> {
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

fn lease_policy(modes: Modes) -> impl Strategy<Value = Option<LeasePolicy>> {
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

fn setup(modes: Modes) -> impl Strategy<Value = Setup> {
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

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        6 => (0u64..=2_000).prop_map(When::Later),
        1 => Just(When::PastClaimDeadlines),
        1 => Just(When::PastLeaseTtl),
        1 => (1u64..=5_000).prop_map(When::Earlier),
    ]
}

fn noise() -> impl Strategy<Value = Noise> {
    let count = || 0u64..=20;
    prop_oneof![
        (any::<u32>(), count(), count()).prop_map(|(n, a, b)| Noise::UnknownGrant(n, a, b)),
        (any::<u32>(), count(), count()).prop_map(|(n, a, b)| Noise::UnknownLease(n, a, b)),
        Just(Noise::NotAnId),
        (any::<Index>(), count(), count()).prop_map(|(i, a, b)| Noise::OthersGrant(i, a, b)),
        (any::<Index>(), count(), count()).prop_map(|(i, a, b)| Noise::OthersLease(i, a, b)),
    ]
}

fn report_plan() -> impl Strategy<Value = ReportPlan> {
    let kind = prop_oneof![
        8 => Just(ReportKind::Current),
        2 => any::<Index>().prop_map(ReportKind::Stale),
        1 => Just(ReportKind::Nothing),
    ];
    let noise = prop_oneof![3 => Just(vec![]), 1 => vec(noise(), 1..=2)];
    (kind, noise).prop_map(|(kind, noise)| ReportPlan { kind, noise })
}

fn request_plan() -> impl Strategy<Value = RequestPlan> {
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

fn work() -> impl Strategy<Value = Work> {
    prop_oneof![
        3 => (any::<Index>(), 1u64..=8).prop_map(|(i, n)| Work::Claim(i, n)),
        3 => (any::<Index>(), 1u64..=8).prop_map(|(i, n)| Work::Release(i, n)),
        3 => (any::<Index>(), 1u64..=8).prop_map(|(i, n)| Work::Draw(i, n)),
        2 => (any::<Index>(), 1u64..=8).prop_map(|(i, n)| Work::ReturnDrawn(i, n)),
        1 => any::<Index>().prop_map(Work::Retire),
    ]
}

fn op(modes: Modes) -> BoxedStrategy<Op> {
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
        ]
        .boxed(),
    }
}

fn scenario(modes: Modes) -> impl Strategy<Value = (Setup, Vec<Op>)> {
    (setup(modes), vec(op(modes), 1..=MAX_OPS))
}

fn pick(index: &Index, len: usize) -> Option<usize> {
    (len > 0).then(|| index.index(len))
}

// ---------------------------------------------------------------------------
// The client model
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct HeldGrant {
    permits: u64,
    claimed: u64,
    released: u64,
}

#[derive(Debug, Clone)]
struct HeldLease {
    permits: u64,
    drawn: u64,
    released: u64,
    /// The client stopped drawing and reports `retired: true` from now on.
    retired: bool,
    /// The holder said stop (expiry in the past); the client draws no more.
    stopped: bool,
}

#[derive(Debug, Clone, Default)]
struct Reports {
    grants: Vec<GrantReport>,
    leases: Vec<LeaseReport>,
}

/// What one client holds at one key and reports about it.
#[derive(Debug, Clone, Default)]
struct Holdings {
    grants: BTreeMap<String, HeldGrant>,
    leases: BTreeMap<String, HeldLease>,
    /// Ids the holder said it does not know: never resurrected by a stale echo.
    gone: BTreeSet<String>,
    /// Every current report sent, oldest first: the source of stale replays.
    sent: Vec<Reports>,
    request_ids: Vec<String>,
}

impl Holdings {
    /// Cumulative counts as the client sees them now.
    fn current(&self) -> Reports {
        Reports {
            grants: self
                .grants
                .iter()
                .map(|(id, grant)| GrantReport {
                    grant_id: id.clone(),
                    claimed: grant.claimed,
                    released: grant.released,
                })
                .collect(),
            leases: self
                .leases
                .iter()
                .map(|(id, lease)| LeaseReport {
                    lease_id: id.clone(),
                    drawn: lease.drawn,
                    released: lease.released,
                    retired: lease.retired,
                })
                .collect(),
        }
    }

    fn work(&mut self, step: &Work) {
        match step {
            Work::Claim(index, count) => {
                if let Some(grant) = nth(&mut self.grants, index) {
                    grant.claimed = (grant.claimed + count).min(grant.permits);
                }
            }
            Work::Release(index, count) => {
                if let Some(grant) = nth(&mut self.grants, index) {
                    grant.released = (grant.released + count).min(grant.claimed);
                }
            }
            Work::Draw(index, count) => {
                if let Some(lease) = nth(&mut self.leases, index) {
                    if !lease.retired && !lease.stopped {
                        lease.drawn = (lease.drawn + count).min(lease.permits);
                    }
                }
            }
            Work::ReturnDrawn(index, count) => {
                if let Some(lease) = nth(&mut self.leases, index) {
                    lease.released = (lease.released + count).min(lease.drawn);
                }
            }
            Work::Retire(index) => {
                if let Some(lease) = nth(&mut self.leases, index) {
                    lease.retired = true;
                }
            }
        }
    }

    /// All work finished and returned, every lease retired.
    fn finish_everything(&mut self) {
        for grant in self.grants.values_mut() {
            grant.released = grant.claimed;
        }
        for lease in self.leases.values_mut() {
            lease.released = lease.drawn;
            lease.retired = true;
        }
    }

    /// Takes in what the holder answered.
    fn absorb(
        &mut self,
        grants: &[GrantedPermits],
        results: &[GrantResult],
        leases: Option<&[LeaseGrant]>,
        contended: bool,
        now_ms: u64,
    ) {
        for granted in grants {
            let id = granted.grant_id.to_string();
            if !self.gone.contains(&id) {
                self.grants.entry(id).or_insert(HeldGrant {
                    permits: granted.permits,
                    claimed: 0,
                    released: 0,
                });
            }
        }
        for result in results {
            let Some(grant) = self.grants.get_mut(&result.grant_id) else {
                continue; // someone else's id, reported as noise
            };
            match result.status {
                GrantStatus::Ok => {}
                // Claimed after the deadline: the holder's count stands and the
                // client requeues the rest.
                GrantStatus::Expired => {
                    grant.claimed = grant.claimed.min(result.claimed);
                    grant.released = grant.released.min(grant.claimed);
                }
                GrantStatus::NotFound => {
                    self.grants.remove(&result.grant_id);
                    self.gone.insert(result.grant_id.clone());
                }
            }
        }
        for echo in leases.unwrap_or_default() {
            if self.gone.contains(&echo.lease_id) {
                continue;
            }
            if echo.group.is_empty() {
                // The holder does not know it (settled, or never ours).
                if self.leases.remove(&echo.lease_id).is_some() {
                    self.gone.insert(echo.lease_id.clone());
                }
                continue;
            }
            let lease = self
                .leases
                .entry(echo.lease_id.clone())
                .or_insert(HeldLease {
                    permits: echo.permits,
                    drawn: 0,
                    released: 0,
                    retired: false,
                    stopped: false,
                });
            if echo.expires_at_ms <= now_ms {
                lease.stopped = true;
            }
        }
        if contended {
            // The seed's queue hands back idle headroom when the holder is contended.
            for lease in self.leases.values_mut() {
                if lease.drawn < lease.permits {
                    lease.retired = true;
                }
            }
        }
    }
}

fn nth<'a, T>(map: &'a mut BTreeMap<String, T>, index: &Index) -> Option<&'a mut T> {
    let position = pick(index, map.len())?;
    map.values_mut().nth(position)
}

// ---------------------------------------------------------------------------
// The harness: applies operations to the engine and to the client model
// ---------------------------------------------------------------------------

/// Everything an operation returned, for the determinism property.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Round(RoundOutcome),
    Sync(SyncOutcome),
    Reclaim(Vec<Event>),
    Config(Result<KeyConfig, InvalidInput>),
    Group(Result<(), InvalidInput>),
    Released(ForceReleased, Vec<Event>),
    Local,
}

#[derive(Debug, Clone)]
struct Harness {
    sem: Semaphores,
    setup: Setup,
    /// Each key's full configuration, as the admin last set it.
    configs: Vec<KeyConfig>,
    /// `[client][key]`.
    clients: Vec<Vec<Holdings>>,
    last_index: u64,
}

impl Harness {
    fn new(setup: &Setup) -> Self {
        let mut sem = Semaphores::new(setup.key_config(setup.limits[0])).expect("valid defaults");
        let configs: Vec<KeyConfig> = setup
            .limits
            .iter()
            .map(|&limit| setup.key_config(limit))
            .collect();
        for (key, config) in KEYS.iter().zip(&configs) {
            sem.set_key_config(key, &full_update(config))
                .expect("valid key config");
        }
        Self {
            sem,
            setup: setup.clone(),
            configs,
            clients: vec![vec![Holdings::default(); KEYS.len()]; CLIENTS.len()],
            last_index: 10,
        }
    }

    fn clock(&self) -> u64 {
        self.sem.last_now_ms().max(T0)
    }

    /// The next log index: strictly increasing, with gaps for other entries.
    fn next_index(&mut self) -> u64 {
        self.last_index += 1 + self.last_index % 3;
        self.last_index
    }

    fn entry_now(&self, when: When) -> u64 {
        let clock = self.clock();
        match when {
            When::Later(ms) => clock + ms,
            When::PastClaimDeadlines => clock + self.setup.grant_timeout_ms + 1,
            When::PastLeaseTtl => clock + MAX_TTL_MS + 1,
            When::Earlier(ms) => clock - ms,
        }
    }

    fn supports_leases(&self, client: usize) -> bool {
        self.setup.lease_clients[client]
    }

    /// The reports a client puts in a message, noise included.
    fn reports(&mut self, client: usize, key: usize, plan: &ReportPlan) -> Reports {
        let holdings = &mut self.clients[client][key];
        let mut reports = match &plan.kind {
            ReportKind::Current => None,
            ReportKind::Stale(index) => {
                pick(index, holdings.sent.len()).map(|i| holdings.sent[i].clone())
            }
            ReportKind::Nothing => Some(Reports::default()),
        }
        .unwrap_or_else(|| {
            let current = holdings.current();
            holdings.sent.push(current.clone());
            current
        });
        let state = self.sem.key(KEYS[key]);
        for noise in &plan.noise {
            match noise {
                Noise::UnknownGrant(n, claimed, released) => reports.grants.push(GrantReport {
                    grant_id: never_minted(*n).to_string(),
                    claimed: *claimed,
                    released: *released,
                }),
                Noise::UnknownLease(n, drawn, released) => reports.leases.push(LeaseReport {
                    lease_id: never_minted(*n).to_string(),
                    drawn: *drawn,
                    released: *released,
                    retired: n % 2 == 0,
                }),
                Noise::NotAnId => {
                    reports.grants.push(GrantReport {
                        grant_id: "not-a-grant-id".into(),
                        claimed: 3,
                        released: 1,
                    });
                    reports.leases.push(LeaseReport {
                        lease_id: "not-a-lease-id".into(),
                        drawn: 3,
                        released: 1,
                        retired: false,
                    });
                }
                Noise::OthersGrant(index, claimed, released) => {
                    let others = state.map_or_else(Vec::new, |state| {
                        foreign_ids(state.grants(), |grant| &grant.client_id, CLIENTS[client])
                    });
                    if let Some(i) = pick(index, others.len()) {
                        reports.grants.push(GrantReport {
                            grant_id: others[i].clone(),
                            claimed: *claimed,
                            released: *released,
                        });
                    }
                }
                Noise::OthersLease(index, drawn, released) => {
                    let others = state.map_or_else(Vec::new, |state| {
                        foreign_ids(state.leases(), |lease| &lease.client_id, CLIENTS[client])
                    });
                    if let Some(i) = pick(index, others.len()) {
                        reports.leases.push(LeaseReport {
                            lease_id: others[i].clone(),
                            drawn: *drawn,
                            released: *released,
                            retired: true,
                        });
                    }
                }
            }
        }
        reports
    }

    fn request(&mut self, key: usize, plan: &RequestPlan, now_ms: u64) -> PermitRequest {
        let reports = self.reports(plan.client, key, &plan.reports);
        let holdings = &mut self.clients[plan.client][key];
        let request_id = match &plan.request_id {
            RequestIdPlan::None => None,
            RequestIdPlan::Retry(index) if !holdings.request_ids.is_empty() => {
                let i = index.index(holdings.request_ids.len());
                Some(holdings.request_ids[i].clone())
            }
            RequestIdPlan::Retry(_) | RequestIdPlan::Fresh => {
                let id = format!("{}-{}", KEYS[key], holdings.request_ids.len());
                holdings.request_ids.push(id.clone());
                Some(id)
            }
        };
        let mut seen = BTreeSet::new();
        let demand = plan
            .demand
            .iter()
            .filter(|(group, _, _)| seen.insert(*group))
            .map(|&(group, count, age_ms)| Demand {
                group: GROUPS[group].to_owned(),
                count,
                oldest_at_ms: now_ms.saturating_sub(age_ms),
            })
            .collect();
        PermitRequest {
            v: V1,
            client_id: CLIENTS[plan.client].to_owned(),
            request_id,
            demand,
            grants: reports.grants,
            leases: self.supports_leases(plan.client).then_some(reports.leases),
        }
    }

    /// Builds a sync message and the clock of its entry (no state change).
    fn prepare_sync(
        &mut self,
        key: usize,
        when: When,
        client: usize,
        plan: &ReportPlan,
    ) -> (u64, PermitSync) {
        let now_ms = self.entry_now(when);
        let reports = self.reports(client, key, plan);
        (now_ms, self.sync_message(client, reports))
    }

    fn sync_message(&self, client: usize, reports: Reports) -> PermitSync {
        let sync = PermitSync {
            v: V1,
            client_id: CLIENTS[client].to_owned(),
            grants: reports.grants,
            leases: self.supports_leases(client).then_some(reports.leases),
        };
        assert_valid(&SemaphoreRequest::Sync(sync.clone()));
        sync
    }

    fn apply_sync(
        &mut self,
        key: usize,
        now_ms: u64,
        client: usize,
        sync: &PermitSync,
    ) -> SyncOutcome {
        let outcome = self.sem.sync(KEYS[key], now_ms, sync);
        let clock = self.sem.last_now_ms();
        let answer = &outcome.answer;
        self.clients[client][key].absorb(
            &[],
            &answer.grant_results,
            answer.leases.as_deref(),
            answer.contended,
            clock,
        );
        outcome
    }

    fn set_config(&mut self, key: usize) -> Outcome {
        Outcome::Config(
            self.sem
                .set_key_config(KEYS[key], &full_update(&self.configs[key])),
        )
    }

    fn step(&mut self, op: &Op) -> Outcome {
        match op {
            Op::Round {
                key,
                when,
                requests,
            } => {
                let now_ms = self.entry_now(*when);
                let mut messages = Vec::new();
                for plan in requests {
                    let lost = plan.lose_reply && !self.supports_leases(plan.client);
                    let request = self.request(*key, plan, now_ms);
                    assert_valid(&SemaphoreRequest::Request(request.clone()));
                    if plan.duplicate {
                        messages.push((plan.client, lost, request.clone()));
                    }
                    messages.push((plan.client, lost, request));
                }
                let requests: Vec<PermitRequest> = messages
                    .iter()
                    .map(|(_, _, request)| request.clone())
                    .collect();
                let mut ids = IdAllocator::new(self.next_index());
                let outcome = self.sem.round(KEYS[*key], &mut ids, now_ms, &requests);
                assert_eq!(
                    outcome.answers.len(),
                    requests.len(),
                    "one answer per request"
                );
                let clock = self.sem.last_now_ms();
                for ((client, lost, _), answer) in messages.iter().zip(&outcome.answers) {
                    if !lost {
                        self.clients[*client][*key].absorb(
                            &answer.grants,
                            &answer.grant_results,
                            answer.leases.as_deref(),
                            answer.contended,
                            clock,
                        );
                    }
                }
                Outcome::Round(outcome)
            }
            Op::Sync {
                key,
                when,
                client,
                reports,
                ..
            } => {
                let (now_ms, sync) = self.prepare_sync(*key, *when, *client, reports);
                Outcome::Sync(self.apply_sync(*key, now_ms, *client, &sync))
            }
            Op::Reclaim { key, when } => {
                let now_ms = self.entry_now(*when);
                Outcome::Reclaim(self.sem.reclaim(KEYS[*key], now_ms))
            }
            Op::Work { client, key, steps } => {
                for step in steps {
                    self.clients[*client][*key].work(step);
                }
                Outcome::Local
            }
            Op::SetLimit { key, limit } => {
                self.configs[*key].limit = *limit;
                self.set_config(*key)
            }
            Op::SetLeases { key, leases } => {
                self.configs[*key].leases = leases.clone();
                self.set_config(*key)
            }
            Op::SetGroup {
                key,
                group,
                limit,
                permitted,
            } => Outcome::Group(self.sem.set_group(
                KEYS[*key],
                GROUPS[*group],
                GroupConfig {
                    limit: *limit,
                    permitted: *permitted,
                },
            )),
            Op::RemoveGroup { key, group } => {
                self.sem.remove_group(KEYS[*key], GROUPS[*group]);
                Outcome::Local
            }
            Op::ForceRelease { key, client, when } => {
                let now_ms = self.entry_now(*when);
                let (released, events) =
                    self.sem.force_release(KEYS[*key], CLIENTS[*client], now_ms);
                Outcome::Released(released, events)
            }
        }
    }

    /// Every client finishes its work, returns everything and reports it; then the
    /// claim deadlines pass and the leader's reclaim timer fires.
    fn settle(&mut self) {
        for client in 0..CLIENTS.len() {
            for key in 0..KEYS.len() {
                self.clients[client][key].finish_everything();
                let reports = self.clients[client][key].current();
                let sync = self.sync_message(client, reports);
                let now_ms = self.clock();
                self.apply_sync(key, now_ms, client, &sync);
            }
        }
        let past_deadlines = self.clock() + self.setup.grant_timeout_ms + 1;
        for key in KEYS {
            self.sem.reclaim(key, past_deadlines);
        }
    }
}

fn full_update(config: &KeyConfig) -> KeyConfigUpdate {
    KeyConfigUpdate {
        limit: Some(config.limit),
        round_wait_ms: Some(config.round_wait_ms),
        round_period_ms: Some(config.round_period_ms),
        grant_timeout_ms: Some(config.grant_timeout_ms),
        leases: Some(config.leases.clone()),
    }
}

/// An id from a log index far beyond any this test reaches.
fn never_minted(n: u32) -> permitd_core::GrantId {
    IdAllocator::new((1 << 40) + u64::from(n)).grant_id()
}

/// The generators must only produce what the node's validation would let through.
fn assert_valid(message: &SemaphoreRequest) {
    if let Err(error) = validate_request(message) {
        panic!("the test generated an invalid message ({error}): {message:?}");
    }
}

// ---------------------------------------------------------------------------
// Observations
// ---------------------------------------------------------------------------

/// Permits a key holds, counted from its grants and leases directly.
#[derive(Debug, Clone, Default, PartialEq)]
struct Exposure {
    granted: u64,
    leased: u64,
    /// Grant and lease permits outstanding per group.
    groups: BTreeMap<String, u64>,
}

impl Exposure {
    fn of(state: Option<&KeyState>) -> Self {
        Self::of_rows(state, |_| true)
    }

    /// The exposure of `client`'s rows alone.
    fn of_client(state: Option<&KeyState>, client: &str) -> Self {
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

    fn total(&self) -> u64 {
        self.granted + self.leased
    }

    fn group(&self, group: &str) -> u64 {
        self.groups.get(group).copied().unwrap_or(0)
    }
}

fn exposures(sem: &Semaphores) -> Vec<Exposure> {
    KEYS.iter().map(|key| Exposure::of(sem.key(key))).collect()
}

/// The most permits grants plus lease footprint may reach under a configuration.
fn ceiling(config: &KeyConfig) -> u64 {
    match config.leases.as_ref().map(|policy| &policy.provisioning) {
        None | Some(Provisioning::Strict) | Some(Provisioning::Under { .. }) => config.limit,
        Some(Provisioning::Over { extra }) => config.limit + extra.of(config.limit),
    }
}

/// Usage can be computed at any step without panicking and agrees with the state.
fn check_usage(sem: &Semaphores, step: usize) -> Result<(), TestCaseError> {
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
    Ok(())
}

/// No step takes a key's total above its ceiling, and while a lowered limit leaves
/// it above, no step increases it; likewise for each group's cap, and a group that
/// is not permitted never grows.
fn check_ceilings(
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

fn run_never_over(setup: &Setup, ops: &[Op]) -> Result<(), TestCaseError> {
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
fn run_recorded(
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
fn canonical_keys(sem: &Semaphores) -> String {
    serde_json::to_string(sem.keys()).expect("state serialises")
}

/// sync(m); sync(m) == sync(m), and a stale report after a newer one changes nothing.
fn check_report_idempotence(
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

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// With `strict`, `under` or no leases, outstanding grants plus live lease
    /// footprint never exceed the limit; a lowered limit evicts nothing, and while
    /// usage is above it no step increases it. Group caps hold the same way.
    #[test]
    fn grants_plus_lease_footprint_never_exceed_the_limit_with_strict_under_or_no_leases(
        (setup, ops) in scenario(Modes::NoneStrictOrUnder)
    ) {
        run_never_over(&setup, &ops)?;
    }

    /// With `over`, the ceiling is `limit + extra`, with the same rule for a
    /// lowered limit.
    #[test]
    fn grants_plus_lease_footprint_never_exceed_limit_plus_extra_with_over_leases(
        (setup, ops) in scenario(Modes::Over)
    ) {
        run_never_over(&setup, &ops)?;
    }

    /// Two replicas applying the same entries agree byte for byte, after every
    /// entry and in every answer, also when one restarts from a snapshot.
    #[test]
    fn replaying_the_same_entries_gives_byte_identical_state_and_answers(
        (setup, ops) in scenario(Modes::Any),
        restore in any::<Index>(),
    ) {
        let (outcomes, images) = run_recorded(&setup, &ops, None);
        let (replayed, replayed_images) = run_recorded(&setup, &ops, None);
        let restore_before = restore.index(ops.len());
        let (restored, restored_images) = run_recorded(&setup, &ops, Some(restore_before));
        for step in 0..ops.len() {
            prop_assert_eq!(&outcomes[step], &replayed[step], "answers differ at step {}", step);
            prop_assert!(
                images[step] == replayed_images[step],
                "state bytes differ after step {}",
                step
            );
            prop_assert_eq!(
                &outcomes[step],
                &restored[step],
                "answers differ at step {} after a snapshot restore before step {}",
                step,
                restore_before
            );
            prop_assert!(
                images[step] == restored_images[step],
                "state bytes differ after step {} with a snapshot restore before step {}",
                step,
                restore_before
            );
        }
    }

    /// Reports are cumulative: a sync applied twice equals one, and a stale
    /// report after a newer one changes nothing. Checked at every sync entry and,
    /// at the end, for every client and key.
    #[test]
    fn a_report_applied_twice_or_after_a_newer_one_changes_nothing(
        (setup, ops) in scenario(Modes::Any)
    ) {
        let mut harness = Harness::new(&setup);
        for (step, op) in ops.iter().enumerate() {
            if let Op::Sync { key, when, client, reports, stale } = op {
                let (now_ms, sync) = harness.prepare_sync(*key, *when, *client, reports);
                let holdings = &harness.clients[*client][*key];
                let newer = harness.sync_message(*client, holdings.current());
                let stale = pick(stale, holdings.sent.len())
                    .map(|i| harness.sync_message(*client, holdings.sent[i].clone()));
                check_report_idempotence(
                    &harness, *key, now_ms, &sync, &newer, stale.as_ref(), step,
                )?;
                harness.apply_sync(*key, now_ms, *client, &sync);
            } else {
                harness.step(op);
            }
            check_usage(&harness.sem, step)?;
        }
        let now_ms = harness.clock();
        for client in 0..CLIENTS.len() {
            for key in 0..KEYS.len() {
                let holdings = &harness.clients[client][key];
                let newer = harness.sync_message(client, holdings.current());
                let oldest = holdings
                    .sent
                    .first()
                    .map(|reports| harness.sync_message(client, reports.clone()));
                check_report_idempotence(
                    &harness, key, now_ms, &newer, &newer, oldest.as_ref(), ops.len(),
                )?;
            }
        }
    }

    /// Usage never underflows, and once every client has finished, returned and
    /// reported everything and the claim deadlines have passed, nothing is held.
    #[test]
    fn usage_returns_to_zero_once_every_client_settles(
        (setup, ops) in scenario(Modes::Any)
    ) {
        let mut harness = Harness::new(&setup);
        for (step, op) in ops.iter().enumerate() {
            harness.step(op);
            check_usage(&harness.sem, step)?;
        }
        harness.settle();
        let now_ms = harness.clock();
        for key in KEYS {
            let usage = harness.sem.usage(key, now_ms);
            let state = harness.sem.key(key);
            prop_assert!(
                usage.granted == 0 && usage.leased == 0,
                "{} still holds {} granted and {} leased after everything settled: {:?}",
                key,
                usage.granted,
                usage.leased,
                state
            );
            prop_assert!(
                state.map_or(true, |state| state.grants().is_empty() && state.leases().is_empty()),
                "{} still keeps grants or leases after everything settled: {:?}",
                key,
                state
            );
        }
    }

    /// The derived totals and indexes always equal a full recount.
    #[test]
    fn derived_tally_always_equals_a_recount(
        (setup, ops) in scenario(Modes::Any)
    ) {
        let mut harness = Harness::new(&setup);
        for (step, op) in ops.iter().enumerate() {
            harness.step(op);
            for (key, state) in harness.sem.keys() {
                prop_assert_eq!(
                    state.tally(),
                    &state.recount(),
                    "step {}: the tally of {} drifted from a recount\nop: {:?}",
                    step,
                    key,
                    op
                );
            }
        }
    }

    /// A force release drops exactly one client's grants and leases on one key,
    /// returns exactly their footprint, keeps the tally exact and leaves every
    /// other client's rows as they were; the key stays within its ceiling.
    #[test]
    fn a_force_release_frees_exactly_that_clients_footprint(
        (setup, ops) in scenario(Modes::Any),
        key in 0..KEYS.len(),
        client in 0..CLIENTS.len(),
    ) {
        let mut harness = Harness::new(&setup);
        for op in &ops {
            harness.step(op);
        }
        let (key, client) = (KEYS[key], CLIENTS[client]);
        let before = harness.sem.key(key).cloned();
        let held = Exposure::of_client(before.as_ref(), client);
        let others_before = Exposure::of(before.as_ref()).total() - held.total();
        let now_ms = harness.clock();
        let (released, events) = harness.sem.force_release(key, client, now_ms);
        prop_assert_eq!(released.permits, held.total());
        prop_assert_eq!(events.len(), usize::from(released != ForceReleased::default()));
        let after = harness.sem.key(key);
        prop_assert_eq!(Exposure::of_client(after, client).total(), 0);
        prop_assert_eq!(Exposure::of(after).total(), others_before);
        prop_assert!(Exposure::of(after).total() <= ceiling(harness.sem.config(key))
            .max(Exposure::of(before.as_ref()).total()));
        if let (Some(before), Some(after)) = (before.as_ref(), after) {
            prop_assert_eq!(after.tally(), &after.recount());
            let others = |state: &KeyState| {
                let grants: Vec<_> = state.grants().iter()
                    .filter(|(_, grant)| grant.client_id != client).collect();
                let leases: Vec<_> = state.leases().iter()
                    .filter(|(_, lease)| lease.client_id != client).collect();
                format!("{grants:?} {leases:?}")
            };
            prop_assert_eq!(others(before), others(after));
            prop_assert!(!after.answers().contains_key(client));
        }
    }
}

/// Ids of the rows (grants or leases) another client than `client` holds.
fn foreign_ids<K: ToString, V>(
    rows: &BTreeMap<K, V>,
    owner: impl Fn(&V) -> &String,
    client: &str,
) -> Vec<String> {
    rows.iter()
        .filter(|(_, row)| owner(row) != client)
        .map(|(id, _)| id.to_string())
        .collect()
}
