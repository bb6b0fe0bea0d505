//! Every route of the node, as the template axum's router takes (`{key}` marks
//! a path parameter). The client fills the same templates with [`segments`], so
//! both sides read one spelling.

/// `GET`: every key with state, with its usage, paged ([`super::KeyList`]).
pub const SEMAPHORES: &str = "/v1/semaphores";
/// `POST`: a `request` or `sync` message ([`crate::contract::protocol::SemaphoreRequest`]).
pub const SEMAPHORE: &str = "/v1/semaphores/{key}";
/// `POST`: many `request`/`sync` messages, for many keys, in one call
/// ([`crate::contract::batch::BatchRequest`]).
pub const BATCH: &str = "/v1/batch";
/// `GET`: the key's linearizable usage ([`crate::Usage`]).
pub const USAGE: &str = "/v1/semaphores/{key}/usage";
/// `GET` the key's effective configuration, `PUT` a replacement.
pub const KEY_CONFIG: &str = "/v1/semaphores/{key}/config";
/// `PUT` one group's cap and permission, `DELETE` to drop them.
pub const GROUP: &str = "/v1/semaphores/{key}/groups/{group}";
/// `GET`: who holds the key's grants and leases and who waits
/// ([`crate::engine::holders::KeyHolders`]).
pub const HOLDERS: &str = "/v1/semaphores/{key}/holders";
/// `POST` (admin): drops one client's footprint on the key
/// ([`crate::engine::force_release::ForceReleased`]).
pub const CLIENT_RELEASE: &str = "/v1/semaphores/{key}/clients/{clientId}/release";

/// `GET`: lifecycle events as Server-Sent Events, from this node's applied
/// entries (`?key=&from=`, [`super::event_stream`]).
pub const EVENTS: &str = "/v1/events";

/// `GET`: the dashboard page (open: it holds no data; its scripts call the API
/// with the operator's token).
pub const UI: &str = "/ui";
/// `GET`: the dashboard's script and style sheet.
pub const UI_ASSET: &str = "/ui/{asset}";

/// `GET`: this node's view of the cluster ([`super::ClusterStatus`]).
pub const CLUSTER_STATUS: &str = "/cluster/status";
/// `GET`: this node's view of every shard and its leader ([`super::ShardMap`]).
pub const CLUSTER_SHARDS: &str = "/cluster/shards";
/// `POST {}`: makes every node of the config file a voter of a new cluster.
pub const CLUSTER_INIT: &str = "/cluster/init";
/// `POST`: adds a learner or changes the voters ([`super::MembershipChange`]).
pub const CLUSTER_MEMBERS: &str = "/cluster/members";
/// `PUT`: replaces the replicated defaults of keys without a configuration.
pub const CLUSTER_DEFAULTS: &str = "/cluster/defaults";

/// `POST` an API token (admin; the secret is answered once), `GET` the list
/// without secrets ([`crate::tokens`]).
pub const TOKENS: &str = "/v1/tokens";
/// `DELETE`: revokes one API token.
pub const TOKEN: &str = "/v1/tokens/{id}";
/// `GET`: a backup of the leader's applied state ([`crate::engine::restore::BackupFile`]).
pub const CLUSTER_SNAPSHOT: &str = "/cluster/snapshot";
/// `POST` a backup file into a new cluster (to the leader's Raft listener).
pub const CLUSTER_RESTORE: &str = "/cluster/restore";

/// Prometheus text.
pub const METRICS: &str = "/metrics";
/// Liveness: answers while the process serves HTTP.
pub const HEALTHZ: &str = "/healthz";
/// Readiness: 200 while the node can answer v1 calls, else 503 with the error
/// such a call would get.
pub const READYZ: &str = "/readyz";
/// `GET`: the OpenAPI 3.1 document of every route above (open, like the probes).
pub const OPENAPI: &str = "/openapi.json";

/// Every route above, for documentation and for checks that each is described.
pub const ALL: [&str; 24] = [
    SEMAPHORES,
    SEMAPHORE,
    BATCH,
    USAGE,
    KEY_CONFIG,
    GROUP,
    HOLDERS,
    CLIENT_RELEASE,
    EVENTS,
    UI,
    UI_ASSET,
    CLUSTER_STATUS,
    CLUSTER_SHARDS,
    CLUSTER_INIT,
    CLUSTER_MEMBERS,
    CLUSTER_DEFAULTS,
    TOKENS,
    TOKEN,
    CLUSTER_SNAPSHOT,
    CLUSTER_RESTORE,
    METRICS,
    HEALTHZ,
    READYZ,
    OPENAPI,
];

/// The segments of `template` with its `{…}` parameters replaced, in order, by
/// `params`; the caller percent-encodes each segment (a key may hold `/`).
///
/// # Panics
/// When `params` has fewer values than `template` has parameters: a programming
/// error of the caller, never a matter of input.
pub fn segments(template: &str, params: &[&str]) -> Vec<String> {
    let mut params = params.iter();
    let filled: Vec<String> = template
        .trim_start_matches('/')
        .split('/')
        .map(|segment| {
            if segment.starts_with('{') && segment.ends_with('}') {
                let value = params.next().expect("a value for every path parameter");
                (*value).to_owned()
            } else {
                segment.to_owned()
            }
        })
        .collect();
    assert!(params.next().is_none(), "more values than path parameters");
    filled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_fill_whole_segments() {
        assert_eq!(
            segments(GROUP, &["acct/1", "wf 1"]),
            ["v1", "semaphores", "acct/1", "groups", "wf 1"]
        );
        assert_eq!(segments(CLUSTER_STATUS, &[]), ["cluster", "status"]);
    }

    #[test]
    #[should_panic(expected = "a value for every path parameter")]
    fn a_missing_parameter_is_a_programming_error() {
        segments(USAGE, &[]);
    }
}
