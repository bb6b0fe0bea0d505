//! A loopback TCP proxy in front of every node's Raft listener, which the
//! nemesis can use to cut one node off from the others.
//!
//! Each node advertises its proxy's address as its Raft address
//! (`advertise_raft_addr`), so every Raft RPC *to* node `i` passes through
//! proxy `i`. The sender of a connection is the node named in the first
//! request's `x-permitd-from` header (connections are pooled per sending
//! process, so a connection never changes sender). A link is cut when either end
//! is isolated: then the proxy stops forwarding and silently swallows what the
//! client sends (a blackhole, so the sender sees timeouts rather than a quick
//! refusal), both for live connections and for new ones. Blackholed connections
//! stay dead after the heal; the sender times out and opens a fresh one.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use permitd_core::contract::headers;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Longest request head read to find the sender.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a new connection may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a blackholed connection is kept open.
const BLACKHOLE_MAX: Duration = Duration::from_secs(60);

/// The proxies of one cluster and the set of isolated nodes.
#[derive(Debug, Clone, Default)]
pub struct Network {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    isolated: Mutex<BTreeSet<u64>>,
    /// Bumped on every change of `isolated`, so live connections re-check.
    changes: watch::Sender<u64>,
    accept_tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Network {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a proxy for node `to` that forwards to `target` (its real Raft
    /// listener) and returns the proxy's address. Must run inside a tokio runtime.
    pub fn front(&self, to: u64, target: &str) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy port");
        listener.set_nonblocking(true).expect("non-blocking proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let listener = TcpListener::from_std(listener).expect("tokio proxy listener");
        // A weak handle: the proxies stop once the last `Network` is dropped.
        let weak = Arc::downgrade(&self.inner);
        let target = target.to_string();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let network = Network { inner };
                let target = target.clone();
                tokio::spawn(async move { network.serve(client, to, target).await });
            }
        });
        self.inner.accept_tasks.lock().unwrap().push(task);
        addr
    }

    /// Cuts every link to and from `node`.
    pub fn isolate(&self, node: u64) {
        self.inner.isolated.lock().unwrap().insert(node);
        self.inner.changes.send_modify(|n| *n += 1);
    }

    /// Restores every link.
    pub fn heal(&self) {
        self.inner.isolated.lock().unwrap().clear();
        self.inner.changes.send_modify(|n| *n += 1);
    }

    pub fn isolated(&self) -> BTreeSet<u64> {
        self.inner.isolated.lock().unwrap().clone()
    }

    fn blocked(&self, from: Option<u64>, to: u64) -> bool {
        let isolated = self.inner.isolated.lock().unwrap();
        isolated.contains(&to) || from.is_some_and(|from| isolated.contains(&from))
    }

    async fn serve(&self, mut client: TcpStream, to: u64, target: String) {
        let mut changes = self.inner.changes.subscribe();
        let Ok(Some((head, from))) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client))
            .await
            .map(Result::ok)
            .map(Option::flatten)
        else {
            return;
        };
        if self.blocked(from, to) {
            return blackhole(client).await;
        }
        let connect = tokio::time::timeout(HEAD_TIMEOUT, TcpStream::connect(&target)).await;
        let Ok(Ok(upstream)) = connect else {
            return; // The node is down: the client sees the connection close.
        };
        let _ = upstream.set_nodelay(true);
        let _ = client.set_nodelay(true);
        let (mut client_read, mut client_write) = client.into_split();
        let (mut up_read, mut up_write) = upstream.into_split();
        if up_write.write_all(&head).await.is_err() {
            return;
        }
        let mut from_client = vec![0u8; 16 * 1024];
        let mut from_upstream = vec![0u8; 16 * 1024];
        loop {
            tokio::select! {
                read = client_read.read(&mut from_client) => match read {
                    Ok(n) if n > 0 => {
                        if up_write.write_all(&from_client[..n]).await.is_err() {
                            return;
                        }
                    }
                    _ => return,
                },
                read = up_read.read(&mut from_upstream) => match read {
                    Ok(n) if n > 0 => {
                        if client_write.write_all(&from_upstream[..n]).await.is_err() {
                            return;
                        }
                    }
                    _ => return,
                },
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if self.blocked(from, to) {
                        drop((up_read, up_write));
                        // Keep the write half alive (unused) so the client
                        // sees no close: a silent link.
                        let _silent = client_write;
                        return blackhole(client_read).await;
                    }
                }
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self.accept_tasks.get_mut().unwrap().drain(..) {
            task.abort();
        }
    }
}

/// Reads until the end of the first request head; returns the bytes read and the
/// sender named in [`headers::SENDER`], if any. `None` if the client went away.
async fn read_head(client: &mut TcpStream) -> std::io::Result<Option<(Vec<u8>, Option<u64>)>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head[..end]);
            let from = text.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case(headers::SENDER)
                    .then(|| value.trim().parse().ok())
                    .flatten()
            });
            return Ok(Some((head, from)));
        }
        if head.len() > MAX_HEAD_BYTES {
            return Ok(Some((head, None)));
        }
    }
}

/// Swallows everything until the client closes (or a long while passes).
async fn blackhole(mut client: impl AsyncRead + Unpin) {
    let mut sink = vec![0u8; 16 * 1024];
    let _ = tokio::time::timeout(BLACKHOLE_MAX, async {
        while let Ok(n) = client.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}
