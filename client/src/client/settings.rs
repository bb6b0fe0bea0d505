//! The operator's configuration calls: what the cluster enforces on a key (its
//! configuration, its groups' caps and permissions) and who may call it (API
//! tokens). Writes and every token call need an admin token; reading a key's
//! configuration, a reader's. Configuration writes replace whole values, so a
//! retried one is harmless; a retried `create_token` may create a second
//! token.
//!
//! The operator's other calls, which inspect or act on the cluster rather
//! than configure it (key listing, holders, force release, cluster status,
//! initialisation, membership, backups), are in [`crate::admin`].

use http::Method;
use permitd_core::contract::paths;
use permitd_core::tokens::{CreatedToken, TokenInfo, TokenList, TokenSpec};
use permitd_core::{GroupConfig, KeyConfig, KeyConfigUpdate};

use super::handle::SemaphoreClient;
use crate::error::ClientError;

impl SemaphoreClient {
    /// The key's effective configuration.
    pub async fn key_config(&self, key: &str) -> Result<KeyConfig, ClientError> {
        self.get(&paths::segments(paths::KEY_CONFIG, &[key])).await
    }

    /// Replaces the key's configuration (omitted fields take the cluster
    /// defaults); answers the effective configuration once applied.
    pub async fn set_key_config(
        &self,
        key: &str,
        update: &KeyConfigUpdate,
    ) -> Result<KeyConfig, ClientError> {
        self.put(&paths::segments(paths::KEY_CONFIG, &[key]), update)
            .await
    }

    /// Sets one group's cap and permission.
    pub async fn set_group(
        &self,
        key: &str,
        group: &str,
        config: &GroupConfig,
    ) -> Result<GroupConfig, ClientError> {
        let path = paths::segments(paths::GROUP, &[key, group]);
        let answer: serde_json::Value = self.put(&path, config).await?;
        // Whatever the node echoes, what it applied is what was sent.
        Ok(serde_json::from_value(answer).unwrap_or_else(|_| config.clone()))
    }

    /// Removes one group's settings (no cap, permitted).
    pub async fn delete_group(&self, key: &str, group: &str) -> Result<(), ClientError> {
        self.delete(&paths::segments(paths::GROUP, &[key, group]))
            .await
    }

    /// Creates an API token (admin only). The answer holds the secret `token`,
    /// shown this once. A retried call may create a second token; list and revoke.
    pub async fn create_token(&self, spec: &TokenSpec) -> Result<CreatedToken, ClientError> {
        let path = paths::segments(paths::TOKENS, &[]);
        self.call(Method::POST, &path, Some(spec)).await
    }

    /// Every API token, without secrets (admin only).
    pub async fn tokens(&self) -> Result<Vec<TokenInfo>, ClientError> {
        let answer: TokenList = self.get(&paths::segments(paths::TOKENS, &[])).await?;
        Ok(answer.tokens)
    }

    /// Revokes an API token (admin only).
    pub async fn revoke_token(&self, id: u64) -> Result<(), ClientError> {
        self.delete(&paths::segments(paths::TOKEN, &[&id.to_string()]))
            .await
    }
}
