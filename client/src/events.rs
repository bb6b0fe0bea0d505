//! `GET /v1/events`: a key's (or every key's) lifecycle events as they are
//! applied, read as Server-Sent Events ([`SemaphoreClient::events`]).
//!
//! The node called serves the stream from its own applied entries, so any node
//! will do: the stream opens on the first endpoint that answers. Each message's
//! `id` is the stream's cursor after it ([`EventCursor`]): the log index of its
//! entry when the stream covers one shard (a key's, or any stream at one
//! shard), one index per shard joined by commas when it merges every shard.
//! To resume after a disconnect, open again after the last message's id
//! ([`SemaphoreClient::events_after`], whatever its form; a 410
//! `too_far_behind` means the node no longer keeps events that old: re-read
//! the state instead).
//!
//! [`EventCursor`]: permitd_core::contract::EventCursor

use bytes::Bytes;
use http_body_util::BodyExt;
use permitd_core::contract::event_stream::STREAM_ERROR_EVENT;
use permitd_core::contract::{paths, ErrorAnswer};
use permitd_transport::{Body, TransportError};
use sync_wrapper::SyncWrapper;

use crate::{ClientError, SemaphoreClient};

/// Longest SSE line the parser holds before giving up on the stream, in bytes
/// (an event record is a few hundred bytes).
pub const MAX_EVENT_LINE_BYTES: usize = 1024 * 1024;

/// One Server-Sent Events message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseMessage {
    /// The `event:` field (`round`, `grant_reclaimed`, … or `stream_error`).
    pub event: String,
    /// The `id:` field as a log index: the event's entry's, when the stream
    /// covers one shard; `None` for a merged stream's cursor.
    pub id: Option<u64>,
    /// The `id:` field as sent: the cursor to resume after
    /// ([`SemaphoreClient::events_after`]), whatever the stream covers.
    pub cursor: Option<String>,
    /// The `data:` lines joined by `\n`: one JSON event record.
    pub data: String,
}

/// An open event stream.
#[derive(Debug)]
pub struct EventStream {
    /// The URL that answered, to name in errors.
    url: String,
    /// The answer's body, read as it arrives. A transport's body need not be
    /// `Sync`; the wrapper keeps the stream `Sync` (it is only read through
    /// `&mut self`).
    body: SyncWrapper<Body>,
    parser: SseParser,
}

impl SemaphoreClient {
    /// Opens the event stream of `key` (every key when `None`) from log index
    /// `from` (only new events when `None`).
    /// `from` is the first index in every shard the stream covers.
    pub async fn events(
        &self,
        key: Option<&str>,
        from: Option<u64>,
    ) -> Result<EventStream, ClientError> {
        let from = from.map(|from| ("from", from.to_string()));
        self.open_events(key, from).await
    }

    /// Opens the event stream of `key` (every key when `None`) right after
    /// `cursor`, a message's [`SseMessage::cursor`] of the same stream: every
    /// shard it covers resumes after what that message had passed.
    pub async fn events_after(
        &self,
        key: Option<&str>,
        cursor: &str,
    ) -> Result<EventStream, ClientError> {
        self.open_events(key, Some(("cursor", cursor.to_owned())))
            .await
    }

    async fn open_events(
        &self,
        key: Option<&str>,
        start: Option<(&'static str, String)>,
    ) -> Result<EventStream, ClientError> {
        let path = paths::segments(paths::EVENTS, &[]);
        let mut query = Vec::new();
        if let Some(key) = key {
            query.push(("key", key.to_owned()));
        }
        query.extend(start);
        let (url, body) = self.open_stream(&path, &query).await?;
        Ok(EventStream {
            url: url.to_string(),
            body: SyncWrapper::new(body),
            parser: SseParser::default(),
        })
    }
}

impl EventStream {
    /// The next event; `None` when the node closed the stream. A `stream_error`
    /// message (the stream fell behind) is answered as its error.
    pub async fn next(&mut self) -> Result<Option<SseMessage>, ClientError> {
        loop {
            if let Some(message) = self.parser.next_message() {
                if message.event == STREAM_ERROR_EVENT {
                    return Err(stream_error(&message.data));
                }
                return Ok(Some(message));
            }
            let chunk = self
                .next_chunk()
                .await
                .map_err(|error| ClientError::UnexpectedAnswer {
                    url: self.url.clone(),
                    reason: format!("the event stream broke: {error}"),
                })?;
            match chunk {
                Some(bytes) => {
                    self.parser
                        .feed(&bytes)
                        .map_err(|reason| ClientError::UnexpectedAnswer {
                            url: self.url.clone(),
                            reason,
                        })?
                }
                None => return Ok(None),
            }
        }
    }

    /// The body's next bytes; `None` at its end. Frames other than data
    /// (trailers) are skipped.
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, TransportError> {
        let body = self.body.get_mut();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(TransportError::from_body)?;
            if let Ok(data) = frame.into_data() {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

fn stream_error(data: &str) -> ClientError {
    match serde_json::from_str::<ErrorAnswer>(data) {
        Ok(ErrorAnswer { error }) => ClientError::Rejected {
            status: error.code.status(),
            code: error.code,
            message: error.message,
            field: error.field,
        },
        Err(_) => ClientError::UnexpectedAnswer {
            url: paths::EVENTS.to_owned(),
            reason: format!("a stream error without the error body: {data}"),
        },
    }
}

/// The SSE wire format, incrementally: bytes in, whole messages out.
#[derive(Debug, Default)]
struct SseParser {
    /// Bytes of the line being received.
    line: Vec<u8>,
    /// Fields of the message being received.
    current: SseMessage,
    has_data: bool,
    ready: std::collections::VecDeque<SseMessage>,
}

impl SseParser {
    fn feed(&mut self, bytes: &[u8]) -> Result<(), String> {
        for &byte in bytes {
            if byte == b'\n' {
                let line = std::mem::take(&mut self.line);
                let line = String::from_utf8_lossy(&line);
                self.line_received(line.trim_end_matches('\r'));
            } else {
                self.line.push(byte);
                if self.line.len() > MAX_EVENT_LINE_BYTES {
                    return Err(format!("an event line passed {MAX_EVENT_LINE_BYTES} bytes"));
                }
            }
        }
        Ok(())
    }

    fn line_received(&mut self, line: &str) {
        if line.is_empty() {
            let message = std::mem::take(&mut self.current);
            if std::mem::take(&mut self.has_data) {
                self.ready.push_back(message);
            }
            return;
        }
        if line.starts_with(':') {
            return; // A comment: the node's keep-alive.
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => value.clone_into(&mut self.current.event),
            "id" => {
                // Digits only: a merged stream's cursor (`12,0,7`) is no index.
                self.current.id = value
                    .bytes()
                    .all(|byte| byte.is_ascii_digit())
                    .then(|| value.parse().ok())
                    .flatten();
                self.current.cursor = Some(value.to_owned());
            }
            "data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
    }

    fn next_message(&mut self) -> Option<SseMessage> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_at_blank_lines_across_chunks() {
        let mut parser = SseParser::default();
        parser
            .feed(b": keep-alive\n\nevent: round\nid: 7\nda")
            .unwrap();
        assert_eq!(parser.next_message(), None);
        parser
            .feed(b"ta: {\"a\":1}\r\n\r\nevent: blocked\ndata:x\ndata: y\n\n")
            .unwrap();
        let first = parser.next_message().unwrap();
        assert_eq!(
            (first.event.as_str(), first.id, first.data.as_str()),
            ("round", Some(7), "{\"a\":1}")
        );
        let second = parser.next_message().unwrap();
        assert_eq!((second.id, second.data.as_str()), (None, "x\ny"));
        assert_eq!(parser.next_message(), None);
    }

    #[test]
    fn a_merged_streams_id_is_a_cursor_and_no_index() {
        let mut parser = SseParser::default();
        parser
            .feed(b"event: round\nid: 12,0,7\ndata: {}\n\nid: 9\ndata: {}\n\n")
            .unwrap();
        let merged = parser.next_message().unwrap();
        assert_eq!(
            (merged.id, merged.cursor.as_deref()),
            (None, Some("12,0,7"))
        );
        let single = parser.next_message().unwrap();
        assert_eq!((single.id, single.cursor.as_deref()), (Some(9), Some("9")));
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut parser = SseParser::default();
        let long = vec![b'a'; MAX_EVENT_LINE_BYTES + 1];
        assert!(parser.feed(&long).is_err());
    }

    #[test]
    fn a_stream_error_becomes_its_code() {
        let data = r#"{"error":{"code":"too_far_behind","message":"m"}}"#;
        let error = stream_error(data);
        assert_eq!(
            error.code(),
            Some(permitd_core::contract::ErrorCode::TooFarBehind)
        );
    }
}
