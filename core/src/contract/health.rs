//! `/healthz` and `/readyz`: the open probes a supervisor or load balancer asks.

use serde::{Deserialize, Serialize};

use super::cluster::NodeId;

/// The answer of `GET /healthz` while the node's Raft core runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok`: an unhealthy node answers 503 `shutting_down` instead.
    pub status: HealthStatus,
}

/// The one value of [`Health::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum HealthStatus {
    Ok,
}

/// The answer of `GET /readyz` while the node can answer v1 calls (writes and
/// linearizable reads). A node that cannot answers 503 with the error such a
/// call would get now: `no_quorum` (no leader known, or the leader cannot
/// commit) or `timeout` (a follower that cannot reach its leader; the answer
/// names the leader in `x-permitd-leader`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Readiness {
    /// Always `ready`.
    pub status: ReadyStatus,
    /// The leader this node knows of.
    pub leader: NodeId,
    /// How it answers v1 calls. Absent from nodes older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<Serving>,
}

/// How a ready node answers v1 calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum Serving {
    /// It leads: it answers them itself.
    Local,
    /// It forwards them to the leader, which its last call or probe reached
    /// (probes run every `rpc_timeout_ms` while no call does).
    Forwarded,
}

/// The one value of [`Readiness::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum ReadyStatus {
    Ready,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_keep_their_documented_shape() {
        let health = serde_json::to_value(Health {
            status: HealthStatus::Ok,
        })
        .unwrap();
        assert_eq!(health, serde_json::json!({"status": "ok"}));
        let ready = Readiness {
            status: ReadyStatus::Ready,
            leader: 2,
            serving: Some(Serving::Forwarded),
        };
        let ready = serde_json::to_value(ready).unwrap();
        let expected = serde_json::json!({"status": "ready", "leader": 2, "serving": "forwarded"});
        assert_eq!(ready, expected);
        let older: Readiness =
            serde_json::from_value(serde_json::json!({"status": "ready", "leader": 2})).unwrap();
        assert_eq!(older.serving, None);
    }
}
