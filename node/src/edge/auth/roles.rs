//! What each role may do: every authenticated route is one [`Action`], and
//! [`decide`] is the whole table.
//!
//! | action | runner | reader | admin |
//! |---|---|---|---|
//! | `POST /v1/semaphores/{key}` (request, sync) | keys + clientId | – | yes |
//! | `POST /v1/batch` (each item as the post above, on its own) | keys + clientId | – | yes |
//! | `GET /v1/semaphores/{key}/usage` | keys | yes | yes |
//! | `GET /v1/events?key=` (a runner must name a key) | keys | yes | yes |
//! | `GET /v1/semaphores/{key}/config`, `GET /v1/semaphores` | – | yes | yes |
//! | `GET /v1/semaphores/{key}/holders` | – | yes | yes |
//! | `GET /metrics` | – | yes | yes |
//! | `PUT …/config`, `PUT`/`DELETE …/groups/{group}`, `DELETE /v1/semaphores/{key}` | – | – | yes |
//! | `POST …/clients/{clientId}/release`, `/v1/tokens*`, `/cluster/*` | – | – | yes |
//! | `/ui`, `/ui/{asset}`, `/healthz`, `/readyz` | open | open | open |
//!
//! `GET /openapi.json` is open too: the API's description, as public as the
//! repository's `docs/openapi.json`.

use axum::http::Method;
use permitd_core::contract::paths;
use permitd_core::tokens::{any_matches, Role, TokenRecord};

/// What a route does, as far as permissions go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A `request` or `sync` on a key, by a `clientId` (`None`: not readable).
    Post {
        key: Option<String>,
        client_id: Option<String>,
    },
    /// A batch of posts: the call needs a role that may post; each item is then
    /// decided as its own [`Action::Post`] ([`ItemGate`]).
    Batch,
    Usage {
        key: Option<String>,
    },
    /// The event stream, of one key (`key` from the query) or of all.
    Events {
        key: Option<String>,
    },
    ReadConfig,
    ListKeys,
    Metrics,
    /// Who holds a key's permits and who waits (read-only).
    Holders,
    /// Key and group configuration changes, and deleting a key.
    WriteConfig,
    Tokens,
    Cluster,
}

/// Why a token may not do an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    Role,
    Key,
    ClientId,
}

impl Denied {
    pub fn message(self) -> &'static str {
        match self {
            Self::Role => "this token's role may not do this",
            Self::Key => "this token may not use this key",
            Self::ClientId => "this token may not act for this clientId",
        }
    }
}

/// The action of a matched route, or `None` for an open route.
pub fn action_of(method: &Method, matched_path: &str, key: Option<String>) -> Option<Action> {
    let action = match (method.as_str(), matched_path) {
        (_, paths::HEALTHZ | paths::READYZ | paths::OPENAPI | paths::UI | paths::UI_ASSET) => {
            return None
        }
        ("POST", paths::SEMAPHORE) => Action::Post {
            key,
            client_id: None,
        },
        ("DELETE", paths::SEMAPHORE) => Action::WriteConfig,
        ("POST", paths::BATCH) => Action::Batch,
        ("GET", paths::USAGE) => Action::Usage { key },
        ("GET", paths::EVENTS) => Action::Events { key },
        ("GET", paths::KEY_CONFIG) => Action::ReadConfig,
        ("GET", paths::SEMAPHORES) => Action::ListKeys,
        ("GET", paths::METRICS) => Action::Metrics,
        ("GET", paths::HOLDERS) => Action::Holders,
        (_, paths::KEY_CONFIG | paths::GROUP) => Action::WriteConfig,
        (_, paths::TOKENS | paths::TOKEN) => Action::Tokens,
        // `/cluster/*`, and anything added later, is for admins only.
        _ => Action::Cluster,
    };
    Some(action)
}

/// Whether `token` may do `action`.
pub fn decide(token: &TokenRecord, action: &Action) -> Result<(), Denied> {
    let spec = &token.spec;
    let key_allowed = |key: &Option<String>| match key {
        Some(key) if any_matches(&spec.keys, key) => Ok(()),
        _ => Err(Denied::Key),
    };
    match (spec.role, action) {
        (Role::Admin, _) => Ok(()),
        (Role::Runner, Action::Post { key, client_id }) => {
            key_allowed(key)?;
            match client_id {
                Some(client_id) if any_matches(&spec.client_ids, client_id) => Ok(()),
                _ => Err(Denied::ClientId),
            }
        }
        (Role::Runner, Action::Batch) => Ok(()),
        (Role::Runner, Action::Usage { key } | Action::Events { key }) => key_allowed(key),
        (
            Role::Reader,
            Action::Usage { .. }
            | Action::Events { .. }
            | Action::ReadConfig
            | Action::ListKeys
            | Action::Metrics
            | Action::Holders,
        ) => Ok(()),
        _ => Err(Denied::Role),
    }
}

/// What a batch's items may do, as its caller was authenticated: every item is
/// a post of its own, decided by [`decide`] with the item's key and clientId.
#[derive(Debug, Clone)]
pub enum ItemGate {
    /// Auth is off, or the caller is an admin: every item may post.
    Open,
    /// A token's patterns decide item by item.
    Token(TokenRecord),
}

impl ItemGate {
    /// Whether one item, on `key` for `client_id`, may post.
    pub fn decide(&self, key: &str, client_id: &str) -> Result<(), Denied> {
        match self {
            Self::Open => Ok(()),
            Self::Token(token) => decide(
                token,
                &Action::Post {
                    key: Some(key.to_owned()),
                    client_id: Some(client_id.to_owned()),
                },
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use permitd_core::tokens::TokenSpec;

    fn token(role: Role) -> TokenRecord {
        TokenRecord {
            id: 1,
            hash: String::new(),
            created_at_ms: 0,
            spec: TokenSpec {
                name: "t".into(),
                role,
                keys: vec!["acct-*".into()],
                client_ids: vec!["eu-*".into()],
            },
        }
    }

    fn post(key: &str, client_id: &str) -> Action {
        Action::Post {
            key: Some(key.into()),
            client_id: Some(client_id.into()),
        }
    }

    #[test]
    fn runners_stay_within_their_keys_and_client_ids() {
        let runner = token(Role::Runner);
        assert_eq!(decide(&runner, &post("acct-1", "eu-7")), Ok(()));
        assert_eq!(decide(&runner, &post("other", "eu-7")), Err(Denied::Key));
        assert_eq!(
            decide(&runner, &post("acct-1", "us-7")),
            Err(Denied::ClientId)
        );
        let unreadable = Action::Post {
            key: Some("acct-1".into()),
            client_id: None,
        };
        assert_eq!(decide(&runner, &unreadable), Err(Denied::ClientId));
        let usage = Action::Usage {
            key: Some("acct-1".into()),
        };
        assert_eq!(decide(&runner, &usage), Ok(()));
        let own_events = Action::Events {
            key: Some("acct-1".into()),
        };
        assert_eq!(decide(&runner, &own_events), Ok(()));
        let all_events = Action::Events { key: None };
        assert_eq!(decide(&runner, &all_events), Err(Denied::Key));
        for action in [Action::ReadConfig, Action::Metrics, Action::Tokens] {
            assert_eq!(decide(&runner, &action), Err(Denied::Role));
        }
    }

    #[test]
    fn readers_read_and_admins_do_everything() {
        let reader = token(Role::Reader);
        assert_eq!(decide(&reader, &Action::Metrics), Ok(()));
        assert_eq!(decide(&reader, &Action::Events { key: None }), Ok(()));
        assert_eq!(decide(&reader, &post("acct-1", "eu-1")), Err(Denied::Role));
        assert_eq!(decide(&reader, &Action::WriteConfig), Err(Denied::Role));
        let admin = token(Role::Admin);
        assert_eq!(decide(&admin, &Action::Cluster), Ok(()));
    }

    #[test]
    fn a_batch_needs_a_posting_role_and_each_item_is_decided_alone() {
        assert_eq!(
            action_of(&Method::POST, paths::BATCH, None),
            Some(Action::Batch)
        );
        assert_eq!(decide(&token(Role::Runner), &Action::Batch), Ok(()));
        assert_eq!(
            decide(&token(Role::Reader), &Action::Batch),
            Err(Denied::Role)
        );
        let runner = ItemGate::Token(token(Role::Runner));
        assert_eq!(runner.decide("acct-1", "eu-1"), Ok(()));
        assert_eq!(runner.decide("other", "eu-1"), Err(Denied::Key));
        assert_eq!(runner.decide("acct-1", "us-1"), Err(Denied::ClientId));
        assert_eq!(ItemGate::Open.decide("other", "us-1"), Ok(()));
    }

    #[test]
    fn routes_map_to_actions() {
        assert_eq!(action_of(&Method::GET, paths::HEALTHZ, None), None);
        assert_eq!(action_of(&Method::GET, paths::OPENAPI, None), None);
        assert_eq!(action_of(&Method::GET, paths::UI_ASSET, None), None);
        assert_eq!(
            action_of(&Method::DELETE, paths::SEMAPHORE, None),
            Some(Action::WriteConfig),
            "deleting a key is a configuration change"
        );
        assert_eq!(
            action_of(&Method::PUT, paths::SEMAPHORE, None),
            Some(Action::Cluster),
            "an unlisted method on a key is for admins only"
        );
        assert_eq!(
            action_of(&Method::PUT, paths::GROUP, None),
            Some(Action::WriteConfig)
        );
        assert_eq!(
            action_of(&Method::DELETE, paths::TOKEN, None),
            Some(Action::Tokens)
        );
        assert_eq!(
            action_of(&Method::GET, "/cluster/status", None),
            Some(Action::Cluster)
        );
        assert_eq!(
            action_of(&Method::GET, paths::CLUSTER_SHARDS, None),
            Some(Action::Cluster)
        );
    }
}
