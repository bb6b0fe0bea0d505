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

/// The answer of `GET /readyz` once a leader is known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Readiness {
    /// Always `ready`: a node without a leader answers 503 `no_quorum` instead.
    pub status: ReadyStatus,
    /// The leader this node knows of.
    pub leader: NodeId,
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
        };
        let ready = serde_json::to_value(ready).unwrap();
        assert_eq!(ready, serde_json::json!({"status": "ready", "leader": 2}));
    }
}
