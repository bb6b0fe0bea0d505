//! Operator calls of [`SemaphoreClient`] that inspect or act on the cluster:
//! the key listing page by page, a key's holders, the admin force release of
//! one client's footprint, the admin delete of a key, the cluster's status and
//! its shards,
//! initialisation and membership changes (`/cluster/members`, with the
//! secret), and backups. The calls that configure it (keys, groups, tokens)
//! are in `client/settings.rs`.
//!
//! `GET /v1/semaphores` answers at most one page of keys in key order, with
//! `next` when more follow; [`SemaphoreClient::keys_page`] asks for one page and
//! [`SemaphoreClient::keys`] follows `next` to the end.

use http::Method;
use permitd_core::contract::{paths, ClusterStatus, ErrorCode, KeyList, KeyUsage, ShardMap};
use permitd_core::engine::delete_key::KeyDeleted;
use permitd_core::engine::force_release::ForceReleased;
use permitd_core::engine::holders::KeyHolders;
use permitd_core::engine::restore::BackupFile;

use crate::{ClientError, SemaphoreClient};

impl SemaphoreClient {
    /// One page of keys sorting after `after`, at most `limit` of them (the
    /// server's default page when `None`; it caps larger pages).
    pub async fn keys_page(
        &self,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<KeyList, ClientError> {
        let path = paths::segments(paths::SEMAPHORES, &[]);
        let mut query = Vec::new();
        if let Some(after) = after {
            query.push(("after", after.to_owned()));
        }
        if let Some(limit) = limit {
            query.push(("limit", limit.to_string()));
        }
        self.call_with_query::<(), _>(Method::GET, &path, &query, None)
            .await
    }

    /// Who holds what on `key`: grants, leases and waiting demand per clientId.
    pub async fn holders(&self, key: &str) -> Result<KeyHolders, ClientError> {
        let path = paths::segments(paths::HOLDERS, &[key]);
        self.call_with_query::<(), _>(Method::GET, &path, &[], None)
            .await
    }

    /// Drops `client_id`'s grants, leases and remembered answers on `key` (admin).
    pub async fn force_release(
        &self,
        key: &str,
        client_id: &str,
    ) -> Result<ForceReleased, ClientError> {
        let path = paths::segments(paths::CLIENT_RELEASE, &[key, client_id]);
        self.call_with_query::<(), _>(Method::POST, &path, &[], None)
            .await
    }

    /// The cluster's membership, leader, term and indexes, as some node sees them.
    pub async fn cluster_status(&self) -> Result<ClusterStatus, ClientError> {
        let path = paths::segments(paths::CLUSTER_STATUS, &[]);
        self.call_with_query::<(), _>(Method::GET, &path, &[], None)
            .await
    }

    /// Every shard and its leader, as some node sees them (admin).
    pub async fn cluster_shards(&self) -> Result<ShardMap, ClientError> {
        let path = paths::segments(paths::CLUSTER_SHARDS, &[]);
        self.call_with_query::<(), _>(Method::GET, &path, &[], None)
            .await
    }

    /// Deletes `key`'s settings and state (admin). With `force`, its grants and
    /// leases are released first; without, a key in use fails with
    /// `key_in_use`. One `requestId` serves every attempt of the call, so a
    /// retry after a lost answer gets the first answer instead of deleting
    /// again (a key used meanwhile stays as it is).
    pub async fn delete_key(&self, key: &str, force: bool) -> Result<KeyDeleted, ClientError> {
        let path = paths::segments(paths::SEMAPHORE, &[key]);
        let mut query = vec![("requestId", self.new_uuid().to_string())];
        if force {
            query.push(("force", "true".to_owned()));
        }
        self.call_with_query::<(), _>(Method::DELETE, &path, &query, None)
            .await
    }

    /// `POST /cluster/init` (needs the secret): makes every node of the asked
    /// node's cluster file a voter of a new cluster and writes its `[defaults]`.
    /// Answers `false` when the cluster was initialised already.
    pub async fn init_cluster(&self) -> Result<bool, ClientError> {
        let path = paths::segments(paths::CLUSTER_INIT, &[]);
        let empty = serde_json::json!({});
        match self
            .call_with_query::<_, serde_json::Value>(Method::POST, &path, &[], Some(&empty))
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if error.code() == Some(ErrorCode::AlreadyInitialized) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Adds node `id` as a learner; answers once it has caught up with the log.
    pub async fn add_learner(
        &self,
        id: u64,
        api_addr: &str,
        raft_addr: &str,
    ) -> Result<ClusterStatus, ClientError> {
        let change = serde_json::json!({
            "action": "addLearner", "id": id, "apiAddr": api_addr, "raftAddr": raft_addr,
        });
        self.change_members(&change).await
    }

    /// Makes exactly `voters` the voters (each must be a member already).
    pub async fn set_voters(&self, voters: &[u64]) -> Result<ClusterStatus, ClientError> {
        let change = serde_json::json!({"action": "changeMembership", "voters": voters});
        self.change_members(&change).await
    }

    async fn change_members(
        &self,
        change: &serde_json::Value,
    ) -> Result<ClusterStatus, ClientError> {
        let path = paths::segments(paths::CLUSTER_MEMBERS, &[]);
        self.call_with_query(Method::POST, &path, &[], Some(change))
            .await
    }

    /// `GET /cluster/snapshot` (needs the secret): a consistent backup of the
    /// state the leader has applied, as the backup file's JSON.
    pub async fn save_backup(&self) -> Result<BackupFile, ClientError> {
        let path = paths::segments(paths::CLUSTER_SNAPSHOT, &[]);
        self.call_with_query::<(), _>(Method::GET, &path, &[], None)
            .await
    }

    /// Every key with state, with its usage, following pages to the end.
    pub async fn keys(&self) -> Result<Vec<KeyUsage>, ClientError> {
        let mut keys = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.keys_page(after.as_deref(), None).await?;
            keys.extend(page.keys);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(keys),
            }
        }
    }
}
