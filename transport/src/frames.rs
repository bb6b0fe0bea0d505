//! The peer stream's wire format: HTTP requests and answers as length-prefixed
//! frames on one connection, each tagged with the call it belongs to, so many
//! calls share the connection and their answers come back in any order.
//!
//! A connection opens with [`PREFACE`]; then every frame is
//!
//! ```text
//! u32 length of the rest (big-endian), u8 kind, u64 call id,
//! kind 1, a request: str method, str path-and-query, headers, body
//! kind 2, an answer: u16 status, headers, body
//! ```
//!
//! where a `str` is a u16 length and its bytes, `headers` a u16 count of
//! (str name, str value) pairs, and the body the rest of the frame. Nothing is
//! encoded twice: a Raft body is already MessagePack, and crosses as it is.
//!
//! Every frame is at most [`MAX_FRAME_BYTES`]; a larger one, or one that does
//! not parse, ends the connection (its calls fail; the caller reconnects).
//!
//! Both ends read frames with [`read_frame`] and write them with
//! [`write_frames`], the writer task of a connection.

use std::io;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::mpsc;

/// What a client writes first: a peer stream, not HTTP. It shares no prefix
/// with an HTTP/1.1 request line (`POST /…`) longer than one byte, nor with
/// HTTP/2's preface, so a listener tells the three apart from the first bytes.
pub const PREFACE: &[u8] = b"PERMITD-FRAMES/1\r\n\r\n";

/// The largest frame either side accepts, header included. The stream
/// carries only calls whose bodies fit well within it
/// ([`crate::StreamTransport`] sends larger ones on their own connection), so
/// one large call cannot hold the heartbeats queued behind it.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;

/// Bytes of a frame before its kind: the length.
pub const LENGTH_BYTES: usize = 4;

/// Bytes the writer gathers into one `write` when several frames are queued.
const WRITE_BATCH_BYTES: usize = 64 * 1024;

/// Bytes a reader takes from the connection in one `read` ([`frame_reader`]):
/// room for an answer, a heartbeat or an append of a few entries (a few
/// hundred bytes each). One per peer-stream connection, allocated before the
/// first frame is authenticated: at a listener's 4,096 connections, 32 MiB.
const READ_BUFFER_BYTES: usize = 8 * 1024;

const REQUEST: u8 = 1;
const ANSWER: u8 = 2;

/// A call's id on its connection: the client numbers them.
pub type CallId = u64;

/// A malformed frame: the connection it came on is closed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("a frame of {0} bytes, over the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("a frame ends inside its {0}")]
    Truncated(&'static str),
    #[error("a frame of kind {0}, not the one expected here")]
    Kind(u8),
    #[error("a frame's {0} does not parse")]
    Invalid(&'static str),
}

/// A request frame, decoded.
#[derive(Debug)]
pub struct RequestFrame {
    pub id: CallId,
    pub request: http::Request<Bytes>,
}

/// An answer frame, decoded.
#[derive(Debug)]
pub struct AnswerFrame {
    pub id: CallId,
    pub answer: http::Response<Bytes>,
}

/// Encodes `request` (its URI's path and query only: the connection says
/// where it goes) as call `id`.
pub fn encode_request(id: CallId, request: &http::Request<Bytes>) -> Result<Bytes, FrameError> {
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", |target| target.as_str());
    let mut frame = start(REQUEST, id, request.body().len());
    put_str(&mut frame, request.method().as_str().as_bytes(), "method")?;
    put_str(&mut frame, target.as_bytes(), "path")?;
    put_headers(&mut frame, request.headers())?;
    frame.put_slice(request.body());
    finish(frame)
}

/// Encodes `answer` to call `id`.
pub fn encode_answer(id: CallId, answer: &http::Response<Bytes>) -> Result<Bytes, FrameError> {
    let mut frame = start(ANSWER, id, answer.body().len());
    frame.put_u16(answer.status().as_u16());
    put_headers(&mut frame, answer.headers())?;
    frame.put_slice(answer.body());
    finish(frame)
}

/// The length of the frame that `prefix` (its first [`LENGTH_BYTES`]) starts,
/// checked against the limit.
pub fn frame_length(prefix: [u8; LENGTH_BYTES]) -> Result<usize, FrameError> {
    let length = u32::from_be_bytes(prefix) as usize;
    if length > MAX_FRAME_BYTES - LENGTH_BYTES {
        return Err(FrameError::TooLarge(length + LENGTH_BYTES));
    }
    Ok(length)
}

/// Decodes a request frame's rest (what follows its length).
pub fn decode_request(mut rest: Bytes) -> Result<RequestFrame, FrameError> {
    let id = take_head(&mut rest, REQUEST)?;
    let method = Method::from_bytes(&take_str(&mut rest, "method")?)
        .map_err(|_| FrameError::Invalid("method"))?;
    let target = take_str(&mut rest, "path")?;
    let uri = http::Uri::from_maybe_shared(target).map_err(|_| FrameError::Invalid("path"))?;
    let headers = take_headers(&mut rest)?;
    let mut request = http::Request::new(rest);
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(RequestFrame { id, request })
}

/// Decodes an answer frame's rest (what follows its length).
pub fn decode_answer(mut rest: Bytes) -> Result<AnswerFrame, FrameError> {
    let id = take_head(&mut rest, ANSWER)?;
    if rest.remaining() < 2 {
        return Err(FrameError::Truncated("status"));
    }
    let status = StatusCode::from_u16(rest.get_u16()).map_err(|_| FrameError::Invalid("status"))?;
    let headers = take_headers(&mut rest)?;
    let mut answer = http::Response::new(rest);
    *answer.status_mut() = status;
    *answer.headers_mut() = headers;
    Ok(AnswerFrame { id, answer })
}

/// The read side of a stream, buffered for [`read_frame`]: one `read` takes a
/// small frame whole, with its length and whatever frames follow it. Read
/// directly, each frame cost three `read` calls on plain TCP (its length, its
/// rest, and the one that found nothing more), two of them per peer answer on
/// a leader's path to commit. A larger frame's rest is read straight into it.
pub fn frame_reader<R: AsyncRead>(read: R) -> BufReader<R> {
    BufReader::with_capacity(READ_BUFFER_BYTES, read)
}

/// Reads one frame and returns what follows its length; `None` at a clean
/// end of the stream (between frames).
pub async fn read_frame<R: AsyncRead + Unpin>(read: &mut R) -> io::Result<Option<Bytes>> {
    let mut prefix = [0u8; LENGTH_BYTES];
    match read.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error),
    }
    let length = frame_length(prefix).map_err(invalid)?;
    let mut rest = BytesMut::zeroed(length);
    read.read_exact(&mut rest).await?;
    Ok(Some(rest.freeze()))
}

/// The writer task of either end: writes queued frames, all that are queued
/// at once in one `write` (up to [`WRITE_BATCH_BYTES`]), until the queue's
/// senders are gone; then shuts the write side.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    write: W,
    mut queued: mpsc::Receiver<Bytes>,
) -> io::Result<()> {
    let mut write = BufWriter::with_capacity(WRITE_BATCH_BYTES, write);
    while let Some(frame) = queued.recv().await {
        write.write_all(&frame).await?;
        while write.buffer().len() < WRITE_BATCH_BYTES {
            match queued.try_recv() {
                Ok(frame) => write.write_all(&frame).await?,
                Err(_) => break,
            }
        }
        write.flush().await?;
    }
    write.shutdown().await
}

fn invalid(error: FrameError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

fn start(kind: u8, id: CallId, body: usize) -> BytesMut {
    let mut frame = BytesMut::with_capacity(LENGTH_BYTES + 1 + 8 + 256 + body);
    frame.put_u32(0); // the length, once known
    frame.put_u8(kind);
    frame.put_u64(id);
    frame
}

fn finish(mut frame: BytesMut) -> Result<Bytes, FrameError> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(frame.len()));
    }
    let rest = u32::try_from(frame.len() - LENGTH_BYTES).expect("within the limit");
    frame[..LENGTH_BYTES].copy_from_slice(&rest.to_be_bytes());
    Ok(frame.freeze())
}

fn put_str(frame: &mut BytesMut, text: &[u8], what: &'static str) -> Result<(), FrameError> {
    let length = u16::try_from(text.len()).map_err(|_| FrameError::Invalid(what))?;
    frame.put_u16(length);
    frame.put_slice(text);
    Ok(())
}

fn put_headers(frame: &mut BytesMut, headers: &HeaderMap) -> Result<(), FrameError> {
    let count = u16::try_from(headers.len()).map_err(|_| FrameError::Invalid("headers"))?;
    frame.put_u16(count);
    for (name, value) in headers {
        put_str(frame, name.as_str().as_bytes(), "header name")?;
        put_str(frame, value.as_bytes(), "header value")?;
    }
    Ok(())
}

fn take_head(rest: &mut Bytes, kind: u8) -> Result<CallId, FrameError> {
    if rest.remaining() < 1 + 8 {
        return Err(FrameError::Truncated("head"));
    }
    match rest.get_u8() {
        found if found == kind => Ok(rest.get_u64()),
        other => Err(FrameError::Kind(other)),
    }
}

fn take_str(rest: &mut Bytes, what: &'static str) -> Result<Bytes, FrameError> {
    if rest.remaining() < 2 {
        return Err(FrameError::Truncated(what));
    }
    let length = rest.get_u16() as usize;
    if rest.remaining() < length {
        return Err(FrameError::Truncated(what));
    }
    Ok(rest.split_to(length))
}

fn take_headers(rest: &mut Bytes) -> Result<HeaderMap, FrameError> {
    if rest.remaining() < 2 {
        return Err(FrameError::Truncated("headers"));
    }
    let count = rest.get_u16() as usize;
    let mut headers = HeaderMap::with_capacity(count.min(64));
    for _ in 0..count {
        let name = take_str(rest, "header name")?;
        let value = take_str(rest, "header value")?;
        let name = HeaderName::from_bytes(&name).map_err(|_| FrameError::Invalid("header name"))?;
        let value = HeaderValue::from_maybe_shared(value)
            .map_err(|_| FrameError::Invalid("header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rest_of(frame: &Bytes) -> Bytes {
        let length = frame_length(frame[..LENGTH_BYTES].try_into().unwrap()).unwrap();
        assert_eq!(length, frame.len() - LENGTH_BYTES);
        frame.slice(LENGTH_BYTES..)
    }

    #[test]
    fn a_request_crosses_with_its_method_target_headers_and_body() {
        let request = http::Request::post("http://10.0.0.2:7001/raft/append?shard=3")
            .header("authorization", "Bearer s3cret")
            .header("x-permitd-sender", "2")
            .header("x-permitd-sender", "twice")
            .body(Bytes::from_static(b"\x81\xa1a\x01"))
            .unwrap();
        let frame = encode_request(7, &request).unwrap();
        let decoded = decode_request(rest_of(&frame)).unwrap();
        assert_eq!(decoded.id, 7);
        let got = decoded.request;
        assert_eq!(got.method(), Method::POST);
        assert_eq!(got.uri(), "/raft/append?shard=3");
        assert_eq!(got.headers(), request.headers());
        assert_eq!(got.body(), request.body());
    }

    #[test]
    fn an_answer_crosses_with_its_status_headers_and_body() {
        let answer = http::Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("content-type", "application/json")
            .body(Bytes::from_static(b"{}"))
            .unwrap();
        let frame = encode_answer(u64::MAX, &answer).unwrap();
        let decoded = decode_answer(rest_of(&frame)).unwrap();
        assert_eq!(decoded.id, u64::MAX);
        assert_eq!(decoded.answer.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(decoded.answer.headers(), answer.headers());
        assert_eq!(decoded.answer.body(), answer.body());
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_on_both_sides() {
        let body = Bytes::from(vec![0u8; MAX_FRAME_BYTES]);
        let request = http::Request::post("/raft/append").body(body).unwrap();
        assert!(matches!(
            encode_request(1, &request),
            Err(FrameError::TooLarge(_))
        ));
        let announced = u32::try_from(MAX_FRAME_BYTES).unwrap().to_be_bytes();
        assert!(matches!(
            frame_length(announced),
            Err(FrameError::TooLarge(_))
        ));
    }

    #[test]
    fn every_cut_of_a_frame_and_a_frame_of_the_other_kind_are_refused() {
        let request = http::Request::post("/raft/vote")
            .header("authorization", "Bearer x")
            .body(Bytes::from_static(b"body"))
            .unwrap();
        let rest = rest_of(&encode_request(1, &request).unwrap());
        // Cut before the body ends: a shorter body parses, so cut only the head.
        let head = rest.len() - b"body".len();
        for cut in 0..head {
            assert!(decode_request(rest.slice(..cut)).is_err(), "cut at {cut}");
        }
        assert!(matches!(decode_answer(rest), Err(FrameError::Kind(1))));
    }

    /// Frames that arrive together, cut anywhere, or larger than the
    /// reader's buffer come out of [`frame_reader`] whole and in order.
    #[tokio::test]
    async fn the_buffered_reader_returns_every_frame_however_the_bytes_arrive() {
        let bodies = [
            vec![1u8; 10],
            vec![2u8; READ_BUFFER_BYTES * 3 + 7],
            vec![],
            vec![3u8; 300],
        ];
        let mut wire = Vec::new();
        for (id, body) in bodies.iter().enumerate() {
            let answer = http::Response::new(Bytes::from(body.clone()));
            wire.extend_from_slice(&encode_answer(id as CallId, &answer).unwrap());
        }
        let first_frame =
            LENGTH_BYTES + frame_length(wire[..LENGTH_BYTES].try_into().unwrap()).unwrap();
        let (mut write, read) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            // The first frame and the head of the second in one write, the
            // rest in odd cuts.
            let (first, rest) = wire.split_at(first_frame + 10);
            write.write_all(first).await.unwrap();
            for cut in rest.chunks(777) {
                write.write_all(cut).await.unwrap();
            }
        });
        let mut read = frame_reader(read);
        for (id, body) in bodies.iter().enumerate() {
            let rest = read_frame(&mut read).await.unwrap().expect("a frame");
            let answer = decode_answer(rest).unwrap();
            assert_eq!(answer.id, id as CallId);
            assert_eq!(answer.answer.body().as_ref(), body.as_slice());
        }
        writer.await.unwrap();
        assert!(
            read_frame(&mut read).await.unwrap().is_none(),
            "a clean end"
        );
    }

    #[test]
    fn the_preface_shares_at_most_one_byte_with_an_http_request_line() {
        for method in ["POST ", "PUT ", "PATCH ", "PRI * HTTP/2.0"] {
            let shared = PREFACE
                .iter()
                .zip(method.as_bytes())
                .take_while(|(a, b)| a == b)
                .count();
            assert!(shared <= 1, "{method}");
        }
    }
}
