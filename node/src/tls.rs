//! TLS (rustls, ring provider) for both listeners and for every client a node
//! opens (forwarding to the leader, Raft RPCs to peers).
//!
//! From `[tls]` in `cluster.toml`: `cert_file` and `key_file` (PEM) are this
//! node's identity on both listeners and, as a client certificate, towards
//! peers; `ca_file` is the only root a node trusts when it calls a peer. With
//! `peer_client_auth = true` the Raft listener requires a client certificate
//! signed by that CA (mTLS), on top of the peer secret.
//!
//! [`TlsListener`] does handshakes off the accept loop, each under a timeout and
//! at most [`MAX_CONCURRENT_HANDSHAKES`] at once, so a slow or silent client
//! can neither stall other connections nor hold memory without bound.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Handshakes in progress at once per listener; accepting waits beyond.
pub const MAX_CONCURRENT_HANDSHAKES: usize = 1_024;
/// Finished handshakes waiting for the server to take them.
const ACCEPTED_QUEUE: usize = 64;

/// `[tls]` in `cluster.toml`; relative paths are resolved against the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
    /// Require a client certificate signed by `ca_file` on the Raft port.
    #[serde(default)]
    pub peer_client_auth: bool,
}

impl TlsConfig {
    pub fn resolve_paths(&mut self, base: &Path) {
        for path in [&mut self.cert_file, &mut self.key_file, &mut self.ca_file] {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
    }
}

/// Why the TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Pem { path: PathBuf, detail: String },
    #[error("tls: {0}")]
    Rustls(String),
}

/// Loaded TLS material: server configs for both listeners and what clients need.
#[derive(Clone)]
pub struct Tls {
    pub api_server: Arc<ServerConfig>,
    pub raft_server: Arc<ServerConfig>,
    ca_pem: Vec<u8>,
    /// Certificate chain then key, as reqwest's `Identity::from_pem` wants it.
    identity_pem: Vec<u8>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    pub fn load(config: &TlsConfig) -> Result<Self, TlsError> {
        let cert_pem = read(&config.cert_file)?;
        let key_pem = read(&config.key_file)?;
        let ca_pem = read(&config.ca_file)?;
        let pem_error = |path: &Path| {
            let path = path.to_owned();
            move |error: rustls_pki_types::pem::Error| TlsError::Pem {
                path,
                detail: error.to_string(),
            }
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(pem_error(&config.cert_file))?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(pem_error(&config.key_file))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(&ca_pem) {
            roots
                .add(ca.map_err(pem_error(&config.ca_file))?)
                .map_err(|error| TlsError::Rustls(error.to_string()))?;
        }
        let rustls_error = |error: rustls::Error| TlsError::Rustls(error.to_string());
        let api_server = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(rustls_error)?
            .with_no_client_auth()
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(rustls_error)?;
        let raft_builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(rustls_error)?;
        let raft_server = if config.peer_client_auth {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|error| TlsError::Rustls(error.to_string()))?;
            raft_builder.with_client_cert_verifier(verifier)
        } else {
            raft_builder.with_no_client_auth()
        }
        .with_single_cert(chain, key)
        .map_err(rustls_error)?;
        let mut identity_pem = cert_pem;
        identity_pem.push(b'\n');
        identity_pem.extend_from_slice(&key_pem);
        Ok(Self {
            api_server: Arc::new(with_http11(api_server)),
            raft_server: Arc::new(with_http11(raft_server)),
            ca_pem,
            identity_pem,
        })
    }

    /// `builder` trusting only the cluster's CA and presenting this node's
    /// certificate (peers with `peer_client_auth` require it).
    pub fn client(
        &self,
        builder: reqwest::ClientBuilder,
    ) -> Result<reqwest::ClientBuilder, reqwest::Error> {
        Ok(builder
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&self.ca_pem)?)
            .identity(reqwest::Identity::from_pem(&self.identity_pem)?))
    }
}

fn with_http11(mut config: ServerConfig) -> ServerConfig {
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// The URL scheme of a node's listeners.
pub fn scheme(tls: Option<&Tls>) -> &'static str {
    if tls.is_some() {
        "https"
    } else {
        "http"
    }
}

/// A listener that hands axum finished TLS connections.
#[derive(Debug)]
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener`; handshakes run in their own tasks.
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (sender, accepted) = mpsc::channel(ACCEPTED_QUEUE);
        tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), sender));
        Ok(Self {
            accepted,
            local_addr,
        })
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    sender: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_CONCURRENT_HANDSHAKES));
    loop {
        let accepted = tokio::select! {
            () = sender.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait, as axum does.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let acceptor = acceptor.clone();
        let sender = sender.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let timeout = Duration::from_millis(HANDSHAKE_TIMEOUT_MS);
            match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = sender.send((tls, peer)).await;
                }
                Ok(Err(error)) => tracing::debug!(%error, %peer, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accept loop only ends when this receiver is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
