//! What a node tells its operators: Prometheus metrics ([`metrics`], with the
//! Raft and HTTP families in [`raft_metrics`] and [`http_metrics`]), the
//! lifecycle events of applied entries as tracing events and metrics
//! ([`applied_events`]), and the recent-events log `GET /v1/events` serves
//! ([`event_log`]); and [`expected_warnings`], which keeps dependencies'
//! warnings about normal events off the log.

pub mod applied_events;
pub mod event_log;
pub mod expected_warnings;
pub mod http_metrics;
pub mod metrics;
pub mod raft_metrics;
