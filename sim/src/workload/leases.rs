//! A job under a lease, as a lease client runs one: a `request` that says it
//! supports leases (`leases: []`) and asks a permit of the lease group; the
//! answer may hold a grant and a new lease. One `sync` claims the grant and
//! acknowledges the lease (a runner draws only from a lease whose report was
//! answered, with the lease still live). It draws a permit and works; while
//! it works it reports the lease every third of its TTL, or, in a third of
//! the jobs, lets it lapse: the leader then retires it (stop drawing; its
//! footprint stays counted until the runner settles it), and the runner,
//! seeing `expiresAt` pass on its own clock, draws no second permit. At the
//! end one `sync` releases the grant and retires and releases the lease,
//! which settles it.

use std::time::Duration;

use permitd_core::contract::protocol::{
    Demand, GrantedPermits, LeaseGrant, LeaseReport, PermitRequest, PermitSync, V1,
};
use rand::Rng;

use super::runner::{claims, confirmed, released, Runner};
use super::{failure, now, LeaseSpec, LEASE_GROUP};
use crate::history::{Ask, AskOutcome, Draw, LeaseAsk, LeaseHeld};

/// The share of lease jobs that let their lease lapse, in percent.
const LAPSED_PERCENT: u32 = 33;

/// Which lease job a step belongs to.
struct LeaseJob<'a> {
    key: &'a str,
    client_id: &'a str,
    /// Its request's index in the history's asks, and in its leases.
    ask_index: usize,
    lease_index: usize,
}

/// One lease job's lease as its runner knows it.
struct Lease {
    id: String,
    /// Stop drawing at or after this, by the runner's clock (ms since the epoch).
    expires_at_ms: u64,
    drawn: u64,
    permits: u64,
}

impl Runner {
    pub(super) async fn lease_job(&mut self, client_id: &str) {
        let keys: Vec<_> = self
            .shared
            .spec
            .keys
            .iter()
            .filter(|key| key.leases.is_some())
            .cloned()
            .collect();
        let key = keys[self.rng.random_range(0..keys.len())].clone();
        let spec = key.leases.expect("a lease key");
        let sent = now();
        let lease_index = self.shared.history.lease(LeaseAsk {
            key: key.name.clone(),
            client_id: client_id.to_owned(),
            sent,
            most: spec.permits_per_lease,
            answered: None,
            gave_up: None,
            lease: None,
        });
        let ask_index = self.shared.history.ask(Ask::waiting(
            &key.name,
            LEASE_GROUP,
            client_id,
            1,
            sent,
            Duration::ZERO,
        ));
        let request = PermitRequest {
            v: V1,
            client_id: client_id.to_owned(),
            request_id: None,
            demand: vec![Demand {
                group: LEASE_GROUP.to_owned(),
                count: 1,
                oldest_at_ms: self.client.now_ms(),
            }],
            grants: vec![],
            leases: Some(vec![]),
            wait_ms: None,
        };
        let answer = match self.client.request(&key.name, request).await {
            Ok(answer) => answer,
            Err(error) => {
                let at = now();
                self.event(format_args!(
                    "lease request {} failed: {}",
                    key.name,
                    failure(&error)
                ));
                self.shared
                    .history
                    .update_ask(ask_index, |ask| ask.outcome = AskOutcome::Failed { at });
                self.shared
                    .history
                    .update_lease(lease_index, |lease| lease.gave_up = Some(at));
                return;
            }
        };
        self.answered(ask_index, &key.name, &answer.grants);
        let fresh = answer
            .leases
            .unwrap_or_default()
            .into_iter()
            .find(|lease| lease.permits > 0);
        let at = now();
        self.shared.history.update_lease(lease_index, |record| {
            record.answered = Some(at);
            record.lease = fresh.as_ref().map(|lease| LeaseHeld {
                size: lease.permits,
                permits: 0,
                acknowledged: None,
                settle_sent: None,
                settled: None,
                draws: vec![],
            });
        });
        let job = LeaseJob {
            key: &key.name,
            client_id,
            ask_index,
            lease_index,
        };
        let fresh_id = fresh.as_ref().map(|lease| lease.lease_id.clone());
        let mut lease = self.acknowledge(&job, &answer.grants, fresh).await;
        self.work_under_lease(&job, spec, lease.as_mut()).await;
        self.stop_using(ask_index);
        let drawn = lease.map_or(0, |lease| lease.drawn);
        self.settle(&job, &answer.grants, fresh_id, drawn).await;
    }

    /// Claims the grants and acknowledges the lease in one `sync`; answers
    /// the lease if it is live and may be drawn from.
    async fn acknowledge(
        &mut self,
        job: &LeaseJob<'_>,
        grants: &[GrantedPermits],
        fresh: Option<LeaseGrant>,
    ) -> Option<Lease> {
        let (key, client_id) = (job.key, job.client_id);
        if grants.is_empty() && fresh.is_none() {
            return None;
        }
        let sync = PermitSync {
            v: V1,
            client_id: client_id.to_owned(),
            grants: claims(grants),
            leases: Some(
                fresh
                    .iter()
                    .map(|lease| report(&lease.lease_id, 0, 0, false))
                    .collect(),
            ),
        };
        let synced = match self.client.sync(key, sync).await {
            Ok(synced) => synced,
            Err(error) => {
                self.event(format_args!(
                    "lease ack of {key} failed: {}",
                    failure(&error)
                ));
                return None;
            }
        };
        let from = now();
        let claimed = confirmed(grants, &synced.grant_results);
        if claimed > 0 {
            self.holding(job.ask_index, key, claimed);
        }
        let fresh = fresh?;
        let echo = synced
            .leases
            .unwrap_or_default()
            .into_iter()
            .find(|echo| echo.lease_id == fresh.lease_id)?;
        if echo.permits == 0 || echo.expires_at_ms <= self.client.now_ms() {
            self.event(format_args!("lease on {key} came back dead"));
            return None;
        }
        self.event(format_args!(
            "lease on {key} x{} acknowledged",
            echo.permits
        ));
        self.shared.history.update_lease(job.lease_index, |record| {
            if let Some(held) = &mut record.lease {
                held.permits = echo.permits;
                held.acknowledged = Some(from);
            }
        });
        Some(Lease {
            id: fresh.lease_id,
            expires_at_ms: echo.expires_at_ms,
            drawn: 0,
            permits: echo.permits,
        })
    }

    /// Draws a permit and works; heartbeats the lease, or lets it lapse;
    /// draws a second permit if the lease is still live and has one.
    async fn work_under_lease(
        &mut self,
        job: &LeaseJob<'_>,
        spec: LeaseSpec,
        lease: Option<&mut Lease>,
    ) {
        let (key, lease_index) = (job.key, job.lease_index);
        let Some(lease) = lease else {
            let hold = self.hold();
            tokio::time::sleep(hold).await;
            return;
        };
        let lapse = self.rng.random_ratio(LAPSED_PERCENT, 100);
        self.draw(lease, lease_index);
        if lapse {
            self.event(format_args!("lets its lease on {key} lapse"));
            tokio::time::sleep(spec.ttl + spec.ttl / 2).await;
        } else {
            let beats = self.rng.random_range(1..=3);
            for _ in 0..beats {
                tokio::time::sleep(spec.ttl / 3).await;
                self.heartbeat(key, job.client_id, lease).await;
            }
        }
        self.stop_drawing(lease_index);
        if lease.drawn < lease.permits && self.client.now_ms() < lease.expires_at_ms {
            self.draw(lease, lease_index);
            let hold = self.hold();
            tokio::time::sleep(hold).await;
            self.stop_drawing(lease_index);
        } else if self.client.now_ms() >= lease.expires_at_ms {
            self.event(format_args!("its lease on {key} lapsed: no more draws"));
        }
    }

    fn draw(&mut self, lease: &mut Lease, lease_index: usize) {
        lease.drawn += 1;
        let from = now();
        self.shared.history.update_lease(lease_index, |record| {
            if let Some(held) = &mut record.lease {
                held.draws.push(Draw {
                    group: LEASE_GROUP.to_owned(),
                    permits: 1,
                    from,
                    until: None,
                });
            }
        });
    }

    /// The work under the newest draw is done.
    fn stop_drawing(&self, lease_index: usize) {
        let until = now();
        self.shared.history.update_lease(lease_index, |record| {
            let draws = record
                .lease
                .iter_mut()
                .flat_map(|held| held.draws.iter_mut());
            for draw in draws.filter(|draw| draw.until.is_none()) {
                draw.until = Some(until);
            }
        });
    }

    /// Reports the lease (nothing released), which keeps it live.
    async fn heartbeat(&mut self, key: &str, client_id: &str, lease: &mut Lease) {
        let sync = PermitSync {
            v: V1,
            client_id: client_id.to_owned(),
            grants: vec![],
            leases: Some(vec![report(&lease.id, lease.drawn, 0, false)]),
        };
        if let Ok(synced) = self.client.sync(key, sync).await {
            let echo = synced.leases.unwrap_or_default();
            if let Some(echo) = echo.into_iter().find(|echo| echo.lease_id == lease.id) {
                lease.expires_at_ms = echo.expires_at_ms;
            }
        }
    }

    /// Releases the grants and retires and releases the lease in one `sync`.
    async fn settle(
        &mut self,
        job: &LeaseJob<'_>,
        grants: &[GrantedPermits],
        lease_id: Option<String>,
        drawn: u64,
    ) {
        if grants.is_empty() && lease_id.is_none() {
            return;
        }
        let (key, lease_index) = (job.key, job.lease_index);
        let sent = now();
        self.shared.history.update_lease(lease_index, |record| {
            if let Some(held) = &mut record.lease {
                held.settle_sent = Some(sent);
            }
        });
        let sync = PermitSync {
            v: V1,
            client_id: job.client_id.to_owned(),
            grants: released(grants),
            leases: Some(
                lease_id
                    .iter()
                    .map(|id| report(id, drawn, drawn, true))
                    .collect(),
            ),
        };
        match self.client.sync(key, sync).await {
            Ok(_) => {
                let at = now();
                self.event(format_args!("settled {key}"));
                self.returned(job.ask_index);
                self.shared.history.update_lease(lease_index, |record| {
                    if let Some(held) = &mut record.lease {
                        held.settled = Some(at);
                    }
                });
            }
            Err(error) => self.event(format_args!("settling {key} failed: {}", failure(&error))),
        }
    }
}

fn report(lease_id: &str, drawn: u64, released: u64, retired: bool) -> LeaseReport {
    LeaseReport {
        lease_id: lease_id.to_owned(),
        drawn,
        released,
        retired,
    }
}
