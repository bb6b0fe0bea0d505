//! After-apply side effects on every node: the core's lifecycle events become
//! tracing events and enter the node's event log (`GET /v1/events`), and the
//! per-key usage gauges of the keys an entry touched are refreshed (the bounded
//! series: see `metrics.rs`).

use std::sync::Arc;

use permitd_core::{Event, Usage};
use permitd_storage::{Applied, SharedState};
use tokio::sync::broadcast;

use crate::clock::Clock;
use crate::observe::event_log::EventLog;
use crate::observe::metrics::UsageGauges;

/// Starts the task on `applied` (the state machine's notices, subscribed before
/// `log` was made); it ends when the broadcast closes.
pub fn start(
    state: SharedState,
    log: EventLog,
    applied: broadcast::Receiver<Arc<Applied>>,
    clock: Clock,
) {
    crate::seams::spawn(run(state, log, applied, clock));
}

async fn run(
    state: SharedState,
    log: EventLog,
    mut applied: broadcast::Receiver<Arc<Applied>>,
    clock: Clock,
) {
    let mut gauges = crate::observe::metrics::UsageGauges::default();
    loop {
        match applied.recv().await {
            Ok(entry) => {
                for (key, event) in &entry.events {
                    emit(entry.log_index, key, event);
                }
                log.push(&entry);
                refresh_usage(&state, &clock, &mut gauges, &entry.keys);
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "applied-entry events skipped: the node fell behind");
                log.lost_notices();
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Refreshes the per-key series of the keys an entry touched (the all-keys
/// totals are added up at each scrape: `metrics::publish_totals`).
fn refresh_usage(state: &SharedState, clock: &Clock, gauges: &mut UsageGauges, keys: &[String]) {
    let keys: Vec<&String> = keys.iter().filter(|key| gauges.wants(key)).collect();
    if keys.is_empty() {
        return;
    }
    let now_ms = clock.now_ms();
    let usages: Vec<Usage> = state.read(|semaphores| {
        keys.iter()
            .map(|key| semaphores.usage(key, now_ms))
            .collect()
    });
    for (key, usage) in keys.into_iter().zip(&usages) {
        gauges.update(key, usage);
    }
}

fn emit(log_index: u64, key: &str, event: &Event) {
    let name = event.name();
    match event {
        Event::Round {
            requested,
            granted,
            usage,
            ..
        } => tracing::debug!(
            event = name,
            log_index,
            key,
            requested,
            granted,
            usage_granted = usage.granted,
            usage_leased = usage.leased,
            available = usage.available
        ),
        Event::Blocked {
            group,
            reason,
            count,
            ..
        } => {
            crate::observe::metrics::blocked(reason.as_str(), *count);
            tracing::debug!(
                event = name,
                log_index,
                key,
                group,
                reason = reason.as_str(),
                count
            );
        }
        Event::GrantReclaimed {
            grant_id,
            client_id,
            group,
            permits,
            ..
        } => tracing::info!(event = name, log_index, key, %grant_id, client_id, group, permits),
        Event::LeaseGranted {
            lease_id,
            client_id,
            group,
            permits,
            ..
        }
        | Event::LeaseRetired {
            lease_id,
            client_id,
            group,
            permits,
            ..
        }
        | Event::LeaseReclaimed {
            lease_id,
            client_id,
            group,
            permits,
            ..
        } => tracing::info!(event = name, log_index, key, %lease_id, client_id, group, permits),
        Event::ClientReleased {
            client_id,
            grants,
            leases,
            permits,
            ..
        } => tracing::warn!(
            event = name,
            log_index,
            key,
            client_id,
            grants,
            leases,
            permits
        ),
        Event::KeyDeleted {
            grants,
            leases,
            permits,
            ..
        } => tracing::warn!(event = name, log_index, key, grants, leases, permits),
    }
}
