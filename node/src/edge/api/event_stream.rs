//! `GET /v1/events?key=&from=&cursor=`: lifecycle events as Server-Sent Events.
//!
//! Served by the node called, from its own applied entries
//! ([`EventLog`](crate::observe::event_log::EventLog)): any node can serve it,
//! so it is not forwarded, and a stream outlives a leader change. Each message
//! is one event (`event:` its type, `id:` the stream's cursor after it,
//! `data:` an [`EventRecord`](permitd_core::contract::EventRecord) as JSON).
//!
//! What a stream covers: with `key`, the key's shard; with `x-permitd-shard`,
//! that shard; else every shard of the cluster, merged in the order this node
//! applied their entries (shards are independent Raft groups: no order
//! between them exists, and another node may interleave them otherwise). The
//! cursor ([`EventCursor`]) holds one log index per covered shard, so a
//! stream of one shard (every stream at S = 1) has the plain log index as its
//! id, as before shards. `Last-Event-ID: id` (what a browser's `EventSource`
//! sends when it reconnects) or `cursor=id` resumes every covered shard right
//! after that id: none of its events repeats, none is skipped. `from=N` starts
//! every covered shard at index N.
//!
//! Refusals before the stream starts are ordinary JSON errors: 400 for a bad
//! query or cursor, 410 `too_far_behind` when any covered shard's events from
//! its position on are gone, 429 `too_many_subscribers` (a stream is one
//! subscriber, whatever it covers). A stream that falls more than the buffer
//! behind in any shard while running ends with one `stream_error` message
//! carrying `too_far_behind`; the subscriber resumes from the last id it saw,
//! or re-reads the state.

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
use permitd_core::contract::{paths, ErrorAnswer, ErrorCode, EventCursor, EventQuery};
use permitd_core::limits::EVENT_KEEP_ALIVE_SECONDS;
use tokio::sync::broadcast::{self, error::RecvError};

use crate::app::App;
use crate::edge::api::extract::routed;
use crate::edge::error::ApiError;
use crate::observe::event_log::{matches, Admission, KeptEvent, SubscribeError, Subscription};
use crate::shard::Shard;

/// The header a reconnecting `EventSource` sends.
const LAST_EVENT_ID: &str = "last-event-id";

/// `GET /v1/events`.
#[utoipa::path(
    get, path = paths::EVENTS, tag = "operations",
    params(
        ("key" = Option<String>, Query, description = "Only this key's events (1 to 256 bytes), from the key's shard; every key's when absent, from the shard `x-permitd-shard` names, else from every shard."),
        ("from" = Option<u64>, Query, description = "The first log index to send, inclusive, in every shard the stream covers; only new events when absent. Not with `cursor`."),
        ("cursor" = Option<String>, Query, description = "Resume right after this message `id`: one log index per shard the stream covers, in shard order, joined by commas (`12,0,7`; one shard: the plain index). At most 21 bytes per shard. Not with `from`."),
        ("Last-Event-ID" = Option<String>, Header, description = "A reconnecting stream's last id: the same as `cursor`, and it wins over `cursor` and `from`."),
    ),
    responses(
        (status = 200, description = "Server-Sent Events: per event `event:` its type, `id:` the stream's cursor after it (the entry's log index when the stream covers one shard), `data:` one event record as JSON (docs/protocol.md, \"Event stream\"). The stream stays open.", content_type = "text/event-stream", body = String),
        (status = 400, description = "`bad_request`: a bad key, shard, `from`, or a cursor that is too long, not decimal indexes, or not one per covered shard (the field names `cursor` or `Last-Event-ID`).", body = ErrorAnswer),
        (status = 410, description = "`too_far_behind`: some covered shard's events from its position on are no longer all kept on this node (a `from` before the first event is fine while the node keeps every event since the cluster began).", body = ErrorAnswer),
        (status = 429, description = "`too_many_subscribers`: this node serves its maximum of streams (one each, whatever shards it covers).", body = ErrorAnswer),
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
    let shards = covered_shards(&app, query.key.as_deref(), &headers)?;
    let first = first_indexes(&headers, &query, shards.len())?;
    let admission = app.events.admit().map_err(refusal)?;
    let subscriptions = shards
        .iter()
        .zip(&first)
        .map(|(shard, from)| shard.events.subscribe(query.key.as_deref(), *from))
        .collect::<Result<Vec<Subscription>, SubscribeError>>()
        .map_err(refusal)?;
    let first = first.iter().map(|from| from.unwrap_or(0)).collect();
    let events = messages(admission, subscriptions, first, query.key);
    let keep_alive = KeepAlive::new().interval(Duration::from_secs(EVENT_KEEP_ALIVE_SECONDS));
    Ok(Sse::new(events).keep_alive(keep_alive).into_response())
}

/// The shards a stream follows, in shard order: the key's, the one
/// `x-permitd-shard` names, else every shard of the cluster.
fn covered_shards<'a>(
    app: &'a App,
    key: Option<&str>,
    headers: &HeaderMap,
) -> Result<Vec<&'a Shard>, ApiError> {
    if let Some(key) = key {
        return Ok(vec![app.key_shard(key)]);
    }
    match crate::edge::api::forward::named_shard(headers, app.shard_count())? {
        Some(shard) => Ok(vec![routed(app, shard)?]),
        None => Ok(app.shards.iter().collect()),
    }
}

/// Per covered shard, the first log index to send (`None`: new events only).
/// `Last-Event-ID` wins over the query: a reconnecting `EventSource` repeats
/// its first URL, whose `from` or `cursor` is older than what it saw.
fn first_indexes(
    headers: &HeaderMap,
    query: &EventQuery,
    shards: usize,
) -> Result<Vec<Option<u64>>, ApiError> {
    let (field, text) = match (last_event_id(headers)?, &query.cursor, query.from) {
        (Some(id), _, _) => ("Last-Event-ID", id),
        (None, Some(_), Some(_)) => {
            return Err(ApiError::BadRequest(
                "name `cursor` or `from`, not both".into(),
            ))
        }
        (None, Some(cursor), None) => ("cursor", cursor.as_str()),
        (None, None, from) => return Ok(vec![from; shards]),
    };
    let shards = u32::try_from(shards).unwrap_or(u32::MAX);
    let cursor =
        EventCursor::parse(text, shards).map_err(|error| ApiError::Cursor { field, error })?;
    // After a position of u64::MAX nothing can come: from saturates there.
    Ok(cursor
        .positions()
        .iter()
        .map(|position| Some(position.saturating_add(1)))
        .collect())
}

fn last_event_id(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(value) = headers.get(LAST_EVENT_ID) else {
        return Ok(None);
    };
    value
        .to_str()
        .map(|text| Some(text.trim()))
        .map_err(|_| ApiError::BadRequest("Last-Event-ID is not a cursor (visible ASCII)".into()))
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

/// One covered shard's live entries (each its events, in order), tagged with
/// its place in the cursor.
type LiveFeed = stream::BoxStream<'static, (usize, Result<Vec<Arc<KeptEvent>>, RecvError>)>;

/// Where a running stream is: what is left of the backlog, the live feeds of
/// the shards it covers, and the cursor each message names.
struct Merged {
    /// The stream's place among the node's subscribers, held for its life.
    _admission: Admission,
    /// Every covered shard's kept events, in the order this node applied them.
    backlog: std::vec::IntoIter<(usize, Arc<KeptEvent>)>,
    live: stream::SelectAll<LiveFeed>,
    /// The rest of the live entry being sent: one entry's events go out
    /// together, never another shard's between them.
    entry: std::collections::VecDeque<(usize, Arc<KeptEvent>)>,
    /// Per covered shard, the first log index to send: a live event below it
    /// was asked to be skipped (a `from` ahead of what the node applied).
    first: Vec<u64>,
    /// Set when the node shuts down; every shard's log closes at once.
    closed: tokio::sync::watch::Receiver<bool>,
    key: Option<String>,
    cursor: EventCursor,
    ended: bool,
}

impl Merged {
    /// The message of `record`, the `shard`-th covered shard's, naming the
    /// cursor once the stream passed it.
    fn send(&mut self, shard: usize, record: &KeptEvent) -> SseEvent {
        self.cursor.pass(shard, record.log_index);
        message(record, &self.cursor)
    }
}

/// The backlog, then live events, until the node shuts down or the stream falls
/// behind (then one `stream_error` message ends it). `subscriptions` are the
/// covered shards' in shard order (at least one); `first` their first index.
fn messages(
    admission: Admission,
    subscriptions: Vec<Subscription>,
    first: Vec<u64>,
    key: Option<String>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    assert!(
        !subscriptions.is_empty() && subscriptions.len() == first.len(),
        "a stream covers at least one shard, each with its first index"
    );
    let closed = subscriptions[0].closed.clone();
    let cursor = EventCursor::new(subscriptions.iter().map(|s| s.after).collect());
    let mut backlog = Vec::new();
    let mut live = Vec::with_capacity(subscriptions.len());
    for (shard, subscription) in subscriptions.into_iter().enumerate() {
        backlog.extend(
            subscription
                .backlog
                .into_iter()
                .map(|record| (shard, record)),
        );
        live.push(live_feed(shard, subscription.live));
    }
    // Each shard's backlog is in its log's order already; the stable sort
    // interleaves the shards as this node applied their entries, and keeps
    // the events of one entry (one order) together.
    backlog.sort_by_key(|(_, record)| record.applied_order);
    let merged = Merged {
        _admission: admission,
        backlog: backlog.into_iter(),
        live: stream::select_all(live),
        entry: std::collections::VecDeque::new(),
        first,
        closed,
        key,
        cursor,
        ended: false,
    };
    stream::unfold(merged, |mut merged| async move {
        if merged.ended {
            return None;
        }
        let message = next_message(&mut merged).await?;
        Some((Ok(message), merged))
    })
    .boxed()
}

/// A shard's live events as a stream of whole entries: an entry's events
/// are sent under one lock hold, so the rest of an entry follows its first
/// at once. A subscription starts between entries (it is taken under the
/// same lock), so the first event received starts an entry.
fn live_feed(shard: usize, receiver: broadcast::Receiver<Arc<KeptEvent>>) -> LiveFeed {
    stream::unfold(receiver, move |mut receiver| async move {
        let mut entry = Vec::new();
        loop {
            match receiver.recv().await {
                Ok(record) => {
                    let last = record.last_of_entry;
                    entry.push(record);
                    if last {
                        return Some(((shard, Ok(entry)), receiver));
                    }
                }
                Err(error) => return Some(((shard, Err(error)), receiver)),
            }
        }
    })
    .boxed()
}

async fn next_message(merged: &mut Merged) -> Option<SseEvent> {
    if let Some((shard, record)) = merged.backlog.next() {
        return Some(merged.send(shard, &record));
    }
    loop {
        while let Some((shard, record)) = merged.entry.pop_front() {
            if record.log_index >= merged.first[shard] && matches(merged.key.as_deref(), &record) {
                return Some(merged.send(shard, &record));
            }
        }
        // Biased, live events first: the order of a stream never depends on
        // a random draw, and what was applied before shutdown is still sent.
        let (shard, received) = tokio::select! {
            biased;
            received = merged.live.next() => received?,
            _ = merged.closed.wait_for(|closed| *closed) => return None,
        };
        match received {
            Ok(entry) => merged
                .entry
                .extend(entry.into_iter().map(|record| (shard, record))),
            Err(RecvError::Lagged(missed)) => {
                merged.ended = true;
                return Some(fell_behind(missed));
            }
            Err(RecvError::Closed) => return None,
        }
    }
}

fn message(record: &KeptEvent, cursor: &EventCursor) -> SseEvent {
    SseEvent::default()
        .event(record.name)
        .id(cursor.to_string())
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
    use crate::observe::event_log::{round_entry, EventHub, EventLog};

    /// The messages a stream over `logs` (in shard order) sends from `from`
    /// until the logs close, as (id, message text).
    async fn collect(
        logs: &[&EventLog],
        key: Option<&str>,
        from: &[Option<u64>],
    ) -> Vec<(String, String)> {
        let hub = EventHub::default();
        let subscriptions = logs
            .iter()
            .zip(from)
            .map(|(log, from)| log.subscribe(key, *from).expect("subscribes"))
            .collect();
        let first = from.iter().map(|from| from.unwrap_or(0)).collect();
        let admission = hub.admit().expect("admitted");
        let stream = messages(admission, subscriptions, first, key.map(str::to_owned));
        for log in logs {
            log.close();
        }
        stream
            .map(|message| sent(message.expect("infallible")))
            .collect()
            .await
    }

    /// A message's id and its debug text.
    fn sent(message: SseEvent) -> (String, String) {
        let text = format!("{message:?}");
        let id = text
            .split("id: ")
            .nth(1)
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_ascii_digit() || *c == ',')
                    .collect()
            })
            .unwrap_or_default();
        (id, text)
    }

    #[tokio::test]
    async fn the_backlog_of_the_key_is_sent_from_the_index() {
        let log = EventLog::with_capacity(0, 10, &EventHub::default());
        for (index, key) in [(1, "a"), (2, "b"), (3, "a")] {
            log.push(&round_entry(index, &[key]));
        }
        let sent = collect(&[&log], Some("a"), &[Some(2)]).await;
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].0, "3", "one shard: the plain log index");
    }

    /// Two shards' logs of one node, with entries of one event each pushed
    /// in the order 0:1, 1:1, 0:2, 1:2, 1:3.
    fn two_shards() -> (EventLog, EventLog) {
        let hub = EventHub::default();
        let (zero, one) = (
            EventLog::with_capacity(0, 10, &hub),
            EventLog::with_capacity(0, 10, &hub),
        );
        zero.push(&round_entry(1, &["a"]));
        one.push(&round_entry(1, &["b"]));
        zero.push(&round_entry(2, &["a"]));
        one.push(&round_entry(2, &["b"]));
        one.push(&round_entry(3, &["c"]));
        (zero, one)
    }

    #[tokio::test]
    async fn a_stream_of_every_shard_sends_them_in_applied_order_with_cursors() {
        let (zero, one) = two_shards();
        let sent = collect(&[&zero, &one], None, &[Some(0), Some(0)]).await;
        let ids: Vec<&str> = sent.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["1,0", "1,1", "2,1", "2,2", "2,3"]);
    }

    #[tokio::test]
    async fn resuming_after_any_id_sends_the_rest_exactly_once() {
        let (zero, one) = two_shards();
        let all = collect(&[&zero, &one], None, &[Some(0), Some(0)]).await;
        for (seen, (id, _)) in all.iter().enumerate() {
            let cursor = EventCursor::parse(id, 2).unwrap();
            let from: Vec<Option<u64>> = cursor.positions().iter().map(|p| Some(p + 1)).collect();
            let rest = collect(&[&zero, &one], None, &from).await;
            assert_eq!(rest, all[seen + 1..], "resumed after {id}");
        }
    }

    #[tokio::test]
    async fn a_stream_of_new_events_starts_its_cursor_where_each_log_stands() {
        let (zero, one) = two_shards();
        let hub = EventHub::default();
        let subscriptions = vec![
            zero.subscribe(None, None).unwrap(),
            one.subscribe(None, None).unwrap(),
        ];
        let stream = messages(hub.admit().unwrap(), subscriptions, vec![0, 0], None);
        one.push(&round_entry(4, &["b"]));
        zero.close();
        let sent: Vec<(String, String)> = stream
            .map(|message| sent(message.expect("infallible")))
            .collect()
            .await;
        let ids: Vec<&str> = sent.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["2,4"], "shard 0 stands at its last index, 2");
    }

    #[tokio::test]
    async fn the_events_of_one_entry_go_out_together() {
        let hub = EventHub::default();
        let (zero, one) = (
            EventLog::with_capacity(0, 10, &hub),
            EventLog::with_capacity(0, 10, &hub),
        );
        let subscriptions = vec![
            zero.subscribe(None, Some(0)).unwrap(),
            one.subscribe(None, Some(0)).unwrap(),
        ];
        let stream = messages(hub.admit().unwrap(), subscriptions, vec![0, 0], None);
        for index in 1..=3 {
            zero.push(&round_entry(index, &["a", "b", "c"]));
            one.push(&round_entry(index, &["x", "y"]));
        }
        zero.close();
        let sent: Vec<(String, String)> = stream
            .map(|message| sent(message.expect("infallible")))
            .collect()
            .await;
        let runs: Vec<&str> = sent
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>()
            .chunk_by(|a, b| a == b)
            .map(|run| run[0])
            .collect();
        assert_eq!(sent.len(), 15, "{sent:?}");
        assert_eq!(runs.len(), 6, "one run of ids per entry: {runs:?}");
    }

    #[tokio::test]
    async fn a_stream_that_falls_behind_in_any_shard_ends_with_a_stream_error() {
        let hub = EventHub::default();
        let (zero, one) = (
            EventLog::with_capacity(0, 10, &hub),
            EventLog::with_capacity(0, 3, &hub),
        );
        let subscriptions = vec![
            zero.subscribe(None, None).expect("subscribes"),
            one.subscribe(None, None).expect("subscribes"),
        ];
        for index in 1..=10 {
            one.push(&round_entry(index, &["a"]));
        }
        let sent: Vec<(String, String)> =
            messages(hub.admit().unwrap(), subscriptions, vec![0, 0], None)
                .map(|message| sent(message.expect("infallible")))
                .collect()
                .await;
        assert_eq!(sent.len(), 1, "one error, then the end: {sent:?}");
        assert!(sent[0].1.contains(STREAM_ERROR_EVENT), "{sent:?}");
        assert!(sent[0].1.contains("too_far_behind"), "{sent:?}");
    }

    fn query(from: Option<u64>, cursor: Option<&str>) -> EventQuery {
        EventQuery {
            key: None,
            from,
            cursor: cursor.map(str::to_owned),
        }
    }

    #[test]
    fn a_cursor_resumes_each_shard_after_its_position() {
        let none = HeaderMap::new();
        assert_eq!(
            first_indexes(&none, &query(None, Some("4,0,9")), 3).unwrap(),
            [Some(5), Some(1), Some(10)]
        );
        assert_eq!(
            first_indexes(&none, &query(Some(7), None), 2).unwrap(),
            [Some(7), Some(7)]
        );
        assert_eq!(
            first_indexes(&none, &query(None, None), 2).unwrap(),
            [None, None]
        );
        let mut reconnect = HeaderMap::new();
        reconnect.insert(LAST_EVENT_ID, " 1,2 ".parse().unwrap());
        assert_eq!(
            first_indexes(&reconnect, &query(Some(0), None), 2).unwrap(),
            [Some(2), Some(3)],
            "Last-Event-ID wins over the first URL's from"
        );
        reconnect.insert(LAST_EVENT_ID, u64::MAX.to_string().parse().unwrap());
        assert_eq!(
            first_indexes(&reconnect, &query(None, None), 1).unwrap(),
            [Some(u64::MAX)]
        );
    }

    #[test]
    fn a_bad_cursor_is_a_400_naming_where_it_came_from() {
        let none = HeaderMap::new();
        let refused = |headers: &HeaderMap, query: &EventQuery| {
            let error = first_indexes(headers, query, 3).unwrap_err();
            let answer = error.body();
            assert_eq!(answer.error.code, ErrorCode::BadRequest, "{answer:?}");
            answer.error.field
        };
        assert_eq!(
            refused(&none, &query(None, Some("1,2"))).as_deref(),
            Some("cursor")
        );
        assert_eq!(
            refused(&none, &query(None, Some("a,b,c"))).as_deref(),
            Some("cursor")
        );
        let long = "9".repeat(100);
        assert_eq!(
            refused(&none, &query(None, Some(&long))).as_deref(),
            Some("cursor")
        );
        assert_eq!(refused(&none, &query(Some(1), Some("1,2,3"))), None);
        let mut headers = HeaderMap::new();
        headers.insert(LAST_EVENT_ID, "7".parse().unwrap());
        assert_eq!(
            refused(&headers, &query(None, None)).as_deref(),
            Some("Last-Event-ID")
        );
    }
}
