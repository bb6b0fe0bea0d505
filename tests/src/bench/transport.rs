//! How the bench's clients reach the nodes, to compare transports on the same
//! rows (docs/operations.md, "HTTP/2"):
//!
//! - `PERMITD_BENCH_HTTP=2`: every client call over HTTP/2, many on one
//!   connection (prior knowledge in cleartext, ALPN over TLS); HTTP/1.1 with
//!   pooled connections otherwise, as clients send by default;
//! - `PERMITD_BENCH_TLS=1`: the cluster serves HTTPS (generated certificates).

use crate::Cluster;

/// The bench's transport, from the environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Transport {
    pub http2: bool,
    pub tls: bool,
}

/// The variables [`transport`] reads, for the report's header.
pub const VARIABLES: [&str; 2] = ["PERMITD_BENCH_HTTP", "PERMITD_BENCH_TLS"];

/// The transport the environment asks for.
pub fn transport() -> Transport {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    Transport {
        http2: var("PERMITD_BENCH_HTTP") == "2",
        tls: var("PERMITD_BENCH_TLS") == "1",
    }
}

impl Transport {
    /// `builder` speaking this transport to `cluster`.
    pub fn http(
        self,
        cluster: &Cluster,
        builder: reqwest::ClientBuilder,
    ) -> reqwest::ClientBuilder {
        let builder = if self.http2 {
            builder.http2_prior_knowledge()
        } else {
            builder.http1_only()
        };
        crate::certs::trusting(builder, cluster.certs.as_ref())
    }

    /// `config` speaking this transport to `cluster`.
    pub fn client(self, cluster: &Cluster, config: &mut permitd_client::ClientConfig) {
        config.http2 = self.http2;
        config.ca_file = cluster.certs.as_ref().map(|certs| certs.ca_file.clone());
    }
}
