//! Clients that open connections and stall are cut off, and do not starve the
//! others (the finding "300 connections that send half a request header and stop
//! are never closed"), over HTTP/1.1, HTTP/2 and TLS.

use std::time::{Duration, Instant};

use permitd_tests::{granted, request, Cluster, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The finding's number of stalled connections.
const HALF_HEADERS: usize = 300;
/// Connections that send nothing at all.
const SILENT: usize = 50;
/// HTTP/2 connections that stall: half a preface, or a whole one and its
/// SETTINGS and then no request (closed after GOAWAY goes unanswered).
const HTTP2_STALLED: usize = 20;
/// The HTTP/2 connection preface and an empty SETTINGS frame.
const HTTP2_OPENING: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
/// The node's header-read timeout in this test, in ms (short, to keep it quick).
const HEADER_READ_TIMEOUT_MS: u64 = 1_000;
/// How long past the timeout a connection may stay open: the machine is shared.
const CLOSE_SLACK: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_are_closed_and_others_are_served_meanwhile() {
    let settings = Settings {
        extra_toml: format!("[limits]\nheader_read_timeout_ms = {HEADER_READ_TIMEOUT_MS}\n"),
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let leader = cluster.wait_for_leader().await;
    let addr = cluster.node(leader).api_addr.clone();
    let mut stalled = Vec::with_capacity(HALF_HEADERS + SILENT);
    for _ in 0..HALF_HEADERS {
        let mut stream = TcpStream::connect(&addr).await.expect("connect");
        let half = b"POST /v1/semaphores/k HTTP/1.1\r\nHost: permitd\r\nContent-Le";
        stream.write_all(half).await.expect("write half a header");
        stalled.push(stream);
    }
    for _ in 0..SILENT {
        stalled.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    for index in 0..HTTP2_STALLED {
        let mut stream = TcpStream::connect(&addr).await.expect("connect");
        let sent = if index % 2 == 0 {
            16
        } else {
            HTTP2_OPENING.len()
        };
        stream
            .write_all(&HTTP2_OPENING[..sent])
            .await
            .expect("write");
        stalled.push(stream);
    }
    let opened = Instant::now();

    let answer = cluster
        .post(leader, "/v1/semaphores/k", &request("c1", &[("g", 5, 1)]))
        .await;
    assert_eq!(
        answer.status, 200,
        "served while others stall: {}",
        answer.body
    );
    assert_eq!(granted(&answer.body), 5);

    let deadline = Duration::from_millis(HEADER_READ_TIMEOUT_MS) + CLOSE_SLACK;
    for (index, stream) in stalled.iter_mut().enumerate() {
        let left = deadline.saturating_sub(opened.elapsed());
        assert!(
            closed_within(stream, left).await,
            "stalled connection {index} still open after {:?}",
            opened.elapsed()
        );
    }
}

/// The same over TLS: a client that opens a connection and never finishes (or
/// never starts) its handshake is dropped after the header-read timeout, which
/// bounds the handshake too, while others are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_tls_handshakes_are_closed_and_others_are_served_meanwhile() {
    let settings = Settings {
        extra_toml: format!("[limits]\nheader_read_timeout_ms = {HEADER_READ_TIMEOUT_MS}\n"),
        tls: true,
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let leader = cluster.wait_for_leader().await;
    let addr = cluster.node(leader).api_addr.clone();
    let mut stalled = Vec::with_capacity(SILENT * 2);
    for _ in 0..SILENT {
        stalled.push(TcpStream::connect(&addr).await.expect("connect"));
        let mut stream = TcpStream::connect(&addr).await.expect("connect");
        // The first bytes of a TLS record header (handshake, TLS 1.0 record
        // version), then nothing.
        stream.write_all(&[0x16, 0x03, 0x01]).await.expect("write");
        stalled.push(stream);
    }
    let opened = Instant::now();

    let answer = cluster
        .post(leader, "/v1/semaphores/k", &request("c1", &[("g", 5, 1)]))
        .await;
    assert_eq!(answer.status, 200, "served over TLS: {}", answer.body);

    let deadline = Duration::from_millis(HEADER_READ_TIMEOUT_MS) + CLOSE_SLACK;
    for (index, stream) in stalled.iter_mut().enumerate() {
        let left = deadline.saturating_sub(opened.elapsed());
        assert!(
            closed_within(stream, left).await,
            "stalled TLS connection {index} still open after {:?}",
            opened.elapsed()
        );
    }
}

/// Whether the server closes `stream` within `wait` (anything it writes first,
/// such as a 408, is read and ignored).
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buffer = [0u8; 1024];
    let read_to_end = async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    tokio::time::timeout(wait, read_to_end).await.is_ok()
}

/// Connections the node serves at once in the limit test.
const MAX_CONNECTIONS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_limit_a_connection_waits_for_a_free_one() {
    let settings = Settings {
        nodes: 1,
        extra_toml: format!(
            "[limits]\nheader_read_timeout_ms = {HEADER_READ_TIMEOUT_MS}\n\
             max_connections = {MAX_CONNECTIONS}\n"
        ),
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let node = cluster.wait_for_leader().await;
    let addr = cluster.node(node).api_addr.clone();
    let opened = Instant::now();
    let mut silent = Vec::with_capacity(MAX_CONNECTIONS);
    for _ in 0..MAX_CONNECTIONS {
        silent.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    // Queued behind the silent ones, which hold every permit until their header
    // timeout closes them: it cannot be answered sooner.
    let mut next = TcpStream::connect(&addr).await.expect("connect");
    let health = b"GET /healthz HTTP/1.1\r\nHost: permitd\r\nConnection: close\r\n\r\n";
    next.write_all(health).await.expect("write");
    let mut answer = Vec::new();
    let wait = Duration::from_millis(HEADER_READ_TIMEOUT_MS) + CLOSE_SLACK;
    tokio::time::timeout(wait, next.read_to_end(&mut answer))
        .await
        .expect("answered once a connection was freed")
        .expect("read");
    let waited = opened.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        waited >= Duration::from_millis(HEADER_READ_TIMEOUT_MS),
        "served after {waited:?}, before any silent connection was closed"
    );
}
