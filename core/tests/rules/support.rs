//! The rule tests' miniature log and message builders.

pub use permitd_core::config::{
    Amount, GroupConfig, KeyConfig, LeasePolicy, LimitedGroups, Provisioning,
};
pub use permitd_core::contract::protocol::{
    Blocked, BlockedReason, Demand, GrantReport, GrantStatus, LeaseGrant, LeaseReport, PermitGrant,
    PermitRequest, PermitSync, V1,
};
pub use permitd_core::engine::lifecycle::Event;
pub use permitd_core::engine::permit_sync::SyncOutcome;
pub use permitd_core::engine::round::RoundOutcome;
pub use permitd_core::engine::semaphores::Semaphores;
pub use permitd_core::engine::state::{KeyImage, KeyMeta, KeyState};
pub use permitd_core::engine::usage::Usage;
pub use permitd_core::ids::IdAllocator;

pub const KEY: &str = "account-1";
pub const T0: u64 = 1_764_460_800_000;

/// A log in miniature: one key, a clock, increasing log indexes.
pub struct Log {
    pub semaphores: Semaphores,
    pub index: u64,
    pub now_ms: u64,
}

impl Log {
    pub fn new(config: KeyConfig) -> Self {
        Self {
            semaphores: Semaphores::new(config).unwrap(),
            index: 0,
            now_ms: T0,
        }
    }

    pub fn with_limit(limit: u64) -> Self {
        Self::new(KeyConfig {
            limit,
            ..KeyConfig::default()
        })
    }

    pub fn with_leases(limit: u64, policy: LeasePolicy) -> Self {
        Self::new(KeyConfig {
            limit,
            leases: Some(policy),
            ..KeyConfig::default()
        })
    }

    pub fn round(&mut self, requests: &[PermitRequest]) -> RoundOutcome {
        self.index += 1;
        let mut ids = IdAllocator::new(self.index);
        let outcome = self.semaphores.round(KEY, &mut ids, self.now_ms, requests);
        self.check_tally();
        outcome
    }

    /// A round of one request; its answer.
    pub fn ask(&mut self, request: PermitRequest) -> PermitGrant {
        self.round(&[request]).answers.remove(0)
    }

    pub fn sync(&mut self, sync: PermitSync) -> SyncOutcome {
        self.index += 1;
        let outcome = self.semaphores.sync(KEY, self.now_ms, &sync);
        self.check_tally();
        outcome
    }

    pub fn reclaim(&mut self) -> Vec<Event> {
        self.index += 1;
        let events = self.semaphores.reclaim(KEY, self.now_ms);
        self.check_tally();
        events
    }

    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    pub fn usage(&self) -> Usage {
        self.semaphores.usage(KEY, self.now_ms)
    }

    pub fn state(&self) -> &KeyState {
        self.semaphores.key(KEY).expect("key has state")
    }

    pub fn set_group(&mut self, group: &str, limit: Option<u64>, permitted: bool) {
        self.semaphores
            .set_group(KEY, group, GroupConfig { limit, permitted })
            .unwrap();
    }

    pub fn set_limit(&mut self, limit: u64) {
        let mut config = self.semaphores.config(KEY).clone();
        config.limit = limit;
        self.semaphores.set_defaults(config).unwrap();
    }

    pub fn check_tally(&self) {
        if let Some(state) = self.semaphores.key(KEY) {
            assert_eq!(
                state.tally(),
                &state.recount(),
                "tally drifted from a recount"
            );
        }
    }
}

pub fn request(client: &str) -> PermitRequest {
    PermitRequest {
        v: V1,
        client_id: client.to_owned(),
        request_id: None,
        demand: vec![],
        grants: vec![],
        leases: None,
        wait_ms: None,
    }
}

pub fn wants(client: &str, group: &str, count: u64, oldest_at_ms: u64) -> PermitRequest {
    PermitRequest {
        demand: vec![Demand {
            group: group.to_owned(),
            count,
            oldest_at_ms,
        }],
        ..request(client)
    }
}

pub fn leasing(client: &str, group: &str, count: u64, oldest_at_ms: u64) -> PermitRequest {
    PermitRequest {
        leases: Some(vec![]),
        ..wants(client, group, count, oldest_at_ms)
    }
}

/// `request` tagged with a requestId, as a client that may retry sends it.
pub fn retry_of(request_id: &str, request: PermitRequest) -> PermitRequest {
    PermitRequest {
        request_id: Some(request_id.to_owned()),
        ..request
    }
}

pub fn report(grant_id: &str, claimed: u64, released: u64) -> GrantReport {
    GrantReport {
        grant_id: grant_id.to_owned(),
        claimed,
        released,
    }
}

pub fn lease_report(lease_id: &str, drawn: u64, released: u64, retired: bool) -> LeaseReport {
    LeaseReport {
        lease_id: lease_id.to_owned(),
        drawn,
        released,
        retired,
    }
}

pub fn reports(client: &str, grants: Vec<GrantReport>) -> PermitSync {
    PermitSync {
        v: V1,
        client_id: client.to_owned(),
        grants,
        leases: None,
    }
}

pub fn lease_sync(client: &str, leases: Vec<LeaseReport>) -> PermitSync {
    PermitSync {
        v: V1,
        client_id: client.to_owned(),
        grants: vec![],
        leases: Some(leases),
    }
}

pub fn granted(answer: &PermitGrant) -> u64 {
    answer.grants.iter().map(|grant| grant.permits).sum()
}

pub fn grant_id(answer: &PermitGrant) -> String {
    answer.grants[0].grant_id.to_string()
}

pub fn leases_of(answer: &PermitGrant) -> &[LeaseGrant] {
    answer.leases.as_deref().unwrap_or_default()
}

pub fn strict(permits_per_lease: u64) -> LeasePolicy {
    LeasePolicy {
        permits_per_lease,
        ..LeasePolicy::with_provisioning(Provisioning::Strict)
    }
}

pub trait WithCount {
    fn clone_with_count(&self, count: u64) -> PermitRequest;
}

impl WithCount for PermitRequest {
    fn clone_with_count(&self, count: u64) -> PermitRequest {
        let mut request = self.clone();
        for demand in &mut request.demand {
            demand.count = count;
        }
        request
    }
}
