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

use permitd_core::tokens::TokenRecord;
use subtle::ConstantTimeEq;

use crate::credentials::admin::hash_token;
use crate::credentials::secret::to_hex;

use crate::app::App;

/// The caller a request was authenticated as.
#[derive(Debug, Clone)]
pub enum Principal {
    /// Auth is switched off: every call is allowed.
    Anyone,
    Admin,
    Token(TokenRecord),
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
    if let Some(admin) = app.auth.admin_hash() {
        if bool::from(admin.ct_eq(&hash)) {
            return Some(Principal::Admin);
        }
    }
    let hex = to_hex(&hash);
    app.meta()
        .state
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
}
