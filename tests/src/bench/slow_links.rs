//! Peer links with a network's one-way delay, for the bench: a loopback TCP
//! proxy in front of each node's Raft listener that holds every byte for a
//! fixed time in each direction before passing it on.
//!
//! Loopback answers in ~20 µs; nodes on a LAN see 50–250 µs each way, in
//! other zones ~0.5 ms. Settings that trade latency for fewer entries (`[limits]
//! entries_in_flight`) can only be judged with that delay in the path, and this
//! kernel has no `netem` qdisc to add it. `PERMITD_BENCH_LINK_DELAY_US=250`
//! puts these proxies in front of every bench cluster's nodes (each node
//! advertises its proxy as its Raft address, so every call *to* it, and the
//! answer, crosses one).
//!
//! Each direction of a connection is a reader thread and a writer thread: the
//! reader stamps each chunk with when it may leave, the writer sleeps until
//! then (`std::thread::sleep`: tokio's timer ticks in whole milliseconds, too
//! coarse for a LAN's delay). Order and bytes are kept; a chunk leaves no
//! sooner than the delay, and later only by the sleep's overshoot (~60 µs).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Chunks in flight on one direction of one link before its reader waits: a
/// bound on what a slow writer makes the proxy hold (× [`CHUNK_BYTES`]).
const CHUNKS_IN_FLIGHT: usize = 1024;
/// Largest read at once.
const CHUNK_BYTES: usize = 64 * 1024;

/// The one-way delay `PERMITD_BENCH_LINK_DELAY_US` asks for, if any.
pub fn delay_from_env() -> Option<Duration> {
    let micros: u64 = std::env::var("PERMITD_BENCH_LINK_DELAY_US")
        .ok()?
        .parse()
        .ok()?;
    (micros > 0).then(|| Duration::from_micros(micros))
}

/// The proxies of one cluster; they stop accepting when dropped (open links
/// end when their ends close).
#[derive(Debug)]
pub struct SlowLinks {
    delay: Duration,
    fronts: Vec<Front>,
}

#[derive(Debug)]
struct Front {
    addr: String,
    stop: Arc<AtomicBool>,
}

impl SlowLinks {
    pub fn new(delay: Duration) -> Self {
        Self {
            delay,
            fronts: Vec::new(),
        }
    }

    /// Starts a proxy that forwards to `target` with the delay each way and
    /// returns its address.
    pub fn front(&mut self, target: &str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("slow link port");
        let addr = listener
            .local_addr()
            .expect("slow link address")
            .to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let (delay, target, stopped) = (self.delay, target.to_owned(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                // A node that is down: the caller sees its connection close.
                let Ok(upstream) = TcpStream::connect(&target) else {
                    continue;
                };
                let _ = link(client, upstream, delay);
            }
        });
        self.fronts.push(Front {
            addr: addr.clone(),
            stop,
        });
        addr
    }
}

impl Drop for SlowLinks {
    fn drop(&mut self) {
        for front in &self.fronts {
            front.stop.store(true, Ordering::Release);
            // Wakes the accepting thread so it sees the flag.
            let _ = TcpStream::connect(&front.addr);
        }
    }
}

/// Joins `client` and `upstream`, each direction delayed.
fn link(client: TcpStream, upstream: TcpStream, delay: Duration) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    upstream.set_nodelay(true)?;
    let (client_in, upstream_in) = (client.try_clone()?, upstream.try_clone()?);
    one_way(client_in, upstream, delay);
    one_way(upstream_in, client, delay);
    Ok(())
}

/// Copies `from` to `to`, each chunk `delay` after it was read; shuts `to`'s
/// write side when `from` ends.
fn one_way(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (chunks, queued) = mpsc::sync_channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT);
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; CHUNK_BYTES];
        while let Ok(n @ 1..) = from.read(&mut buffer) {
            if chunks
                .send((Instant::now() + delay, buffer[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Read);
    });
    std::thread::spawn(move || {
        for (due, chunk) in queued {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_cross_in_order_no_sooner_than_the_delay_each_way() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = server.local_addr().unwrap().to_string();
        let echo = std::thread::spawn(move || {
            let (mut conn, _) = server.accept().unwrap();
            let mut got = Vec::new();
            conn.read_to_end(&mut got).unwrap();
            conn.write_all(&got).unwrap();
        });
        let delay = Duration::from_millis(20);
        let mut links = SlowLinks::new(delay);
        let addr = links.front(&target);
        let mut conn = TcpStream::connect(addr).unwrap();
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let started = Instant::now();
        conn.write_all(&sent).unwrap();
        conn.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        conn.read_to_end(&mut back).unwrap();
        assert!(started.elapsed() >= 2 * delay, "{:?}", started.elapsed());
        assert_eq!(back, sent);
        echo.join().unwrap();
    }
}
