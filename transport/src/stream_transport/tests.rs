//! The stream transport against a frames server made of the same pieces a
//! node's is (`read_frame`, `write_frames` and the codec), on real sockets.

use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::collect;
use crate::frames::{read_frame, write_frames};

/// Plain TCP.
#[derive(Debug)]
struct Tcp;

impl Connector for Tcp {
    fn connect(&self, peer: &Authority) -> Connecting {
        let peer = peer.to_string();
        Box::pin(async move {
            let stream = TcpStream::connect(peer).await?;
            Ok(Box::new(stream) as Box<dyn PeerIo>)
        })
    }
}

/// Counts the calls it is given and answers them 200 "larger".
#[derive(Debug, Default)]
struct Larger(AtomicUsize);

impl HttpTransport for Larger {
    fn send(&self, _request: http::Request<Bytes>) -> Sending {
        self.0.fetch_add(1, Ordering::Relaxed);
        Box::pin(async {
            Ok(http::Response::new(boxed(http_body_util::Full::new(
                Bytes::from("larger"),
            ))))
        })
    }
}

/// A frames server: each call answered with its body reversed, after
/// the number of milliseconds its `delay` header names; a body `close`
/// makes it drop the connection. Returns its address and a count of the
/// connections it accepted.
async fn server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(serve_one(socket));
        }
    });
    (addr, accepted)
}

async fn serve_one(socket: TcpStream) {
    let (mut read, write) = socket.into_split();
    let mut preface = [0u8; PREFACE.len()];
    read.read_exact(&mut preface).await.unwrap();
    assert_eq!(preface, PREFACE);
    let (answers, queued) = mpsc::channel(16);
    let writer = tokio::spawn(write_frames(write, queued));
    while let Ok(Some(rest)) = read_frame(&mut read).await {
        let frame = frames::decode_request(rest).unwrap();
        if frame.request.body() == "close" {
            // Both halves dropped: the socket closes with calls unanswered.
            writer.abort();
            return;
        }
        let delay: u64 = frame
            .request
            .headers()
            .get("delay")
            .map_or(0, |value| value.to_str().unwrap().parse().unwrap());
        let answers = answers.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let mut body = frame.request.body().to_vec();
            body.reverse();
            let answer = http::Response::new(Bytes::from(body));
            let _ = answers
                .send(frames::encode_answer(frame.id, &answer).unwrap())
                .await;
        });
    }
}

fn transport() -> (StreamTransport, Arc<Larger>) {
    let larger = Arc::new(Larger::default());
    (StreamTransport::new(Arc::new(Tcp), larger.clone()), larger)
}

fn call(addr: &str, body: &str, delay_ms: u64) -> http::Request<Bytes> {
    http::Request::post(format!("http://{addr}/raft/append?shard=1"))
        .header("delay", delay_ms)
        .body(Bytes::from(body.to_owned()))
        .unwrap()
}

async fn body_of(answer: http::Response<crate::Body>) -> String {
    String::from_utf8(collect(answer.into_body()).await.unwrap().to_vec()).unwrap()
}

#[tokio::test]
async fn calls_share_one_connection_and_each_gets_its_own_answer_in_any_order() {
    let (addr, accepted) = server().await;
    let (transport, larger) = transport();
    // The first call is answered last.
    let calls = (0..20u64).map(|index| {
        let delay = if index == 0 { 100 } else { index };
        transport.send(call(&addr, &format!("call {index}"), delay))
    });
    let answers = futures_util::future::join_all(calls).await;
    for (index, answer) in answers.into_iter().enumerate() {
        let answer = answer.unwrap();
        assert_eq!(answer.status(), http::StatusCode::OK);
        let expected: String = format!("call {index}").chars().rev().collect();
        assert_eq!(body_of(answer).await, expected);
    }
    assert_eq!(accepted.load(Ordering::Relaxed), 1);
    assert_eq!(larger.0.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_body_over_the_stream_limit_goes_through_the_larger_transport() {
    let (addr, accepted) = server().await;
    let (transport, larger) = transport();
    let large = "x".repeat(STREAM_BODY_MAX_BYTES + 1);
    let answer = transport.send(call(&addr, &large, 0)).await.unwrap();
    assert_eq!(body_of(answer).await, "larger");
    assert_eq!(larger.0.load(Ordering::Relaxed), 1);
    assert_eq!(accepted.load(Ordering::Relaxed), 0);
}

fn with_deadline(mut request: http::Request<Bytes>, ms: u64) -> http::Request<Bytes> {
    request
        .extensions_mut()
        .insert(Deadline(Duration::from_millis(ms)));
    request
}

#[tokio::test]
async fn a_call_past_its_deadline_while_others_are_answered_keeps_the_connection() {
    let (addr, accepted) = server().await;
    let (transport, _) = transport();
    let slow = transport.send(with_deadline(call(&addr, "slow", 1_000), 200));
    let quick = transport.send(call(&addr, "quick", 10));
    let (slow, quick) = tokio::join!(slow, quick);
    assert!(slow.unwrap_err().is_timeout());
    assert_eq!(body_of(quick.unwrap()).await, "kciuq");
    let answer = transport.send(call(&addr, "next", 0)).await.unwrap();
    assert_eq!(body_of(answer).await, "txen");
    assert_eq!(accepted.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_call_past_its_deadline_with_nothing_answered_meanwhile_closes_the_connection() {
    let (addr, accepted) = server().await;
    let (transport, _) = transport();
    let error = transport
        .send(with_deadline(call(&addr, "slow", 1_000), 50))
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error}");
    let answer = transport.send(call(&addr, "next", 0)).await.unwrap();
    assert_eq!(body_of(answer).await, "txen");
    assert_eq!(accepted.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn a_closed_connection_fails_its_calls_and_the_next_call_connects_again() {
    let (addr, accepted) = server().await;
    let (transport, _) = transport();
    let waiting = transport.send(call(&addr, "waits", 2_000));
    let closing = transport.send(call(&addr, "close", 0));
    let (waiting, closing) = tokio::join!(waiting, closing);
    for failed in [waiting.unwrap_err(), closing.unwrap_err()] {
        assert_eq!(failed.kind, TransportErrorKind::Exchange, "{failed}");
    }
    let answer = transport.send(call(&addr, "again", 0)).await.unwrap();
    assert_eq!(body_of(answer).await, "niaga");
    assert_eq!(accepted.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn nothing_listening_is_a_refused_connect() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let (transport, _) = transport();
    let error = transport.send(call(&addr, "anyone?", 0)).await.unwrap_err();
    assert!(error.is_refused(), "{error}");
}
