//! How a node opens its one stream to each peer
//! ([`permitd_transport::StreamTransport`]): TCP from `peer_source_ip` when set,
//! then TLS with this node's certificate when the cluster has TLS, within the
//! RPC timeout.
//!
//! The socket is set up for a link that must fail fast when it stops
//! delivering, since every shard's calls to the peer share it: no Nagle delay,
//! `TCP_USER_TIMEOUT` of the RPC timeout (data unacknowledged that long kills
//! the connection, and the next call connects again), and keep-alive probes
//! every second while it is idle.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use axum::http::uri::Authority;
use nix::sys::socket::{setsockopt, sockopt};
use permitd_transport::{Connecting, Connector, PeerIo};
use rustls_pki_types::ServerName;
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;

/// Idle seconds before a keep-alive probe, and between probes.
const KEEPALIVE_SECS: u32 = 1;

/// Opens peer streams (see the module docs).
#[derive(Clone)]
pub struct PeerConnector {
    tls: Option<TlsConnector>,
    source_ip: Option<IpAddr>,
    timeout: Duration,
}

impl std::fmt::Debug for PeerConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerConnector")
            .field("tls", &self.tls.is_some())
            .field("source_ip", &self.source_ip)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl PeerConnector {
    /// Connects within `timeout` (the RPC timeout), over TLS when `tls` is set.
    pub fn new(tls: Option<TlsConnector>, source_ip: Option<IpAddr>, timeout: Duration) -> Self {
        Self {
            tls,
            source_ip,
            timeout,
        }
    }

    async fn open(self, peer: Authority) -> io::Result<Box<dyn PeerIo>> {
        // An IPv6 literal comes in brackets.
        let host = peer.host().trim_start_matches('[').trim_end_matches(']');
        let port = peer
            .port_u16()
            .unwrap_or(if self.tls.is_some() { 443 } else { 80 });
        let tcp = self.tcp(host, port).await?;
        let Some(tls) = self.tls else {
            return Ok(Box::new(tcp));
        };
        let name = ServerName::try_from(host.to_owned())
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;
        Ok(Box::new(tls.connect(name, tcp).await?))
    }

    /// A TCP connection to the first of `host`'s addresses that answers.
    async fn tcp(&self, host: &str, port: u16) -> io::Result<TcpStream> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("no address for {host}"));
        for addr in tokio::net::lookup_host((host, port)).await? {
            match self.tcp_to(addr).await {
                Ok(stream) => return Ok(stream),
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    async fn tcp_to(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        if let Some(ip) = self.source_ip {
            socket.bind(SocketAddr::new(ip, 0))?;
        }
        let stream = socket.connect(addr).await?;
        stream.set_nodelay(true)?;
        let user_timeout = u32::try_from(self.timeout.as_millis()).unwrap_or(u32::MAX);
        let fd = stream.as_fd();
        setsockopt(&fd, sockopt::TcpUserTimeout, &user_timeout)?;
        setsockopt(&fd, sockopt::KeepAlive, &true)?;
        setsockopt(&fd, sockopt::TcpKeepIdle, &KEEPALIVE_SECS)?;
        setsockopt(&fd, sockopt::TcpKeepInterval, &KEEPALIVE_SECS)?;
        Ok(stream)
    }
}

impl Connector for PeerConnector {
    fn connect(&self, peer: &Authority) -> Connecting {
        let (connector, peer) = (self.clone(), peer.clone());
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, connector.open(peer)).await {
                Ok(opened) => opened,
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {timeout:?}"),
                )),
            }
        })
    }
}

/// The TLS side of [`PeerConnector`]: this node's `tls` as a client.
pub fn tls_connector(tls: &crate::credentials::tls::Tls) -> TlsConnector {
    TlsConnector::from(Arc::clone(&tls.peer_client))
}
