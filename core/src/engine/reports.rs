//! Cumulative grant reports: claimed and released high-water marks.
//!
//! Counts only move forward and are clamped to what the grant can honour, so a
//! lost, repeated or reordered report can never free capacity twice.

use crate::contract::protocol::{GrantReport, GrantResult, GrantStatus};
use crate::engine::lifecycle::Event;
use crate::engine::state::{Grant, KeyState};
use crate::ids::GrantId;

/// Applies one client's grant reports in order and returns a result per report.
pub fn apply_grant_reports(
    state: &mut KeyState,
    client_id: &str,
    reports: &[GrantReport],
    now_ms: u64,
    events: &mut Vec<Event>,
) -> Vec<GrantResult> {
    reports
        .iter()
        .map(|report| apply_grant_report(state, client_id, report, now_ms, events))
        .collect()
}

fn apply_grant_report(
    state: &mut KeyState,
    client_id: &str,
    report: &GrantReport,
    now_ms: u64,
    events: &mut Vec<Event>,
) -> GrantResult {
    let owned = GrantId::parse(&report.grant_id)
        .and_then(|id| state.grants().get(&id).map(|grant| (id, grant.clone())))
        .filter(|(_, grant)| grant.client_id == client_id);
    let Some((id, grant)) = owned else {
        // Another client's grant is answered exactly like an unknown one.
        return GrantResult {
            grant_id: report.grant_id.clone(),
            claimed: 0,
            status: GrantStatus::NotFound,
        };
    };

    let expired = now_ms >= grant.claim_deadline_ms;
    let permits = if expired {
        grant.claimed
    } else {
        grant.permits
    };
    if permits < grant.permits {
        // Shrinking the grant here is the reclaim its deadline called for: say so.
        events.push(reclaimed_event(id, &grant, now_ms));
    }
    let claimed = grant.claimed.max(report.claimed.min(permits));
    let released = grant.released.max(report.released.min(claimed));
    let status = if expired && report.claimed > claimed {
        GrantStatus::Expired
    } else {
        GrantStatus::Ok
    };
    let updated = Grant {
        permits,
        claimed,
        released,
        ..grant
    };
    state.put_grant(id, (released < permits).then_some(updated));
    GrantResult {
        grant_id: id.to_string(),
        claimed,
        status,
    }
}

/// The `grant_reclaimed` event for a grant about to shrink to what was claimed.
pub(crate) fn reclaimed_event(id: GrantId, grant: &Grant, now_ms: u64) -> Event {
    Event::GrantReclaimed {
        timestamp_ms: now_ms,
        grant_id: id,
        client_id: grant.client_id.clone(),
        group: grant.group.clone(),
        permits: grant.permits - grant.claimed,
    }
}
