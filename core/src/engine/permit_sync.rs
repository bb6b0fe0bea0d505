//! A sync: reports only, applied at once without waiting for a round.

use crate::config::KeyConfig;
use crate::contract::protocol::{PermitSync, PermitSyncResult, V1};
use crate::engine::leases::{apply_lease_reports, LeaseReports};
use crate::engine::lifecycle::Event;
use crate::engine::reports::apply_grant_reports;
use crate::engine::state::KeyState;

/// A sync's answer and the events it caused.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncOutcome {
    pub answer: PermitSyncResult,
    pub events: Vec<Event>,
}

/// Applies a sync's grant and lease reports at `now_ms`. `contended` is the key's
/// replicated flag from its last round, so any leader answers the same.
pub fn run_sync(
    state: &mut KeyState,
    config: &KeyConfig,
    now_ms: u64,
    sync: &PermitSync,
) -> SyncOutcome {
    let mut events = Vec::new();
    let grant_results =
        apply_grant_reports(state, &sync.client_id, &sync.grants, now_ms, &mut events);
    let leases = sync.leases.as_ref().map(|reports| {
        let mut seen = LeaseReports::default();
        apply_lease_reports(
            state,
            config.leases.as_ref(),
            &sync.client_id,
            reports,
            now_ms,
            &mut seen,
            &mut events,
        )
    });
    let contended = leases.is_some() && state.meta().contended;
    SyncOutcome {
        answer: PermitSyncResult {
            v: V1,
            grant_results,
            leases,
            contended,
        },
        events,
    }
}
