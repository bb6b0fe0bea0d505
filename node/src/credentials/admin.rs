//! Whether the public API checks tokens, and the admin token: settings the node
//! is started with, kept below the edge that checks them (`edge/auth/`).

use super::Secret;

/// A SHA-256 digest.
pub type TokenHash = [u8; 32];

/// How this node authenticates public API calls.
#[derive(Clone)]
pub struct AuthSettings {
    /// `false` only for local development: every call is let through.
    pub enabled: bool,
    /// The admin token, for the node's own calls to the leader (`/cluster/defaults`
    /// at initialisation); compared through its hash.
    pub admin_token: Option<Secret>,
    admin_hash: Option<TokenHash>,
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("enabled", &self.enabled)
            .field("admin_token", &self.admin_token)
            .finish_non_exhaustive()
    }
}

impl AuthSettings {
    pub fn new(enabled: bool, admin_token: Option<Secret>) -> Self {
        let admin_hash = admin_token.as_ref().map(|token| hash_token(token.expose()));
        Self {
            enabled,
            admin_token,
            admin_hash,
        }
    }

    /// Everything open (tests of the node alone, local development).
    pub fn disabled() -> Self {
        Self::new(false, None)
    }
}

impl AuthSettings {
    /// The admin token's hash, compared in constant time by the edge.
    pub fn admin_hash(&self) -> Option<&TokenHash> {
        self.admin_hash.as_ref()
    }
}

/// SHA-256 of a token's secret.
pub fn hash_token(token: &str) -> TokenHash {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut hash = [0u8; 32];
    hash.copy_from_slice(digest.as_ref());
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_never_print_the_admin_token() {
        let settings = AuthSettings::new(true, Some(Secret::from("super-secret-admin-token")));
        assert!(!format!("{settings:?}").contains("super-secret"));
    }
}
