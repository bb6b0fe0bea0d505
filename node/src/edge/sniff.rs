//! Telling a connection's protocol from its first bytes: HTTP/1.1, HTTP/2 by
//! prior knowledge, or, on the Raft listener, a peer stream
//! ([`permitd_transport::frames`], served by `peer_stream.rs`).
//!
//! Over TLS the handshake's ALPN says whether a connection speaks HTTP/2; a
//! peer stream offers no ALPN and is told by its preface, as in cleartext.
//! [`sniff`] reads while the bytes so far may still begin one of the
//! prefaces, under the header-read timeout, so a connection that sends
//! nothing is dropped like an HTTP/1.1 one whose header never comes. Every
//! byte it read is read again by the protocol's own parser.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// What an HTTP/2 client sends before anything else (RFC 9113, section 3.4).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Which protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
    /// A peer's stream of Raft calls (only where the listener takes them).
    PeerStream,
}

/// The prefaces a listener tells apart: HTTP/2's, and the peer stream's
/// where `peer_streams` is set. Anything else is HTTP/1.1.
fn prefaces(peer_streams: bool) -> &'static [(&'static [u8], Protocol)] {
    const BOTH: &[(&[u8], Protocol)] = &[
        (HTTP2_PREFACE, Protocol::Http2),
        (permitd_transport::frames::PREFACE, Protocol::PeerStream),
    ];
    if peer_streams {
        BOTH
    } else {
        &BOTH[..1]
    }
}

/// Reads a connection's first bytes, just enough to tell a preface from an
/// HTTP/1.1 request line, and hands back the stream with those bytes put
/// back in front. `None` when they do not arrive within `timeout`.
pub async fn sniff<S>(
    mut stream: S,
    timeout: Duration,
    peer_streams: bool,
) -> Option<(Protocol, Prefixed<S>)>
where
    S: AsyncRead + Unpin,
{
    let candidates = prefaces(peer_streams);
    let mut seen = Vec::with_capacity(HTTP2_PREFACE.len());
    let read =
        tokio::time::timeout(timeout, read_preface(&mut stream, &mut seen, candidates)).await;
    match read {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::debug!(%error, "reading a connection's first bytes");
            return None;
        }
        Err(_) => {
            tracing::debug!("a connection sent no request in time");
            return None;
        }
    }
    let protocol = candidates
        .iter()
        .find(|(preface, _)| seen.starts_with(preface))
        .map_or(Protocol::Http1, |(_, protocol)| *protocol);
    Some((protocol, Prefixed::new(seen, stream)))
}

/// Reads while what came so far may still be one of the `candidates`'
/// prefaces. Never past the longest one that still matches: the rest belongs
/// to the protocol's own parser.
async fn read_preface<S: AsyncRead + Unpin>(
    stream: &mut S,
    seen: &mut Vec<u8>,
    candidates: &[(&[u8], Protocol)],
) -> io::Result<()> {
    let mut chunk = [0u8; 64];
    loop {
        let wanted = candidates
            .iter()
            .filter(|(preface, _)| seen.len() < preface.len() && preface.starts_with(seen))
            .map(|(preface, _)| preface.len() - seen.len())
            .min();
        let Some(wanted) = wanted else {
            return Ok(());
        };
        let wanted = wanted.min(chunk.len());
        let read = stream.read(&mut chunk[..wanted]).await?;
        if read == 0 {
            return Ok(());
        }
        seen.extend_from_slice(&chunk[..read]);
    }
}

/// A stream whose first bytes were already read: they are read again first.
#[derive(Debug)]
pub struct Prefixed<S> {
    prefix: Vec<u8>,
    consumed: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    fn new(prefix: Vec<u8>, inner: S) -> Self {
        Self {
            prefix,
            consumed: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let rest = &this.prefix[this.consumed..];
        if rest.is_empty() {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let len = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..len]);
        this.consumed += len;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn sniffed(bytes: &[u8]) -> (Protocol, Vec<u8>) {
        let (protocol, mut stream) = sniff(bytes, Duration::from_secs(1), true).await.unwrap();
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await.unwrap();
        (protocol, all)
    }

    #[tokio::test]
    async fn the_preface_means_http2_and_every_byte_is_read_again() {
        let mut bytes = HTTP2_PREFACE.to_vec();
        bytes.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0");
        assert_eq!(sniffed(&bytes).await, (Protocol::Http2, bytes));
    }

    #[tokio::test]
    async fn anything_else_is_http1() {
        for request in [
            &b"POST /v1/batch HTTP/1.1\r\n"[..],
            b"PRI * HTTP/1.1\r\n\r\n",
            b"",
        ] {
            assert_eq!(sniffed(request).await, (Protocol::Http1, request.to_vec()));
        }
    }

    #[tokio::test]
    async fn a_silent_connection_is_dropped_after_the_timeout() {
        let (_client, server) = tokio::io::duplex(64);
        assert!(sniff(server, Duration::from_millis(50), true)
            .await
            .is_none());
    }

    #[tokio::test]
    async fn a_peer_stream_is_told_by_its_preface_where_the_listener_takes_them() {
        let mut bytes = permitd_transport::frames::PREFACE.to_vec();
        bytes.extend_from_slice(b"\0\0\0\x09\x01");
        assert_eq!(sniffed(&bytes).await, (Protocol::PeerStream, bytes.clone()));
        let (protocol, _) = sniff(&bytes[..], Duration::from_secs(1), false)
            .await
            .unwrap();
        assert_eq!(
            protocol,
            Protocol::Http1,
            "the public listener takes no peer streams"
        );
    }
}
