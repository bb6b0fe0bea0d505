//! One connection per peer for every call: the transport of Raft RPCs.
//!
//! A pooled HTTP/1.1 client opens a connection for every call in flight to a
//! peer at once: at S shards under load, about S connections per peer pair,
//! each call with its own request line, header parse, pool checkout and
//! connection task. [`StreamTransport`] keeps one connection per peer and
//! sends every call on it as a frame ([`crate::frames`]): a writer task writes
//! what the callers queued, several frames per `write` when several shards
//! send in the same turn, and a reader task hands each answer to its caller by
//! call id, in whatever order the peer answers.
//!
//! - A call whose body passes [`STREAM_BODY_MAX_BYTES`] (a large catch-up
//!   append, a snapshot chunk) goes through the `larger` transport instead, on
//!   a connection of its own, so it never holds the heartbeats and appends
//!   queued behind it.
//! - A broken connection (a read or write error, the peer closing it, a frame
//!   that does not parse) fails every call on it with
//!   [`TransportErrorKind::Exchange`] (each may have been delivered); the next
//!   call connects again. A failed connect is [`TransportErrorKind::Connect`]
//!   with the OS error inside, so a refused one reads as refused.
//! - A [`Deadline`] bounds the whole call, connecting included; a call that
//!   passes it is forgotten, and its answer, if it comes, is dropped. If no
//!   answer to any call came while it waited, the connection is closed too:
//!   a cut link looks like that, and a new connection is how a pooled client
//!   would have recovered (a timed-out call's connection is not reused).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::uri::Authority;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::frames::{self, read_frame, write_frames, CallId, PREFACE};
use crate::{
    boxed, Deadline, HttpTransport, Sending, Transport, TransportError, TransportErrorKind,
};

/// Bodies up to this size go on the peer's stream; larger ones through the
/// `larger` transport. A Raft append of a few dozen round entries is well
/// under it; at loopback speeds a frame of this size holds the stream for
/// well under a millisecond.
pub const STREAM_BODY_MAX_BYTES: usize = 256 * 1024;

/// Frames queued for one connection's writer before a caller waits: a bound
/// on what a stalled peer makes this node hold.
const QUEUED_FRAMES: usize = 1024;

/// A connection's byte stream, TLS included where the connector speaks it.
pub trait PeerIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> PeerIo for T {}

/// What [`Connector::connect`] returns.
pub type Connecting = Pin<Box<dyn Future<Output = io::Result<Box<dyn PeerIo>>> + Send>>;

/// Opens connections to peers: TCP and TLS in production, the simulator's
/// network in a simulation. Bounds its own connect time.
pub trait Connector: Send + Sync + std::fmt::Debug + 'static {
    fn connect(&self, peer: &Authority) -> Connecting;
}

/// Every call to a peer on one connection (see the module docs).
#[derive(Debug)]
pub struct StreamTransport {
    connector: Arc<dyn Connector>,
    larger: Transport,
    /// One slot per peer address ever called: as many as the cluster's
    /// members (a node calls nothing else through it).
    peers: Mutex<HashMap<Authority, Arc<PeerSlot>>>,
}

impl StreamTransport {
    /// Connects through `connector`; bodies over [`STREAM_BODY_MAX_BYTES`]
    /// go through `larger`.
    pub fn new(connector: Arc<dyn Connector>, larger: Transport) -> Self {
        Self {
            connector,
            larger,
            peers: Mutex::default(),
        }
    }

    fn slot(&self, peer: &Authority) -> Arc<PeerSlot> {
        let mut peers = self.peers.lock().expect("peers lock");
        peers.entry(peer.clone()).or_default().clone()
    }
}

impl HttpTransport for StreamTransport {
    fn send(&self, request: http::Request<Bytes>) -> Sending {
        if request.body().len() > STREAM_BODY_MAX_BYTES {
            return self.larger.send(request);
        }
        let Some(peer) = request.uri().authority().cloned() else {
            let error = TransportError::new(TransportErrorKind::Request, "no peer in the URI");
            return Box::pin(async move { Err(error) });
        };
        let slot = self.slot(&peer);
        let connector = self.connector.clone();
        Box::pin(async move {
            let deadline = request.extensions().get::<Deadline>().copied();
            let until = deadline.map(|Deadline(timeout)| tokio::time::Instant::now() + timeout);
            let stream = within(until, slot.stream(&*connector, &peer)).await??;
            let heard = stream.frames_read.load(Ordering::Acquire);
            let answer = match within(until, stream.call(&request)).await {
                Ok(answer) => answer?,
                Err(timeout) => {
                    // Nothing at all came back while the call waited: the
                    // connection, not the call, is what is stuck (a cut the
                    // kernel has not noticed yet). The next call connects again.
                    if stream.frames_read.load(Ordering::Acquire) == heard {
                        stream.close("no answer to any call within a call's deadline");
                    }
                    return Err(timeout);
                }
            };
            Ok(answer.map(|body| boxed(http_body_util::Full::new(body))))
        })
    }
}

/// `work`, failing with [`TransportErrorKind::Timeout`] once `until` passes.
async fn within<T>(
    until: Option<tokio::time::Instant>,
    work: impl Future<Output = T>,
) -> Result<T, TransportError> {
    match until {
        Some(at) => tokio::time::timeout_at(at, work)
            .await
            .map_err(|elapsed| TransportError::new(TransportErrorKind::Timeout, elapsed)),
        None => Ok(work.await),
    }
}

/// A peer's current connection, if one is open.
#[derive(Debug, Default)]
struct PeerSlot {
    current: tokio::sync::Mutex<Option<Arc<Stream>>>,
}

impl PeerSlot {
    /// The open connection, or a new one (callers that arrive while it is
    /// being made wait for it rather than make their own).
    async fn stream(
        &self,
        connector: &dyn Connector,
        peer: &Authority,
    ) -> Result<Arc<Stream>, TransportError> {
        let mut current = self.current.lock().await;
        if let Some(stream) = current.as_ref().filter(|stream| !stream.is_closed()) {
            return Ok(stream.clone());
        }
        let connect_error =
            |error: io::Error| TransportError::new(TransportErrorKind::Connect, error);
        let mut io = connector.connect(peer).await.map_err(connect_error)?;
        io.write_all(PREFACE).await.map_err(connect_error)?;
        let stream = Stream::start(io, peer.clone());
        tracing::debug!(%peer, "peer stream opened");
        *current = Some(stream.clone());
        Ok(stream)
    }
}

type Answer = Result<http::Response<Bytes>, TransportError>;

/// One open connection: its writer's queue and the calls awaiting answers.
#[derive(Debug)]
struct Stream {
    peer: Authority,
    writes: mpsc::Sender<Bytes>,
    /// Ordered, so a broken connection fails its calls in the order they
    /// were made (the simulator replays a run only if wake-ups are ordered).
    calls: Mutex<BTreeMap<CallId, oneshot::Sender<Answer>>>,
    next_id: AtomicU64,
    /// Answers read so far: a call that times out with none read meanwhile
    /// closes the connection.
    frames_read: AtomicU64,
    closed: AtomicBool,
    /// Wakes the reader when the writer found the connection broken.
    shut: Notify,
}

impl Stream {
    /// Starts the connection's writer and reader tasks.
    fn start(io: Box<dyn PeerIo>, peer: Authority) -> Arc<Self> {
        let (read, write) = tokio::io::split(io);
        let (writes, queued) = mpsc::channel(QUEUED_FRAMES);
        let stream = Arc::new(Self {
            peer,
            writes,
            calls: Mutex::default(),
            next_id: AtomicU64::new(1),
            frames_read: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            shut: Notify::new(),
        });
        let writer = Arc::downgrade(&stream);
        tokio::spawn(async move {
            if let Err(error) = write_frames(write, queued).await {
                if let Some(stream) = writer.upgrade() {
                    stream.close(&format!("writing to the peer failed: {error}"));
                }
            }
        });
        tokio::spawn(read_answers(stream.clone(), frames::frame_reader(read)));
        stream
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Sends `request` and waits for its answer. Dropped early (a deadline),
    /// the call is forgotten.
    async fn call(self: &Arc<Self>, request: &http::Request<Bytes>) -> Answer {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = frames::encode_request(id, request)
            .map_err(|error| TransportError::new(TransportErrorKind::Request, error))?;
        let (answered, answer) = oneshot::channel();
        self.calls.lock().expect("calls lock").insert(id, answered);
        let pending = Pending { stream: self, id };
        if self.is_closed() || self.writes.send(frame).await.is_err() {
            return Err(closed("the peer stream closed before the call was sent"));
        }
        let answer = answer
            .await
            .unwrap_or_else(|_| Err(closed("the peer stream closed")));
        drop(pending);
        answer
    }

    /// Marks the connection broken and fails every call on it.
    fn close(&self, why: &str) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::info!(peer = %self.peer, reason = why, "peer stream closed");
        self.shut.notify_one();
        let calls = std::mem::take(&mut *self.calls.lock().expect("calls lock"));
        for (_, answered) in calls {
            let _ = answered.send(Err(closed(why)));
        }
    }

    fn answer(&self, id: CallId, answer: http::Response<Bytes>) {
        self.frames_read.fetch_add(1, Ordering::AcqRel);
        let waiting = self.calls.lock().expect("calls lock").remove(&id);
        if let Some(answered) = waiting {
            let _ = answered.send(Ok(answer));
        }
    }
}

/// A call awaiting its answer: forgotten when dropped.
struct Pending<'a> {
    stream: &'a Stream,
    id: CallId,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.stream
            .calls
            .lock()
            .expect("calls lock")
            .remove(&self.id);
    }
}

fn closed(why: &str) -> TransportError {
    TransportError::new(TransportErrorKind::Exchange, why.to_owned())
}

/// The reader task: hands each answer to its call until the connection
/// breaks or the writer found it broken.
async fn read_answers<R: AsyncRead + Unpin>(stream: Arc<Stream>, mut read: R) {
    let why = loop {
        let frame = tokio::select! {
            frame = read_frame(&mut read) => frame,
            () = stream.shut.notified() => break "the peer stream closed".to_owned(),
        };
        match frame.map(|rest| rest.map(frames::decode_answer)) {
            Ok(Some(Ok(answer))) => stream.answer(answer.id, answer.answer),
            Ok(Some(Err(error))) => break format!("an answer frame: {error}"),
            Ok(None) => break "the peer closed the stream".to_owned(),
            Err(error) => break format!("reading from the peer failed: {error}"),
        }
    };
    stream.close(&why);
}

#[cfg(test)]
mod tests;
