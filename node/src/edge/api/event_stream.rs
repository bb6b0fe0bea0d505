//! `GET /v1/events?key=&from=`: lifecycle events as Server-Sent Events.
//!
//! Served by the node called, from its own applied entries
//! ([`EventLog`](crate::observe::event_log::EventLog)): any node can serve it,
//! so it is not forwarded, and a stream outlives a leader change. Each message
//! is one event (`event:` its type, `id:` its entry's log index, `data:` an
//! [`EventRecord`](permitd_core::contract::EventRecord) as JSON).
//! `Last-Event-ID: N` (what a browser's `EventSource` sends when it reconnects)
//! means `from = N + 1`.
//!
//! Refusals before the stream starts are ordinary JSON errors: 400 for a bad
//! query, 410 `too_far_behind` when events from `from` on are gone, 429
//! `too_many_subscribers`. A stream that falls more than the buffer behind while
//! running ends with one `stream_error` message carrying `too_far_behind`; the
//! subscriber resumes from the last id it saw, or re-reads the state.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use permitd_core::contract::event_stream::STREAM_ERROR_EVENT;
use permitd_core::contract::validate::validate_key;
use permitd_core::contract::{headers, paths};
use permitd_core::contract::{ErrorAnswer, ErrorCode, EventQuery};
use permitd_core::limits::EVENT_KEEP_ALIVE_SECONDS;
use tokio::sync::broadcast::error::RecvError;

use crate::app::App;
use crate::edge::api::extract::routed;
use crate::edge::error::ApiError;
use crate::observe::event_log::{matches, KeptEvent, SubscribeError, Subscription};
use crate::shard::META_SHARD;
use permitd_storage::ShardId;

/// The header a reconnecting `EventSource` sends.
const LAST_EVENT_ID: &str = "last-event-id";

/// `GET /v1/events`.
#[utoipa::path(
    get, path = paths::EVENTS, tag = "operations",
    params(
        ("key" = Option<String>, Query, description = "Only this key's events (1 to 256 bytes); every key's when absent."),
        ("from" = Option<u64>, Query, description = "The first log index to send, inclusive; only new events when absent."),
        ("Last-Event-ID" = Option<u64>, Header, description = "A reconnecting stream's last id: the same as `from` = id + 1."),
    ),
    responses(
        (status = 200, description = "Server-Sent Events: per event `event:` its type, `id:` its entry's log index, `data:` one event record as JSON (docs/protocol.md, \"Event stream\"). The stream stays open.", content_type = "text/event-stream", body = String),
        (status = 410, description = "`too_far_behind`: events from `from` on are no longer all kept on this node (a `from` before the first event is fine while the node keeps every event since the cluster began).", body = ErrorAnswer),
        (status = 429, description = "`too_many_subscribers`: this node serves its maximum of streams.", body = ErrorAnswer),
    ),
)]
pub async fn stream(
    State(app): State<App>,
    headers: HeaderMap,
    query: Result<Query<EventQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    if let Some(key) = &query.key {
        validate_key(key)?;
    }
    let from = match last_event_id(&headers)? {
        Some(id) => Some(id.saturating_add(1)),
        None => query.from,
    };
    let shard = match &query.key {
        Some(key) => app.key_shard(key),
        None => routed(&app, stream_shard(&app, &headers)?)?,
    };
    let subscription = shard
        .events
        .subscribe(query.key.as_deref(), from)
        .map_err(refusal)?;
    let events = messages(subscription, query.key, from.unwrap_or(0));
    let keep_alive = KeepAlive::new().interval(Duration::from_secs(EVENT_KEEP_ALIVE_SECONDS));
    Ok(Sse::new(events).keep_alive(keep_alive).into_response())
}

/// The shard a stream of every key follows: the one [`headers::SHARD`]
/// names. Each shard numbers its events by its own log index, so a stream
/// of a cluster of several shards follows one of them; a client that wants
/// them all opens one per shard (docs/protocol.md, "Events").
fn stream_shard(app: &App, headers: &HeaderMap) -> Result<ShardId, ApiError> {
    match crate::edge::api::forward::named_shard(headers, app.shard_count())? {
        Some(shard) => Ok(shard),
        None if app.shard_count() == 1 => Ok(META_SHARD),
        None => Err(ApiError::BadRequest(format!(
            "this cluster has {} shards: name a key, or a shard in {}",
            app.shard_count(),
            headers::SHARD
        ))),
    }
}

fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get(LAST_EVENT_ID) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| ApiError::BadRequest("Last-Event-ID is not a log index".into()))
}

fn refusal(error: SubscribeError) -> ApiError {
    let code = match error {
        SubscribeError::TooFarBehind { .. } | SubscribeError::MissedEntries => {
            ErrorCode::TooFarBehind
        }
        SubscribeError::TooManySubscribers { .. } => ErrorCode::TooManySubscribers,
    };
    ApiError::Stream {
        code,
        message: error.to_string(),
    }
}

/// Where a running stream is.
struct Cursor {
    subscription: Subscription,
    backlog: std::vec::IntoIter<Arc<KeptEvent>>,
    key: Option<String>,
    from: u64,
    ended: bool,
}

/// The backlog, then live events, until the node shuts down or the stream falls
/// behind (then one `stream_error` message ends it).
fn messages(
    mut subscription: Subscription,
    key: Option<String>,
    from: u64,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let backlog = std::mem::take(&mut subscription.backlog).into_iter();
    let cursor = Cursor {
        subscription,
        backlog,
        key,
        from,
        ended: false,
    };
    stream::unfold(cursor, |mut cursor| async move {
        if cursor.ended {
            return None;
        }
        let message = next_message(&mut cursor).await?;
        Some((Ok(message), cursor))
    })
    .boxed()
}

async fn next_message(cursor: &mut Cursor) -> Option<SseEvent> {
    if let Some(record) = cursor.backlog.next() {
        return Some(message(&record));
    }
    loop {
        let received = tokio::select! {
            received = cursor.subscription.live.recv() => received,
            _ = cursor.subscription.closed.wait_for(|closed| *closed) => return None,
        };
        match received {
            Ok(record) => {
                if record.log_index >= cursor.from && matches(cursor.key.as_deref(), &record) {
                    return Some(message(&record));
                }
            }
            Err(RecvError::Lagged(missed)) => {
                cursor.ended = true;
                return Some(fell_behind(missed));
            }
            Err(RecvError::Closed) => return None,
        }
    }
}

fn message(record: &KeptEvent) -> SseEvent {
    SseEvent::default()
        .event(record.name)
        .id(record.log_index.to_string())
        .data(&*record.json)
}

fn fell_behind(missed: u64) -> SseEvent {
    let answer = ErrorAnswer::new(
        ErrorCode::TooFarBehind,
        format!(
            "this stream fell {missed} events behind and ended; resume from the last id received"
        ),
    );
    let data = serde_json::to_string(&answer).expect("an error answer serialises");
    SseEvent::default().event(STREAM_ERROR_EVENT).data(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::event_log::{round_entry, EventLog};

    async fn collect(log: &EventLog, key: Option<&str>, from: Option<u64>) -> Vec<String> {
        let subscription = log.subscribe(key, from).expect("subscribes");
        let stream = messages(subscription, key.map(str::to_owned), from.unwrap_or(0));
        log.close();
        stream
            .map(|message| format!("{:?}", message.expect("infallible")))
            .collect()
            .await
    }

    #[tokio::test]
    async fn the_backlog_of_the_key_is_sent_from_the_index() {
        let log = EventLog::with_capacity(0, 10, 1);
        for (index, key) in [(1, "a"), (2, "b"), (3, "a")] {
            log.push(&round_entry(index, &[key]));
        }
        let sent = collect(&log, Some("a"), Some(2)).await;
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert!(sent[0].contains("id: 3"), "{sent:?}");
    }

    #[tokio::test]
    async fn a_stream_that_falls_behind_ends_with_a_stream_error() {
        let log = EventLog::with_capacity(0, 3, 1);
        let subscription = log.subscribe(None, None).expect("subscribes");
        for index in 1..=10 {
            log.push(&round_entry(index, &["a"]));
        }
        let sent: Vec<String> = messages(subscription, None, 0)
            .map(|message| format!("{:?}", message.expect("infallible")))
            .collect()
            .await;
        assert_eq!(sent.len(), 1, "one error, then the end: {sent:?}");
        assert!(sent[0].contains(STREAM_ERROR_EVENT), "{sent:?}");
        assert!(sent[0].contains("too_far_behind"), "{sent:?}");
    }
}
