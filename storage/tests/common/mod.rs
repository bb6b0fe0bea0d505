//! Test and benchmark helpers: entries, stores in temp dirs and a workload of
//! real commands (rounds whose requests report on grants earlier rounds made,
//! syncs, reclaims, settings changes, key removals), generated deterministically
//! from a starting number.
#![allow(dead_code)] // Each test binary uses a different part.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftLogReader};
use permitd_core::config::{GroupConfig, KeyConfig, KeyConfigUpdate, LeasePolicy, Provisioning};
use permitd_core::contract::protocol::{
    Demand, GrantReport, LeaseReport, PermitGrant, PermitRequest, PermitSync, V1,
};
use permitd_storage::{
    open, open_shards, Command, CommandResult, EncodedCommand, KeyRound, Opened, Options,
    TypeConfig,
};

pub const KEYS: [&str; 4] = ["alpha", "beta", "gamma", "delta"];
pub const CLIENTS: [&str; 5] = ["runner-1", "runner-2", "runner-3", "runner-4", "runner-5"];
pub const GROUPS: [&str; 3] = ["wf-1", "wf-2", "wf-3"];

pub fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 0), index)
}

pub fn normal(index: u64, command: Command) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Normal(EncodedCommand::new(command).expect("a command encodes")),
    }
}

pub fn blank(index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Blank,
    }
}

/// Entries [`run_workload`] writes.
pub const ENTRIES: u64 = 400;

/// Appends and applies a workload on `opened`, in apply batches of 1 to 8 entries.
/// Returns the entries and each one's result.
pub async fn run_workload(
    opened: &mut Opened,
    start: u64,
) -> (Vec<Entry<TypeConfig>>, Vec<CommandResult>) {
    let mut workload = Workload::new(start);
    let mut rng = Rng::new(start);
    let members = Membership::new(vec![BTreeSet::from([1, 2, 3])], None);
    let mut entries = vec![
        blank(1),
        Entry {
            log_id: log_id(1, 2),
            payload: EntryPayload::Membership(members),
        },
    ];
    let mut results = opened.state_machine.apply(entries.clone()).await.unwrap();
    opened.log.blocking_append(entries.clone()).await.unwrap();
    let mut index = 3;
    while index <= ENTRIES {
        let batch_len = (1 + rng.below(8)).min(ENTRIES + 1 - index);
        let batch: Vec<Entry<TypeConfig>> = (index..index + batch_len)
            .map(|index| normal(index, workload.next_command()))
            .collect();
        opened.log.blocking_append(batch.clone()).await.unwrap();
        let batch_results = opened.state_machine.apply(batch.clone()).await.unwrap();
        for (entry, result) in batch.iter().zip(&batch_results) {
            let EntryPayload::Normal(command) = &entry.payload else {
                unreachable!()
            };
            workload.observe(command, result);
        }
        entries.extend(batch);
        results.extend(batch_results);
        index += batch_len;
    }
    let committed = entries.last().map(|entry| entry.log_id);
    opened.log.save_committed(committed).await.unwrap();
    (entries, results)
}

/// Opens the store in `dir` as it is on disk: the newest snapshot's state.
pub async fn open_dir(dir: &Path) -> Opened {
    open(&Options::new(dir.to_owned()))
        .await
        .unwrap_or_else(|error| panic!("open {}: {error}", dir.display()))
}

/// Opens the store in `dir` the way a starting node does: openraft's start-up
/// (`StorageHelper::get_initial_state`) applies the committed entries after the
/// snapshot again. Done by hand here because openraft's version also loads the
/// log ids from index 0, where the real cluster's first entry is, and these
/// tests' logs start at 1.
pub async fn restart(dir: &Path) -> Opened {
    let mut opened = open_dir(dir).await;
    replay_committed(&mut opened).await;
    opened
}

/// [`restart`] for a store of `count` shards: each one replays its own log.
pub async fn restart_shards(dir: &Path, count: u32) -> Vec<Opened> {
    let mut shards = open_shards(&Options::new(dir.to_owned()), count)
        .await
        .unwrap_or_else(|error| panic!("open {} shards in {}: {error}", count, dir.display()));
    for opened in &mut shards {
        replay_committed(opened).await;
    }
    shards
}

/// Applies the committed entries after the snapshot, as openraft's start-up does.
async fn replay_committed(opened: &mut Opened) {
    let committed = opened.log.read_committed().await.unwrap();
    let applied = opened.state.last_applied();
    if committed > applied {
        // These tests' logs start at 1 (a real cluster's at 0).
        let from = applied.map_or(1, |id| id.index + 1);
        let until = committed.map_or(0, |id| id.index);
        let entries = opened.log.try_get_log_entries(from..=until).await.unwrap();
        assert_eq!(entries.len() as u64, until + 1 - from, "a hole in the log");
        opened.state_machine.apply(entries).await.unwrap();
    }
}

/// The byte-exact canonical state, for comparing replicas.
pub fn state_bytes(opened: &Opened) -> Vec<u8> {
    opened
        .state
        .read(|semaphores| serde_json::to_vec(semaphores).expect("state serialises"))
}

/// xorshift64*: deterministic and dependency-free.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(start: u64) -> Self {
        Self(start.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// A grant or lease a simulated client holds, with its cumulative reports.
#[derive(Debug, Clone)]
struct Held {
    id: String,
    permits: u64,
    used: u64,
    released: u64,
    reports: u32,
}

/// Generates commands the way clients and a leader would, learning grant and
/// lease ids from the answers it is shown ([`Workload::observe`]).
#[derive(Debug)]
pub struct Workload {
    rng: Rng,
    now_ms: u64,
    next_request: u64,
    /// Per (key, client).
    grants: BTreeMap<(String, String), Vec<Held>>,
    leases: BTreeMap<(String, String), Vec<Held>>,
}

impl Workload {
    pub fn new(start: u64) -> Self {
        Self {
            rng: Rng::new(start),
            now_ms: 1_764_460_800_000,
            next_request: 0,
            grants: BTreeMap::new(),
            leases: BTreeMap::new(),
        }
    }

    /// The next command; mostly rounds.
    pub fn next_command(&mut self) -> Command {
        self.now_ms += self.rng.below(3_000);
        let now_ms = self.now_ms;
        match self.rng.below(43) {
            0..=24 => {
                let keys = 1 + self.rng.below(3) as usize;
                let requests = 1 + self.rng.below(6) as usize;
                self.round(keys, requests)
            }
            25..=30 => {
                let key = self.rng.pick(&KEYS).to_owned();
                let client = self.rng.pick(&CLIENTS).to_owned();
                let (grants, leases) = self.reports(&key, &client);
                let sync = PermitSync {
                    v: V1,
                    client_id: client,
                    grants,
                    leases,
                };
                Command::Sync { now_ms, key, sync }
            }
            31..=33 => Command::Reclaim {
                now_ms: now_ms + 20_000,
                keys: vec![self.rng.pick(&KEYS).to_owned()],
            },
            34 | 35 => self.key_config(),
            36 => Command::SetGroup {
                key: self.rng.pick(&KEYS).to_owned(),
                group: self.rng.pick(&GROUPS).to_owned(),
                config: GroupConfig {
                    limit: Some(1 + self.rng.below(20)),
                    permitted: self.rng.below(5) != 0,
                },
            },
            37 => Command::RemoveGroup {
                key: self.rng.pick(&KEYS).to_owned(),
                group: self.rng.pick(&GROUPS).to_owned(),
            },
            38 => Command::SetDefaults {
                defaults: KeyConfig {
                    limit: 20 + self.rng.below(100),
                    ..KeyConfig::default()
                },
            },
            39 => Command::ForceRelease {
                now_ms,
                key: self.rng.pick(&KEYS).to_owned(),
                client_id: self.rng.pick(&CLIENTS).to_owned(),
            },
            40 => Command::RemoveKey {
                key: self.rng.pick(&KEYS).to_owned(),
            },
            // Forced or not, with a requestId (replays included) or not.
            _ => Command::DeleteKey {
                now_ms,
                key: self.rng.pick(&KEYS).to_owned(),
                force: self.rng.below(2) == 0,
                request_id: (self.rng.below(2) == 0).then(|| format!("d{}", self.rng.below(3))),
            },
        }
    }

    /// A round entry over `keys` distinct keys with up to `requests` requests each.
    pub fn round(&mut self, keys: usize, requests: usize) -> Command {
        let mut rounds = Vec::new();
        for key in KEYS
            .iter()
            .cycle()
            .skip(self.rng.below(4) as usize)
            .take(keys)
        {
            let requests = (0..requests)
                .map(|position| self.request(key, CLIENTS[position % CLIENTS.len()]))
                .collect();
            rounds.push(KeyRound {
                key: (*key).to_owned(),
                requests,
            });
        }
        Command::Round {
            now_ms: self.now_ms,
            syncs: Vec::new(),
            keys: rounds,
        }
    }

    fn request(&mut self, key: &str, client: &str) -> PermitRequest {
        let (grants, leases) = self.reports(key, client);
        let first_group = self.rng.below(GROUPS.len() as u64) as usize;
        let demand = (0..1 + self.rng.below(2) as usize)
            .map(|offset| Demand {
                group: GROUPS[(first_group + offset) % GROUPS.len()].to_owned(),
                count: self.rng.below(8),
                oldest_at_ms: self.now_ms - self.rng.below(5_000),
            })
            .collect();
        self.next_request += 1;
        PermitRequest {
            v: V1,
            client_id: client.to_owned(),
            request_id: (self.rng.below(3) == 0).then(|| format!("r-{}", self.next_request)),
            demand,
            grants,
            leases,
            wait_ms: None,
        }
    }

    /// Cumulative reports that move every held grant and lease forward.
    fn reports(&mut self, key: &str, client: &str) -> (Vec<GrantReport>, Option<Vec<LeaseReport>>) {
        let holder = (key.to_owned(), client.to_owned());
        let rng = &mut self.rng;
        let held = self.grants.entry(holder.clone()).or_default();
        for grant in held.iter_mut() {
            advance(rng, grant);
        }
        let grants = held
            .iter()
            .map(|grant| GrantReport {
                grant_id: grant.id.clone(),
                claimed: grant.used,
                released: grant.released,
            })
            .collect();
        held.retain(|grant| grant.released < grant.permits && grant.reports < 6);
        let leases = self.leases.entry(holder).or_default();
        for lease in leases.iter_mut() {
            advance(rng, lease);
        }
        let retire = rng.below(4) == 0;
        let lease_reports = leases
            .iter()
            .map(|lease| LeaseReport {
                lease_id: lease.id.clone(),
                drawn: lease.used,
                released: lease.released,
                retired: retire,
            })
            .collect();
        if retire {
            leases.clear();
        }
        // Clients with a number in an odd position support leases.
        let supports_leases = client.ends_with(['1', '3', '5']);
        (grants, supports_leases.then_some(lease_reports))
    }

    fn key_config(&mut self) -> Command {
        let leases = match self.rng.below(3) {
            0 => Some(None),
            1 => Some(Some(LeasePolicy {
                permits_per_lease: 4,
                ..LeasePolicy::with_provisioning(Provisioning::Strict)
            })),
            _ => None,
        };
        Command::SetKeyConfig {
            key: self.rng.pick(&KEYS).to_owned(),
            update: KeyConfigUpdate {
                limit: Some(10 + self.rng.below(60)),
                grant_timeout_ms: Some(2_000 + self.rng.below(10_000)),
                leases,
                ..KeyConfigUpdate::default()
            },
        }
    }

    /// Learns the grants and leases an applied command handed out.
    pub fn observe(&mut self, command: &Command, result: &CommandResult) {
        let (Command::Round { keys, .. }, CommandResult::Round { answers, .. }) = (command, result)
        else {
            return;
        };
        for (round, answers) in keys.iter().zip(answers) {
            for (request, answer) in round.requests.iter().zip(answers) {
                self.remember(&round.key, &request.client_id, answer);
            }
        }
    }

    fn remember(&mut self, key: &str, client: &str, answer: &PermitGrant) {
        let holder = (key.to_owned(), client.to_owned());
        let grants = self.grants.entry(holder.clone()).or_default();
        for grant in &answer.grants {
            grants.push(Held::new(grant.grant_id.to_string(), grant.permits));
        }
        let leases = self.leases.entry(holder).or_default();
        for lease in answer.leases.iter().flatten() {
            if !leases.iter().any(|held| held.id == lease.lease_id) && lease.permits > 0 {
                leases.push(Held::new(lease.lease_id.clone(), lease.permits));
            }
        }
    }
}

impl Held {
    fn new(id: String, permits: u64) -> Self {
        Self {
            id,
            permits,
            used: 0,
            released: 0,
            reports: 0,
        }
    }
}

fn advance(rng: &mut Rng, held: &mut Held) {
    held.used = (held.used + rng.below(3)).min(held.permits);
    held.released = (held.released + rng.below(3)).min(held.used);
    held.reports += 1;
}
