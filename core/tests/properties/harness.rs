//! The harness: applies each operation to the engine and to the client model.

use super::*;

/// Everything an operation returned, for the determinism property.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    Round(RoundOutcome),
    Sync(SyncOutcome),
    Reclaim(Vec<Event>),
    Config(Result<KeyConfig, InvalidInput>),
    Group(Result<(), InvalidInput>),
    Released(ForceReleased, Vec<Event>),
    Deleted(Result<(KeyDeleted, Vec<Event>), KeyInUse>),
    Local,
}

#[derive(Debug, Clone)]
pub(crate) struct Harness {
    pub(crate) sem: Semaphores,
    pub(crate) setup: Setup,
    /// Each key's full configuration, as the admin last set it.
    pub(crate) configs: Vec<KeyConfig>,
    /// `[client][key]`.
    pub(crate) clients: Vec<Vec<Holdings>>,
    pub(crate) last_index: u64,
}

impl Harness {
    pub(crate) fn new(setup: &Setup) -> Self {
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

    pub(crate) fn clock(&self) -> u64 {
        self.sem.last_now_ms().max(T0)
    }

    /// The next log index: strictly increasing, with gaps for other entries.
    pub(crate) fn next_index(&mut self) -> u64 {
        self.last_index += 1 + self.last_index % 3;
        self.last_index
    }

    pub(crate) fn entry_now(&self, when: When) -> u64 {
        let clock = self.clock();
        match when {
            When::Later(ms) => clock + ms,
            When::PastClaimDeadlines => clock + self.setup.grant_timeout_ms + 1,
            When::PastLeaseTtl => clock + MAX_TTL_MS + 1,
            When::Earlier(ms) => clock - ms,
        }
    }

    pub(crate) fn supports_leases(&self, client: usize) -> bool {
        self.setup.lease_clients[client]
    }

    /// The reports a client puts in a message, noise included.
    pub(crate) fn reports(&mut self, client: usize, key: usize, plan: &ReportPlan) -> Reports {
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

    pub(crate) fn request(&mut self, key: usize, plan: &RequestPlan, now_ms: u64) -> PermitRequest {
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
            wait_ms: None,
        }
    }

    /// Builds a sync message and the clock of its entry (no state change).
    pub(crate) fn prepare_sync(
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

    pub(crate) fn sync_message(&self, client: usize, reports: Reports) -> PermitSync {
        let sync = PermitSync {
            v: V1,
            client_id: CLIENTS[client].to_owned(),
            grants: reports.grants,
            leases: self.supports_leases(client).then_some(reports.leases),
        };
        assert_valid(&SemaphoreRequest::Sync(sync.clone()));
        sync
    }

    pub(crate) fn apply_sync(
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

    pub(crate) fn set_config(&mut self, key: usize) -> Outcome {
        Outcome::Config(
            self.sem
                .set_key_config(KEYS[key], &full_update(&self.configs[key])),
        )
    }

    pub(crate) fn step(&mut self, op: &Op) -> Outcome {
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
            Op::DeleteKey { key, force, when } => {
                let delete = DeleteKey {
                    key: KEYS[*key],
                    force: *force,
                    request_id: None,
                    now_ms: self.entry_now(*when),
                    log_index: self.last_index,
                };
                let deleted = self.sem.delete_key(delete);
                if deleted.is_ok() {
                    // The key runs with the defaults now: the model follows.
                    self.configs[*key] = self.sem.defaults().clone();
                }
                Outcome::Deleted(deleted)
            }
        }
    }

    /// Every client finishes its work, returns everything and reports it; then the
    /// claim deadlines pass and the leader's reclaim timer fires.
    pub(crate) fn settle(&mut self) {
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

pub(crate) fn full_update(config: &KeyConfig) -> KeyConfigUpdate {
    KeyConfigUpdate {
        limit: Some(config.limit),
        round_wait_ms: Some(config.round_wait_ms),
        round_period_ms: Some(config.round_period_ms),
        grant_timeout_ms: Some(config.grant_timeout_ms),
        leases: Some(config.leases.clone()),
    }
}

/// An id from a log index far beyond any this test reaches.
pub(crate) fn never_minted(n: u32) -> permitd_core::GrantId {
    IdAllocator::new((1 << 40) + u64::from(n)).grant_id()
}

/// The generators must only produce what the node's validation would let through.
pub(crate) fn assert_valid(message: &SemaphoreRequest) {
    if let Err(error) = validate_request(message) {
        panic!("the test generated an invalid message ({error}): {message:?}");
    }
}
