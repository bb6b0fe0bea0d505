//! What a node tells its operators: Prometheus metrics ([`metrics`], with the
//! Raft and HTTP families in [`raft_metrics`] and [`http_metrics`]), the
//! lifecycle events of applied entries as tracing events and metrics
//! ([`applied_events`]), and the recent-events log `GET /v1/events` serves
//! ([`event_log`]).

pub mod applied_events;
pub mod event_log;
pub mod http_metrics;
pub mod metrics;
pub mod raft_metrics;
