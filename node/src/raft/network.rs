//! Outbound Raft RPCs: openraft's `RaftNetworkFactory` over one pooled HTTP client.
//!
//! Error mapping follows openraft's examples: a peer we cannot connect to is
//! `Unreachable` (openraft backs off), any other transport failure is a
//! `NetworkError`, and an error the peer's Raft answered is a `RemoteError`.

use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use permitd_core::contract::headers;
use permitd_storage::{codec, NodeId, PeerNode, TypeConfig};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::wire::SnapshotChunk;
use super::{bearer, SECRET_HEADER};
use crate::auth::Secret;

/// Creates connections to peers; they share one client, hence one connection pool.
#[derive(Debug, Clone)]
pub struct Network {
    client: reqwest::Client,
    /// This node, named in [`headers::SENDER`].
    id: NodeId,
    secret: Secret,
    rpc_timeout: Duration,
    /// `http` or `https`.
    scheme: &'static str,
}

impl Network {
    /// With `tls`, peers are called over HTTPS, verified against the cluster CA,
    /// with this node's certificate as client certificate.
    pub fn new(
        id: NodeId,
        secret: Secret,
        rpc_timeout: Duration,
        tls: Option<&crate::tls::Tls>,
        source_ip: Option<std::net::IpAddr>,
    ) -> Result<Self, reqwest::Error> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(rpc_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .local_address(source_ip)
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            builder = tls.client(builder)?;
        }
        Ok(Self {
            client: builder.build()?,
            id,
            secret,
            rpc_timeout,
            scheme: crate::tls::scheme(tls),
        })
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, node: &PeerNode) -> Connection {
        Connection {
            network: self.clone(),
            target,
            target_node: node.clone(),
        }
    }
}

/// One peer, as seen by the replication stream that openraft runs for it.
#[derive(Debug)]
pub struct Connection {
    network: Network,
    target: NodeId,
    target_node: PeerNode,
}

type RpcResult<T, E = RaftError<NodeId>> = Result<T, RPCError<NodeId, PeerNode, E>>;

impl Connection {
    async fn send<Req, Resp, Err>(
        &self,
        path: &str,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, Err>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        Err: std::error::Error + DeserializeOwned,
    {
        let url = format!(
            "{}://{}/raft/{path}",
            self.network.scheme, self.target_node.raft_addr
        );
        let timeout = option.hard_ttl().min(self.network.rpc_timeout);
        let body =
            codec::encode(request).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let response = self
            .network
            .client
            .post(url)
            .header(SECRET_HEADER, bearer(self.network.secret.expose()))
            .header(headers::SENDER, self.network.id)
            .header(reqwest::header::CONTENT_TYPE, codec::CONTENT_TYPE)
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(|error| {
                if error.is_connect() {
                    RPCError::Unreachable(Unreachable::new(&error))
                } else {
                    RPCError::Network(NetworkError::new(&error))
                }
            })?;
        let response = response
            .error_for_status()
            .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let bytes = response
            .bytes()
            .await
            .map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        let answer: Result<Resp, Err> =
            codec::decode(&bytes).map_err(|error| RPCError::Network(NetworkError::new(&error)))?;
        answer.map_err(|error| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.target_node.clone(),
                error,
            ))
        })
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        self.send("append", &request, &option).await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.send("snapshot", &SnapshotChunk::from(request), &option)
            .await
    }

    async fn vote(
        &mut self,
        request: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>> {
        self.send("vote", &request, &option).await
    }
}
