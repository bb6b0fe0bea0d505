//! The simulated clients: the real Rust client (`permitd-client`) over the
//! simulated network, with the simulation's clock, everything drawn from the
//! seed. Every call and answer goes into the trace, and what each host saw
//! into the [`History`] the checkers read.
//!
//! | file | host | what it does |
//! |---|---|---|
//! | `operator.rs` | `operator` | configures the keys and their capped groups, then changes limits and caps, force-releases holders and deletes an unused key while the runners work, and reads every setting back at the end |
//! | `runner.rs` | `client<n>` | jobs: `acquire_with`, requests held on the leader (some abandoned while held), batches over several keys |
//! | `leases.rs` | `client<n>` | a job under a lease: acknowledged, drawn from, heartbeaten or left to lapse, settled |
//! | `replay.rs` | `client<n>` | a request sent again with its `requestId`, over the bare transport, to compare the answers byte for byte |
//! | `sampler.rs` | `sampler` | reads a key's usage every 50–150 ms |
//! | `members.rs` | `members` | in one run in five, removes a voter and adds it back (learner, then voter) |
//!
//! The keys: 2 to 5 permits, a claim window (`grantTimeoutMs`) of 0.8 to 3 s
//! so that unclaimed grants come back within a run, a capped group under the
//! limit on some, leases (strict, one or two permits each, a TTL under 1.5 s)
//! on others.

mod leases;
mod members;
mod operator;
mod replay;
mod runner;
mod sampler;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use permitd_client::{ClientConfig, SemaphoreClient};
use permitd_core::config::LimitedGroups;
use permitd_core::{KeyConfig, KeyConfigUpdate, LeasePolicy, Provisioning};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use members::change_members;
pub use operator::operate;
pub use runner::run_client;
pub use sampler::sample;

use crate::history::History;
use crate::net::SimTransport;
use crate::trace::Trace;

/// The fewest permits a key has, whatever the operator does: an acquire of
/// two permits in an uncapped group always fits.
pub const MIN_LIMIT: u64 = 2;
/// The most permits a key has.
pub const MAX_LIMIT: u64 = 5;
/// The group every key caps (on the keys that have one).
pub const CAPPED_GROUP: &str = "capped";
/// The group of plain jobs: never capped.
pub const PLAIN_GROUP: &str = "jobs";
/// The group lease jobs ask in: never capped (capped groups get no leases).
pub const LEASE_GROUP: &str = "leased";
/// The suffix of the client ids of `requestId` replays: the operator never
/// force-releases them, since a force release forgets remembered answers.
pub const REPLAY_SUFFIX: &str = "-replay";

/// One key of the run.
#[derive(Debug, Clone)]
pub struct KeySpec {
    pub name: String,
    /// Its limit until the operator changes it.
    pub limit: u64,
    /// Its claim window: unclaimed grants (and unacknowledged leases) return
    /// this long after their round. The operator never changes it.
    pub grant_timeout: Duration,
    /// Its capped group's cap, under the limit, if it has one.
    pub group_cap: Option<u64>,
    pub leases: Option<LeaseSpec>,
}

/// A key's lease policy (strict: leases share the limit with grants).
#[derive(Debug, Clone, Copy)]
pub struct LeaseSpec {
    pub permits_per_lease: u64,
    pub ttl: Duration,
}

impl KeySpec {
    /// The key's whole configuration with `limit`.
    pub fn config(&self, limit: u64) -> KeyConfig {
        KeyConfig {
            limit,
            grant_timeout_ms: self.grant_timeout.as_millis() as u64,
            leases: self.leases.map(|spec| LeasePolicy {
                permits_per_lease: spec.permits_per_lease,
                ttl_ms: spec.ttl.as_millis() as u64,
                limited_groups: LimitedGroups::Exclude,
                ..LeasePolicy::with_provisioning(Provisioning::Strict)
            }),
            ..KeyConfig::default()
        }
    }

    /// The update that sets exactly [`Self::config`] (no field left to the
    /// cluster's defaults, so what a write sets is known in full).
    pub fn update(&self, limit: u64) -> KeyConfigUpdate {
        let config = self.config(limit);
        KeyConfigUpdate {
            limit: Some(config.limit),
            round_wait_ms: Some(config.round_wait_ms),
            round_period_ms: Some(config.round_period_ms),
            grant_timeout_ms: Some(config.grant_timeout_ms),
            leases: Some(config.leases),
        }
    }
}

/// What the clients of one run do.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub keys: Vec<KeySpec>,
    /// A key the operator configures and later deletes; nobody else uses it.
    pub spare: KeySpec,
    /// Each runner's own key, one permit, which only that runner uses (so a
    /// grant to nobody on it is not hidden by other runners' waiting).
    pub own: Vec<KeySpec>,
    pub clients: usize,
    pub jobs_per_client: usize,
    /// Every node's API, `host:port`.
    pub endpoints: Vec<String>,
}

impl WorkloadSpec {
    /// `keys` keys drawn from `seed`.
    pub fn draw(
        seed: u64,
        keys: usize,
        clients: usize,
        jobs_per_client: usize,
        endpoints: Vec<String>,
    ) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6b65_7973);
        let key = |name: String, rng: &mut StdRng| {
            let limit = rng.random_range(MIN_LIMIT..=MAX_LIMIT);
            let grant_timeout = [800, 1_500, 3_000][rng.random_range(0..3)];
            KeySpec {
                name,
                limit,
                grant_timeout: Duration::from_millis(grant_timeout),
                group_cap: rng.random_bool(0.5).then(|| rng.random_range(1..limit)),
                leases: rng.random_bool(0.4).then(|| LeaseSpec {
                    permits_per_lease: rng.random_range(1..=2),
                    ttl: Duration::from_millis(rng.random_range(600..1_500)),
                }),
            }
        };
        let mut drawn: Vec<KeySpec> = (0..keys)
            .map(|n| key(format!("key-{n}"), &mut rng))
            .collect();
        // At least one key with leases and one without, whatever the draw.
        if let Some(first) = drawn.first_mut() {
            first.leases.get_or_insert(LeaseSpec {
                permits_per_lease: 1,
                ttl: Duration::from_millis(1_000),
            });
        }
        if let Some(last) = drawn.last_mut().filter(|_| keys > 1) {
            last.leases = None;
        }
        let spare = key("spare".to_owned(), &mut rng);
        let own = (0..clients)
            .map(|n| KeySpec {
                name: own_key(n),
                limit: 1,
                grant_timeout: Duration::from_millis(800),
                group_cap: None,
                leases: None,
            })
            .collect();
        Self {
            keys: drawn,
            spare,
            own,
            clients,
            jobs_per_client,
            endpoints,
        }
    }

    /// Every key: the shared ones, the spare, the runners' own.
    pub fn every_key(&self) -> impl Iterator<Item = &KeySpec> {
        self.keys
            .iter()
            .chain(std::iter::once(&self.spare))
            .chain(&self.own)
    }
}

/// What every client host of one run shares.
#[derive(Debug, Clone)]
pub struct Shared {
    pub spec: Arc<WorkloadSpec>,
    pub history: History,
    pub trace: Trace,
    /// Set once the operator's first configuration of every key was
    /// answered: runners start then, so that no grant is made under the
    /// cluster's default limit.
    pub configured: Arc<AtomicBool>,
    /// Runners done with their jobs: the operator and the sampler stop once
    /// all are.
    pub finished: Arc<AtomicUsize>,
}

impl Shared {
    pub fn new(spec: WorkloadSpec, history: History, trace: Trace) -> Self {
        Self {
            spec: Arc::new(spec),
            history,
            trace,
            configured: Arc::default(),
            finished: Arc::default(),
        }
    }

    fn runners_done(&self) -> bool {
        self.finished.load(Ordering::Relaxed) >= self.spec.clients
    }

    async fn until_configured(&self) {
        while !self.configured.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The name of runner `n`'s own key.
pub fn own_key(n: usize) -> String {
    format!("own-{n}")
}

/// Simulated time since the run began.
pub fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The real client of the nodes at `endpoints` (`host:port`), over the
/// simulated network, with the simulation's clock and random draws seeded
/// from `seed`.
pub fn client(
    endpoints: &[String],
    seed: u64,
) -> Result<SemaphoreClient, permitd_client::ClientError> {
    let endpoints: Vec<String> = endpoints.iter().map(|e| format!("http://{e}")).collect();
    let mut config = ClientConfig::new([endpoints.join(",")]);
    config.transport = Some(Arc::new(SimTransport));
    config.seed = Some(seed);
    config.wall_clock = Some(Arc::new(|| {
        turmoil::since_epoch().unwrap_or_default().as_millis() as u64
    }));
    SemaphoreClient::new(config)
}

/// A short, stable name for a call's failure (messages may carry addresses
/// or ids; the trace must not).
fn failure(error: &permitd_client::ClientError) -> String {
    use permitd_client::ClientError;
    match error {
        ClientError::Rejected { status, code, .. } => format!("{status} {code:?}"),
        ClientError::DeadlineExceeded { .. } => "deadline".to_owned(),
        _ => "other".to_owned(),
    }
}
