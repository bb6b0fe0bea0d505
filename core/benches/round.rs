//! What one round costs, and what it must not depend on.
//!
//! - `round/1000_requests_100_groups`: a busy round (1,000 requests over 100
//!   groups, each with a grant and a lease report) against a key holding 10,000
//!   live grants and 1,000 live leases. Each iteration runs exactly one round on a
//!   fresh clone of the prepared state (`iter_batched`; the clone is not timed).
//! - `round/small_round_key_among_{1,100k}`: a 5-request round on one key while 1
//!   or 100,000 other keys hold a grant each. The two must cost about the same: a
//!   round pays for its own key, never for the others.
//! - `round/10_requests_vs_live_grants/{1000,10000,100000}`: a 10-request round
//!   against a key already holding that many live grants. Must be flat: the engine
//!   keeps indexes (claim deadlines, lease expiries, per-group totals) so a round
//!   never rescans every grant.
//!
//! The small rounds run on one long-lived state: after each timed round the
//! clients (untimed) claim, release and report everything the round gave them and
//! retire their new leases, so every iteration sees the same state.
//!
//! `cargo bench -p permitd-core --bench round -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use permitd_core::contract::protocol::{
    Demand, GrantReport, LeaseReport, PermitGrant, PermitRequest, PermitSync, V1,
};
use permitd_core::limits::{MAX_DELAY_MS, MAX_LIMIT};
use permitd_core::{IdAllocator, KeyConfig, LeasePolicy, Provisioning, Semaphores};

const NOW: u64 = 1_764_460_800_000;
const HOT: &str = "acct-hot";
const GROUPS: usize = 100;

/// Strict leases; a limit and claim window large enough that nothing is blocked
/// or reclaimed while the benchmark runs.
fn key_config() -> KeyConfig {
    KeyConfig {
        limit: MAX_LIMIT,
        round_wait_ms: 1_000,
        round_period_ms: 2_000,
        grant_timeout_ms: MAX_DELAY_MS,
        leases: Some(LeasePolicy {
            permits_per_lease: 4,
            ttl_ms: MAX_DELAY_MS,
            max_groups: GROUPS as u64,
            max_clients_per_group: 1_000,
            ..LeasePolicy::with_provisioning(Provisioning::Strict)
        }),
    }
}

fn group_name(n: usize) -> String {
    format!("wf-{}", n % GROUPS)
}

fn request(client: String, group: String, count: u64, leases: bool) -> PermitRequest {
    PermitRequest {
        v: V1,
        client_id: client,
        request_id: None,
        demand: vec![Demand {
            group,
            count,
            oldest_at_ms: NOW - 5_000,
        }],
        grants: vec![],
        leases: leases.then(Vec::new),
        wait_ms: None,
    }
}

/// A state and the log index of its last entry.
struct Fixture {
    sem: Semaphores,
    last_index: u64,
}

impl Fixture {
    fn new() -> Self {
        Self {
            sem: Semaphores::new(key_config()).expect("valid config"),
            last_index: 0,
        }
    }

    fn round(&mut self, key: &str, requests: &[PermitRequest]) -> Vec<PermitGrant> {
        self.last_index += 1;
        let mut ids = IdAllocator::new(self.last_index);
        let answers = self.sem.round(key, &mut ids, NOW, requests).answers;
        self.sem.take_changes(); // what storage does after every apply
        answers
    }

    /// Fills `key` with `count` live grants (one permit each) over 100 groups,
    /// from clients without lease support, in rounds of 1,000 requests.
    fn add_grants(&mut self, key: &str, count: usize) {
        let base = self.last_index as usize * 1_000;
        for chunk in (0..count).collect::<Vec<_>>().chunks(1_000) {
            let requests: Vec<PermitRequest> = chunk
                .iter()
                .map(|&n| request(format!("grants-{}", base + n), group_name(n), 1, false))
                .collect();
            self.round(key, &requests);
        }
    }

    /// The untimed half of a small-round iteration: every client of the round
    /// claims and releases its new grants and retires its new leases, undrawn.
    fn settle(&mut self, key: &str, requests: &[PermitRequest], answers: &[PermitGrant]) {
        for (request, answer) in requests.iter().zip(answers) {
            let sync = PermitSync {
                v: V1,
                client_id: request.client_id.clone(),
                grants: answer
                    .grants
                    .iter()
                    .map(|grant| GrantReport {
                        grant_id: grant.grant_id.to_string(),
                        claimed: grant.permits,
                        released: grant.permits,
                    })
                    .collect(),
                leases: answer.leases.as_ref().map(|leases| {
                    leases
                        .iter()
                        .map(|lease| LeaseReport {
                            lease_id: lease.lease_id.clone(),
                            drawn: 0,
                            released: 0,
                            retired: true,
                        })
                        .collect()
                }),
            };
            self.sem.sync(key, NOW, &sync);
        }
        self.sem.take_changes();
    }

    /// Times `requests` as one round of `key`, settling after each (untimed) so
    /// every iteration starts from the same state.
    fn time_rounds(&mut self, key: &str, requests: &[PermitRequest], iters: u64) -> Duration {
        let mut elapsed = Duration::ZERO;
        for _ in 0..iters {
            self.last_index += 1;
            let mut ids = IdAllocator::new(self.last_index);
            let start = Instant::now();
            let outcome = self.sem.round(key, &mut ids, NOW, black_box(requests));
            elapsed += start.elapsed();
            self.settle(key, requests, &outcome.answers);
        }
        elapsed
    }
}

/// 5 requests: three lease clients and two without, over 3 groups.
fn small_round() -> Vec<PermitRequest> {
    (0..5)
        .map(|n| request(format!("small-{n}"), group_name(n % 3), 2, n < 3))
        .collect()
}

fn busy_round(c: &mut Criterion) {
    let mut fixture = Fixture::new();
    // 1,000 lease clients, one per (group, slot): a grant and a lease each.
    let lease_clients: Vec<PermitRequest> = (0..1_000)
        .map(|n| request(format!("runner-{n}"), group_name(n), 1, true))
        .collect();
    let answers = fixture.round(HOT, &lease_clients);
    fixture.add_grants(HOT, 9_000);
    let state = fixture.sem.key(HOT).expect("hot key");
    assert_eq!(
        (state.grants().len(), state.leases().len()),
        (10_000, 1_000)
    );

    // The round: each runner reports its grant (claimed) and its lease (partly
    // drawn, so it keeps it) and asks for two more permits in its group.
    let requests: Vec<PermitRequest> = lease_clients
        .iter()
        .zip(&answers)
        .map(|(asked, answer)| {
            let grant = &answer.grants[0];
            let lease = &answer.leases.as_ref().expect("lease client")[0];
            PermitRequest {
                grants: vec![GrantReport {
                    grant_id: grant.grant_id.to_string(),
                    claimed: grant.permits,
                    released: 0,
                }],
                leases: Some(vec![LeaseReport {
                    lease_id: lease.lease_id.clone(),
                    drawn: 1,
                    released: 0,
                    retired: false,
                }]),
                demand: vec![Demand {
                    count: 2,
                    ..asked.demand[0].clone()
                }],
                ..asked.clone()
            }
        })
        .collect();
    let index = fixture.last_index + 1;
    let prepared = fixture.sem;
    let once = prepared
        .clone()
        .round(HOT, &mut IdAllocator::new(index), NOW + 1, &requests);
    assert_eq!(once.granted, 2_000, "every request is granted in full");

    let mut group = c.benchmark_group("round");
    group.sample_size(30);
    group.bench_function("1000_requests_100_groups", |b| {
        b.iter_batched(
            || prepared.clone(),
            |mut sem| {
                let outcome = sem.round(HOT, &mut IdAllocator::new(index), NOW + 1, &requests);
                (sem, outcome) // dropped after timing
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

fn small_round_among_other_keys(c: &mut Criterion) {
    let requests = small_round();
    let mut group = c.benchmark_group("round");
    for (name, others) in [
        ("small_round_key_among_1", 1),
        ("small_round_key_among_100k", 100_000),
    ] {
        let mut fixture = Fixture::new();
        for n in 0..others {
            let key = format!("acct-{n}");
            fixture.round(
                &key,
                &[request(format!("other-{n}"), group_name(n), 1, false)],
            );
        }
        assert_eq!(fixture.sem.keys().len(), others);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| fixture.time_rounds(HOT, &requests, iters));
        });
    }
    group.finish();
}

fn small_round_vs_live_grants(c: &mut Criterion) {
    let requests: Vec<PermitRequest> = (0..10)
        .map(|n| request(format!("small-{n}"), group_name(n), 2, n % 2 == 0))
        .collect();
    let mut group = c.benchmark_group("round");
    for live in [1_000, 10_000, 100_000] {
        let mut fixture = Fixture::new();
        fixture.add_grants(HOT, live);
        assert_eq!(fixture.sem.key(HOT).expect("hot key").grants().len(), live);
        group.bench_with_input(
            BenchmarkId::new("10_requests_vs_live_grants", live),
            &live,
            |b, _| b.iter_custom(|iters| fixture.time_rounds(HOT, &requests, iters)),
        );
    }
    group.finish();
}

criterion_group!(
    benches,
    busy_round,
    small_round_among_other_keys,
    small_round_vs_live_grants
);
criterion_main!(benches);
