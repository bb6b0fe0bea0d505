//! Membership changes: in one run in five (drawn from the seed), an operator
//! of its own removes one voter (`changeMembership` to the other two; it may
//! be the leader, which then steps down), and after 0.3–1.5 s adds it back
//! as a learner, which catches up on the log (or a snapshot), and makes it a
//! voter again: the replace-a-node procedure of docs/operations.md on the
//! same id, with the node's data kept. Faults go on meanwhile.
//!
//! Each call is retried until answered (a change may fail for want of a
//! quorum, or be refused while another is in flight), at most
//! [`ATTEMPTS`] times: a run with the node left out still ends, with two
//! voters. Every call and answer is a disturbance ([`Disturbances`]): a
//! leader that removes itself makes an election that nothing else explains.

use std::time::Duration;

use permitd_client::{ClientError, SemaphoreClient};
use permitd_storage::NodeId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{client, failure, now, Shared};
use crate::elections::Disturbances;
use crate::node_host::{host_name, API_PORT, RAFT_PORT};

/// Attempts at each change before the run goes on without it.
const ATTEMPTS: usize = 40;
/// The pause between two attempts.
const RETRY: Duration = Duration::from_millis(150);

struct Members {
    client: SemaphoreClient,
    shared: Shared,
    disturbances: Disturbances,
}

/// The membership operator host: `nodes` voters to begin with.
pub async fn change_members(
    seed: u64,
    nodes: u64,
    shared: Shared,
    disturbances: Disturbances,
) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x006d_656d_6265_7273);
    if !rng.random_bool(0.2) {
        return Ok(());
    }
    let members = Members {
        client: client(&shared.spec.endpoints, seed)?,
        shared: shared.clone(),
        disturbances,
    };
    shared.until_configured().await;
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..3_000))).await;
    let voters: Vec<NodeId> = (1..=nodes).collect();
    let removed = voters[rng.random_range(0..voters.len())];
    let others: Vec<NodeId> = voters.iter().copied().filter(|id| *id != removed).collect();
    if !members
        .change(&format!("voters {others:?}"), || {
            members.client.set_voters(&others)
        })
        .await
    {
        return Ok(());
    }
    tokio::time::sleep(Duration::from_millis(rng.random_range(300..1_500))).await;
    let (api, raft) = (
        format!("{}:{API_PORT}", host_name(removed)),
        format!("{}:{RAFT_PORT}", host_name(removed)),
    );
    let learner = format!("learner node{removed}");
    if members
        .change(&learner, || {
            members.client.add_learner(removed, &api, &raft)
        })
        .await
    {
        members
            .change(&format!("voters {voters:?}"), || {
                members.client.set_voters(&voters)
            })
            .await;
    }
    Ok(())
}

impl Members {
    /// Sends `call` until it is answered; answers whether it was.
    async fn change<F, Fut, T>(&self, what: &str, call: F) -> bool
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        for _ in 0..ATTEMPTS {
            self.disturbances.at(now());
            let result = call().await;
            self.disturbances.at(now());
            match result {
                Ok(_) => {
                    self.event(format_args!("{what}: done"));
                    return true;
                }
                Err(error) => self.event(format_args!("{what}: {}", failure(&error))),
            }
            tokio::time::sleep(RETRY).await;
        }
        false
    }

    fn event(&self, what: impl std::fmt::Display) {
        self.shared.trace.event(now(), "members", what);
    }
}
