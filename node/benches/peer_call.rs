//! What one Raft call between two nodes costs in CPU, both ends together:
//! through the pooled HTTP/1.1 client (`ReqwestTransport`, how every call went
//! before peer streams, and how calls over 256 KiB still go) and through the
//! peer stream (`StreamTransport` over `PeerConnector`, served by the Raft
//! listener's `Connections` as in production).
//!
//! Each side has its own one-worker runtime, as a leader's and a follower's
//! Raft runtimes are; the listener serves a router whose `/raft/append`
//! answers a 100-byte body to a 700-byte one (the size of a round entry's
//! append and its answer in the 1-client bench row). Calls are sequential,
//! or `concurrent` at a time (as shards' appends to one peer are).
//!
//! `cpu/*` reports the process's CPU time per call (`CLOCK_PROCESS_CPUTIME_ID`:
//! both runtimes, the kernel's loopback TCP included), `wall/*` the time per
//! call. No TLS: the cost of the protocol, not of the cipher.
//!
//! `cargo bench -p permitd --bench peer_call -- --warm-up-time 1 --measurement-time 3`

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use permitd_node::config::EdgeLimits;
use permitd_node::edge::serve::{serve, Takes};
use permitd_node::raft::peer_connector::PeerConnector;
use permitd_node::shutdown::Shutdown;
use permitd_transport::{ReqwestTransport, StreamTransport, Transport};
use rustix::time::{clock_gettime, ClockId};

const REQUEST_BYTES: usize = 700;
const ANSWER_BYTES: usize = 100;

fn one_worker() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The follower: a Raft listener on loopback, on its own runtime.
fn listener(runtime: &tokio::runtime::Runtime) -> String {
    let router = Router::new().route(
        "/raft/append",
        post(|_body: Bytes| async { Bytes::from(vec![7u8; ANSWER_BYTES]) }),
    );
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let served = (router, Takes::HttpAndPeerStreams);
        tokio::spawn(serve(
            listener,
            served,
            EdgeLimits::default(),
            None,
            Shutdown::default(),
        ));
        addr
    })
}

fn transports(addr_timeout: Duration) -> [(&'static str, Transport); 2] {
    let pooled = reqwest::Client::builder()
        .tcp_nodelay(true)
        .http1_only()
        .build()
        .unwrap();
    let pooled: Transport = Arc::new(ReqwestTransport::new(pooled));
    let connector = Arc::new(PeerConnector::new(None, None, addr_timeout));
    let stream: Transport = Arc::new(StreamTransport::new(connector, pooled.clone()));
    [("http1_pooled", pooled), ("peer_stream", stream)]
}

fn append(addr: &str) -> http::Request<Bytes> {
    http::Request::post(format!("http://{addr}/raft/append?shard=1"))
        .header("authorization", "Bearer 0123456789abcdef0123456789abcdef")
        .header("content-type", "application/msgpack")
        .body(Bytes::from(vec![1u8; REQUEST_BYTES]))
        .unwrap()
}

/// `iters` calls, `concurrent` at a time.
async fn calls(transport: &Transport, addr: &str, iters: u64, concurrent: u64) {
    let mut left = iters;
    while left > 0 {
        let now = left.min(concurrent);
        let sends = (0..now).map(|_| transport.send(append(addr)));
        for answer in futures_util::future::join_all(sends).await {
            let answer = answer.expect("answered");
            permitd_transport::collect(answer.into_body())
                .await
                .unwrap();
        }
        left -= now;
    }
}

fn cpu_now() -> Duration {
    let time = clock_gettime(ClockId::ProcessCPUTime);
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}

fn peer_call(c: &mut Criterion) {
    let server = one_worker();
    let client = one_worker();
    let addr = listener(&server);
    for (name, transport) in transports(Duration::from_secs(1)) {
        for concurrent in [1u64, 8] {
            // Warm: the connection (or pool) is open before timing.
            client.block_on(calls(&transport, &addr, 16, concurrent));
            let mut group = c.benchmark_group(format!("peer_call_x{concurrent}"));
            group.bench_function(format!("cpu/{name}"), |b| {
                b.iter_custom(|iters| {
                    let start = cpu_now();
                    client.block_on(calls(&transport, &addr, iters, concurrent));
                    cpu_now() - start
                })
            });
            group.bench_function(format!("wall/{name}"), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    client.block_on(calls(&transport, &addr, iters, concurrent));
                    start.elapsed()
                })
            });
            group.finish();
        }
    }
}

criterion_group!(benches, peer_call);
criterion_main!(benches);
