//! Test certificates: a CA and one node certificate it signs, generated fresh
//! for each TLS test cluster (rcgen), never checked in.
//!
//! The node certificate names `localhost` and `127.0.0.1` and serves both as
//! server and client certificate, so one file pair fits every node of a
//! loopback cluster, and peers with `peer_client_auth` accept each other.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// Where the generated PEM files are.
#[derive(Debug, Clone)]
pub struct TestCerts {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Writes `ca.pem`, `node.pem` and `node-key.pem` into `dir`.
pub fn generate(dir: &Path) -> TestCerts {
    std::fs::create_dir_all(dir).expect("certificate dir");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "permitd test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");

    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let mut node_params = CertificateParams::new(names).expect("node params");
    node_params
        .distinguished_name
        .push(DnType::CommonName, "permitd test node");
    node_params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let node_key = KeyPair::generate().expect("node key");
    let node = node_params
        .signed_by(&node_key, &ca, &ca_key)
        .expect("node certificate");

    let certs = TestCerts {
        ca_file: dir.join("ca.pem"),
        cert_file: dir.join("node.pem"),
        key_file: dir.join("node-key.pem"),
    };
    std::fs::write(&certs.ca_file, ca.pem()).expect("ca.pem");
    std::fs::write(&certs.cert_file, node.pem()).expect("node.pem");
    std::fs::write(&certs.key_file, node_key.serialize_pem()).expect("node-key.pem");
    certs
}

/// A second, unrelated CA's certificate, for checking that a client trusting
/// it is refused.
pub fn foreign_ca(dir: &Path) -> PathBuf {
    let other = generate(&dir.join("foreign"));
    other.ca_file
}

/// `builder` trusting only the test CA of `certs`, when the cluster has them.
pub fn trusting(
    builder: reqwest::ClientBuilder,
    certs: Option<&TestCerts>,
) -> reqwest::ClientBuilder {
    let Some(certs) = certs else {
        return builder;
    };
    let pem = std::fs::read(&certs.ca_file).expect("the test CA");
    let ca = reqwest::Certificate::from_pem(&pem).expect("the test CA");
    builder
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
}
