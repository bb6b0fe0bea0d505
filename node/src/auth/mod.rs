//! Who may call what: bearer tokens with roles, checked on the leader.
//!
//! Three kinds of credential (see `docs` in the README's "Security" section):
//! - the **peer secret** (`secret` in `cluster.toml`) opens `/raft/*` on the
//!   internal listener and nothing else;
//! - the **admin token** (`[auth] admin_token` or `PERMITD_ADMIN_TOKEN`) opens
//!   everything on the public listener;
//! - **API tokens** created by an admin (`POST /v1/tokens`) carry a role and key
//!   and client-id patterns ([`roles`]); the replicated state keeps only the
//!   SHA-256 of each ([`permitd_core::tokens`]).
//!
//! Why SHA-256 and no slow KDF: every API token is 256 bits from the OS random
//! source, so a stolen log or snapshot cannot be brute-forced whatever the hash
//! speed; slow KDFs exist for low-entropy human passwords. Lookup is by hash in a
//! map: what its timing could reveal is a prefix of a hash, which gives nothing
//! towards a preimage. The admin token is compared hash to hash in constant time.
//!
//! A refused call is answered before any handler runs, so it changes nothing:
//! 401 `unauthorized` for a missing or unknown token, 403 `forbidden` for a known
//! one outside its role, keys or client ids. `/healthz` and `/readyz` are open.

pub mod middleware;
pub mod roles;
pub mod secret;
pub mod tokens;

use permitd_core::tokens::TokenRecord;
use subtle::ConstantTimeEq;

pub use secret::{random_hex, write_private_file, Secret};

use crate::app::App;

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

/// The caller a request was authenticated as.
#[derive(Debug, Clone)]
pub enum Principal {
    /// Auth is switched off: every call is allowed.
    Anyone,
    Admin,
    Token(TokenRecord),
}

/// SHA-256 of a token's secret.
pub fn hash_token(token: &str) -> TokenHash {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut hash = [0u8; 32];
    hash.copy_from_slice(digest.as_ref());
    hash
}

/// Lowercase hex, as the registry stores hashes.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The token of an `Authorization: Bearer …` header value, if well formed.
pub fn bearer_token(value: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(value).ok()?;
    let (scheme, token) = text.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Who `token` is, or `None` for an unknown token.
pub fn authenticate(app: &App, token: &str) -> Option<Principal> {
    let hash = hash_token(token);
    if let Some(admin) = &app.auth.admin_hash {
        if bool::from(admin.ct_eq(&hash)) {
            return Some(Principal::Admin);
        }
    }
    let hex = to_hex(&hash);
    app.state
        .read_tokens(|tokens| tokens.by_hash(&hex).cloned())
        .map(Principal::Token)
}

/// Compares two byte strings without an early exit (the length is not secret).
pub fn constant_time_eq(left: &[u8], right: &[u8]) -> bool {
    bool::from(left.ct_eq(right))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_headers_and_hashes() {
        assert_eq!(bearer_token(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
        // The well-known SHA-256 of "abc".
        assert_eq!(
            to_hex(&hash_token("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn settings_never_print_the_admin_token() {
        let settings = AuthSettings::new(true, Some(Secret::from("super-secret-admin-token")));
        assert!(!format!("{settings:?}").contains("super-secret"));
    }
}
