//! TLS (rustls, ring provider) for both listeners and for every client a node
//! opens (forwarding to the leader, Raft RPCs to peers).
//!
//! From `[tls]` in `cluster.toml`: `cert_file` and `key_file` (PEM) are this
//! node's identity on both listeners and, as a client certificate, towards
//! peers; `ca_file` is the only root a node trusts when it calls a peer. With
//! `peer_client_auth = true` the Raft listener requires a client certificate
//! signed by that CA (mTLS), on top of the peer secret.
//!
//! The handshakes themselves run in the HTTP edge's connection tasks
//! (`edge/serve.rs`), under its timeout and connection limit.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio_rustls::TlsAcceptor;

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
    /// This node as a client of its peers' streams: the cluster's CA as the
    /// only root, its own certificate presented.
    pub peer_client: Arc<ClientConfig>,
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
        let peer_client = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(rustls_error)?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key.clone_key())
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
            api_server: Arc::new(with_alpn(api_server, API_ALPN)),
            raft_server: Arc::new(with_alpn(raft_server, RAFT_ALPN)),
            peer_client: Arc::new(peer_client),
            ca_pem,
            identity_pem,
        })
    }

    /// The API listener's acceptor: any client, server certificate only.
    pub fn api_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.api_server))
    }

    /// The Raft listener's acceptor: client certificates required with
    /// `peer_client_auth`.
    pub fn raft_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.raft_server))
    }

    /// `builder` trusting only the cluster's CA and presenting this node's
    /// certificate (peers with `peer_client_auth` require it).
    pub fn client(
        &self,
        builder: reqwest::ClientBuilder,
    ) -> Result<reqwest::ClientBuilder, reqwest::Error> {
        // HTTP/1.1 whatever a peer's ALPN offers: forwarding and Raft calls
        // stay as they were measured (docs/operations.md, "HTTP/2").
        Ok(builder
            .http1_only()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&self.ca_pem)?)
            .identity(reqwest::Identity::from_pem(&self.identity_pem)?))
    }
}

/// What the API listener offers in ALPN: HTTP/2 to clients that ask for it
/// (`edge/serve.rs` serves each connection as agreed), HTTP/1.1 to the rest.
const API_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];
/// Peers speak HTTP/1.1 to each other, and their peer streams offer no ALPN
/// (`edge/sniff.rs` tells them by their preface).
const RAFT_ALPN: &[&[u8]] = &[b"http/1.1"];

fn with_alpn(mut config: ServerConfig, protocols: &[&[u8]]) -> ServerConfig {
    config.alpn_protocols = protocols.iter().map(|protocol| protocol.to_vec()).collect();
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
