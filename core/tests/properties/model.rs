//! The client model: per key, the grants and leases a client was told about and
//! the cumulative counts it reports, as a queue keeps them.

use super::*;

#[derive(Debug, Clone)]
pub(crate) struct HeldGrant {
    pub(crate) permits: u64,
    pub(crate) claimed: u64,
    pub(crate) released: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct HeldLease {
    pub(crate) permits: u64,
    pub(crate) drawn: u64,
    pub(crate) released: u64,
    /// The client stopped drawing and reports `retired: true` from now on.
    pub(crate) retired: bool,
    /// The holder said stop (expiry in the past); the client draws no more.
    pub(crate) stopped: bool,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Reports {
    pub(crate) grants: Vec<GrantReport>,
    pub(crate) leases: Vec<LeaseReport>,
}

/// What one client holds at one key and reports about it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Holdings {
    pub(crate) grants: BTreeMap<String, HeldGrant>,
    pub(crate) leases: BTreeMap<String, HeldLease>,
    /// Ids the holder said it does not know: never resurrected by a stale echo.
    pub(crate) gone: BTreeSet<String>,
    /// Every current report sent, oldest first: the source of stale replays.
    pub(crate) sent: Vec<Reports>,
    pub(crate) request_ids: Vec<String>,
}

impl Holdings {
    /// Cumulative counts as the client sees them now.
    pub(crate) fn current(&self) -> Reports {
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

    pub(crate) fn work(&mut self, step: &Work) {
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
    pub(crate) fn finish_everything(&mut self) {
        for grant in self.grants.values_mut() {
            grant.released = grant.claimed;
        }
        for lease in self.leases.values_mut() {
            lease.released = lease.drawn;
            lease.retired = true;
        }
    }

    /// Takes in what the holder answered.
    pub(crate) fn absorb(
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
            // A queue hands back idle headroom when the holder says it is contended.
            for lease in self.leases.values_mut() {
                if lease.drawn < lease.permits {
                    lease.retired = true;
                }
            }
        }
    }
}

pub(crate) fn nth<'a, T>(map: &'a mut BTreeMap<String, T>, index: &Index) -> Option<&'a mut T> {
    let position = pick(index, map.len())?;
    map.values_mut().nth(position)
}
