//! `GET /v1/events`: the lifecycle events of applied entries as Server-Sent
//! Events (docs/protocol.md, "Event stream").
//!
//! Each SSE message is one event: `event:` its type, `id:` the log index of the
//! entry that produced it, `data:` one [`EventRecord`] as JSON. The events of one
//! entry share its index and are written together; resuming with `from = id + 1`
//! (or `Last-Event-ID: id`) therefore neither repeats nor skips an entry.

use serde::{Deserialize, Serialize};

use crate::engine::lifecycle::Event;

/// The query of `GET /v1/events`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventQuery {
    /// Only this key's events; every key's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The first log index to send (inclusive); only new events when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<u64>,
}

/// The SSE event name of a stream's last message when it ends because the
/// subscriber fell behind; its data is an [`super::ErrorAnswer`].
pub const STREAM_ERROR_EVENT: &str = "stream_error";

/// One event as the stream sends it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRecord {
    /// The entry that produced it (also the SSE `id:`).
    pub log_index: u64,
    pub key: String,
    /// `type` and the event's own fields.
    #[serde(flatten)]
    pub event: Event,
}
