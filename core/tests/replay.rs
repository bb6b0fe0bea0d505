//! Property test of `requestId` memory: only answers that hand something out
//! are remembered, and leaving the others out is harmless.
//!
//! One key, a small limit, a few clients that ask with requestIds drawn from a
//! small pool (so retries of earlier ids, remembered or not, are common) and
//! release what they hold between rounds. After every round:
//! - every remembered answer carries grants or a lease its own entry minted;
//! - every fresh answer with grants and a requestId is remembered;
//! - a retry of a remembered id gets the remembered answer, byte for byte;
//! - grants never pass the limit, whatever was retried.

use std::collections::BTreeMap;

use permitd_core::contract::protocol::{
    Demand, GrantReport, PermitGrant, PermitRequest, PermitSync, V1,
};
use permitd_core::limits::{MAX_REMEMBERED_ANSWERS_PER_CLIENT, MAX_REMEMBERED_ANSWERS_PER_KEY};
use permitd_core::{IdAllocator, KeyConfig, Semaphores};
use proptest::collection::vec;
use proptest::prelude::*;

const KEY: &str = "acct";
const T0: u64 = 1_764_460_800_000;
const CLIENTS: [&str; 3] = ["runner-0", "runner-1", "runner-2"];

#[derive(Debug, Clone)]
struct Ask {
    client: usize,
    count: u64,
    /// From a pool of 4 per client: reuse is a retry.
    request_id: Option<u8>,
}

#[derive(Debug, Clone)]
enum Step {
    Round(Vec<Ask>),
    /// The client reports every grant it holds as claimed and released.
    ReleaseAll(usize),
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    let ask = (0..CLIENTS.len(), 1..4u64, proptest::option::of(0..4u8)).prop_map(
        |(client, count, request_id)| Ask {
            client,
            count,
            request_id,
        },
    );
    prop_oneof![
        4 => vec(ask, 1..5).prop_map(Step::Round),
        2 => (0..CLIENTS.len()).prop_map(Step::ReleaseAll),
        1 => (1..3_000u64).prop_map(Step::Advance),
    ]
}

fn request(ask: &Ask) -> PermitRequest {
    PermitRequest {
        v: V1,
        client_id: CLIENTS[ask.client].to_owned(),
        request_id: ask.request_id.map(|id| format!("r{id}")),
        demand: vec![Demand {
            group: "g".into(),
            count: ask.count,
            oldest_at_ms: T0,
        }],
        grants: Vec::new(),
        leases: None,
        wait_ms: None,
    }
}

/// The world: the engine and, per client, the grants it was told about.
struct World {
    semaphores: Semaphores,
    limit: u64,
    now_ms: u64,
    index: u64,
    held: BTreeMap<usize, Vec<GrantReport>>,
}

impl World {
    fn round(&mut self, asks: &[Ask]) -> Result<(), TestCaseError> {
        let requests: Vec<PermitRequest> = asks.iter().map(request).collect();
        // The round first forgets answers whose claim deadline passed.
        let now_ms = self.now_ms;
        let before: BTreeMap<_, _> = self
            .remembered()
            .into_iter()
            .filter(|(_, (_, forget_at_ms))| *forget_at_ms > now_ms)
            .map(|(id, (answer, _))| (id, answer))
            .collect();
        self.index += 1;
        let mut ids = IdAllocator::new(self.index);
        let outcome = self.semaphores.round(KEY, &mut ids, self.now_ms, &requests);
        for (ask, answer) in asks.iter().zip(&outcome.answers) {
            let known = ask
                .request_id
                .and_then(|id| before.get(&(CLIENTS[ask.client].to_owned(), format!("r{id}"))));
            if let Some(remembered) = known {
                prop_assert_eq!(answer, remembered, "a retry replays the answer");
                continue;
            }
            if let (Some(request_id), false) = (ask.request_id, answer.grants.is_empty()) {
                let kept = self.remembered();
                let id = (CLIENTS[ask.client].to_owned(), format!("r{request_id}"));
                prop_assert!(kept.contains_key(&id), "an answer with grants is kept");
            }
            let reports = answer.grants.iter().map(|granted| GrantReport {
                grant_id: granted.grant_id.to_string(),
                claimed: granted.permits,
                released: 0,
            });
            self.held.entry(ask.client).or_default().extend(reports);
        }
        self.check()
    }

    fn release_all(&mut self, client: usize) -> Result<(), TestCaseError> {
        let grants: Vec<GrantReport> = self
            .held
            .remove(&client)
            .unwrap_or_default()
            .into_iter()
            .map(|report| GrantReport {
                released: report.claimed,
                ..report
            })
            .collect();
        let sync = PermitSync {
            v: V1,
            client_id: CLIENTS[client].to_owned(),
            grants,
            leases: None,
        };
        self.index += 1;
        self.semaphores.sync(KEY, self.now_ms, &sync);
        self.check()
    }

    /// Every remembered answer with its forget time.
    fn remembered(&self) -> BTreeMap<(String, String), (PermitGrant, u64)> {
        let Some(state) = self.semaphores.key(KEY) else {
            return BTreeMap::new();
        };
        state
            .answers()
            .iter()
            .flat_map(|(client, answers)| {
                answers.iter().map(move |(request_id, remembered)| {
                    let kept = (remembered.answer.clone(), remembered.forget_at_ms);
                    ((client.clone(), request_id.clone()), kept)
                })
            })
            .collect()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for (id, (answer, _)) in self.remembered() {
            prop_assert!(
                !answer.grants.is_empty() || answer.leases.iter().flatten().next().is_some(),
                "{id:?} was remembered though it handed out nothing"
            );
        }
        let granted = self
            .semaphores
            .key(KEY)
            .map_or(0, |state| state.tally().granted);
        prop_assert!(
            granted <= self.limit,
            "{granted} granted over {}",
            self.limit
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn only_answers_that_hand_out_permits_are_remembered(
        limit in 1..5u64,
        steps in vec(step(), 1..40),
    ) {
        let config = KeyConfig {
            limit,
            grant_timeout_ms: 5_000,
            ..KeyConfig::default()
        };
        let mut world = World {
            semaphores: Semaphores::new(config).expect("a valid config"),
            limit,
            now_ms: T0,
            index: 0,
            held: BTreeMap::new(),
        };
        for step in &steps {
            match step {
                Step::Round(asks) => world.round(asks)?,
                Step::ReleaseAll(client) => world.release_all(*client)?,
                Step::Advance(ms) => world.now_ms += ms,
            }
        }
    }
}

/// Clients of the bounded-memory property: more than the key's cap divided by
/// the per-client cap, so the key's cap is what binds.
const MANY_CLIENTS: usize = 200;

/// One entry of the bounded-memory property.
#[derive(Debug, Clone)]
enum Entry {
    /// `count` requests, each with a requestId never used before, spread over
    /// the clients starting at `first_client`.
    Round {
        count: usize,
        first_client: usize,
    },
    /// A reclaim entry, as the leader's deadline timer proposes.
    Reclaim,
    Advance(u64),
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        3 => (300..700usize, 0..MANY_CLIENTS)
            .prop_map(|(count, first_client)| Entry::Round { count, first_client }),
        1 => Just(Entry::Reclaim),
        2 => (1..4_000u64).prop_map(Entry::Advance),
    ]
}

/// Applies `entries` to a fresh state, checking the bounds after each; returns
/// the final state.
fn apply_bounded(entries: &[Entry]) -> Result<Semaphores, TestCaseError> {
    let config = KeyConfig {
        limit: 1_000_000,
        grant_timeout_ms: 5_000,
        ..KeyConfig::default()
    };
    let mut semaphores = Semaphores::new(config).expect("a valid config");
    let (mut now_ms, mut index) = (T0, 0u64);
    for entry in entries {
        index += 1;
        match entry {
            Entry::Round {
                count,
                first_client,
            } => {
                let requests: Vec<PermitRequest> = (0..*count)
                    .map(|position| PermitRequest {
                        v: V1,
                        client_id: format!("c{}", (first_client + position) % MANY_CLIENTS),
                        request_id: Some(format!("q{index}-{position}")),
                        demand: vec![Demand {
                            group: "g".into(),
                            count: 1,
                            oldest_at_ms: T0,
                        }],
                        grants: Vec::new(),
                        leases: None,
                        wait_ms: None,
                    })
                    .collect();
                semaphores.round(KEY, &mut IdAllocator::new(index), now_ms, &requests);
            }
            Entry::Reclaim => {
                semaphores.reclaim(KEY, now_ms);
                let state = semaphores.key(KEY);
                let answers = state.map(|state| state.answers());
                let due: Vec<u64> = answers
                    .into_iter()
                    .flat_map(|answers| answers.values())
                    .flat_map(|answers| answers.values())
                    .map(|answer| answer.forget_at_ms)
                    .collect();
                prop_assert!(
                    due.iter().all(|&at| at > now_ms),
                    "a reclaim ages answers out"
                );
                let next = state.and_then(|state| state.next_deadline_ms());
                if let Some(&earliest) = due.iter().min() {
                    prop_assert!(
                        next.is_some_and(|next| next <= earliest),
                        "the timer is aimed"
                    );
                }
            }
            Entry::Advance(ms) => now_ms += ms,
        }
        let Some(state) = semaphores.key(KEY) else {
            continue;
        };
        let per_client: Vec<usize> = state
            .answers()
            .values()
            .map(|answers| answers.len())
            .collect();
        let total: usize = per_client.iter().sum();
        prop_assert!(
            total <= MAX_REMEMBERED_ANSWERS_PER_KEY,
            "{total} answers on one key"
        );
        prop_assert!(per_client
            .iter()
            .all(|&len| len <= MAX_REMEMBERED_ANSWERS_PER_CLIENT));
        prop_assert_eq!(
            state.recount(),
            state.tally().clone(),
            "the index matches the answers"
        );
    }
    Ok(semaphores)
}

/// Remembered answers stay within the per-key and per-client caps whatever
/// the number of clients; a reclaim entry alone forgets every answer past
/// its time and the key's next deadline covers the rest; and ageing is
/// deterministic: the same entries give byte-identical states.
///
/// A case applies thousands of requests twice (~0.15 s in a debug build). It
/// runs its own 16 cases whatever `PROPTEST_CASES` says: the `proptest!` macro
/// lets that variable override a test's own count, and CI's 1,000 made this
/// one test take 2.5 minutes of CI's 30 without finding more (its inputs are a
/// few shapes of large rounds, not many small ones).
#[test]
fn remembered_answers_are_bounded_per_key_and_age_out_without_rounds() {
    let config = ProptestConfig {
        cases: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let checked = runner.run(&vec(entry(), 2..8), |entries| {
        let first = apply_bounded(&entries)?;
        let second = apply_bounded(&entries)?;
        prop_assert_eq!(&first, &second);
        let bytes = |state: &Semaphores| serde_json::to_vec(state).expect("serialises");
        prop_assert_eq!(bytes(&first), bytes(&second));
        Ok(())
    });
    if let Err(failure) = checked {
        panic!("{failure}");
    }
}
