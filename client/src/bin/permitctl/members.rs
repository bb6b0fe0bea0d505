//! `permitctl members list | add | promote | remove`: the cluster's membership.
//!
//! `add` joins a node as a learner (it answers once the learner has caught up),
//! `promote` makes a member a voter, `remove` drops a voter. Promote and remove
//! read the current voters and propose the whole new set, so run one change at a
//! time: two concurrent edits would each start from the same set. Membership
//! calls need the cluster secret and go to the leader (any node forwards).

use std::collections::BTreeSet;

use clap::Subcommand;
use permitd_client::{ClusterStatus, MemberRole, SemaphoreClient};

use super::{print, table, CliResult};

#[derive(Debug, Subcommand)]
pub enum MembersCommand {
    /// Every member with its role, as the asked node sees them.
    List,
    /// Adds a node (started with a fresh data dir) as a learner.
    Add {
        id: u64,
        /// Its `host:port` API address.
        api_addr: String,
        /// Its `host:port` Raft address, as peers reach it.
        raft_addr: String,
    },
    /// Makes a member (a caught-up learner) a voter.
    Promote { id: u64 },
    /// Removes a voter, for instance a dead node being replaced.
    Remove { id: u64 },
}

pub async fn run(client: &SemaphoreClient, json: bool, command: MembersCommand) -> CliResult {
    let status = match command {
        MembersCommand::List => client.cluster_status().await?,
        MembersCommand::Add {
            id,
            api_addr,
            raft_addr,
        } => client.add_learner(id, &api_addr, &raft_addr).await?,
        MembersCommand::Promote { id } => {
            let mut voters = voters(&client.cluster_status().await?);
            if !voters.insert(id) {
                return Err(format!("node {id} is a voter already").into());
            }
            client.set_voters(&Vec::from_iter(voters)).await?
        }
        MembersCommand::Remove { id } => {
            let mut voters = voters(&client.cluster_status().await?);
            if !voters.remove(&id) {
                return Err(format!("node {id} is not a voter").into());
            }
            if voters.is_empty() {
                return Err("the last voter cannot be removed".into());
            }
            client.set_voters(&Vec::from_iter(voters)).await?
        }
    };
    print(json, &status.members, || members_table(&status))
}

fn voters(status: &ClusterStatus) -> BTreeSet<u64> {
    status
        .members
        .iter()
        .filter(|member| member.role == MemberRole::Voter)
        .map(|member| member.id)
        .collect()
}

fn members_table(status: &ClusterStatus) -> String {
    let rows: Vec<Vec<String>> = status
        .members
        .iter()
        .map(|member| {
            let leader = if status.leader == Some(member.id) {
                "leader"
            } else {
                ""
            };
            vec![
                member.id.to_string(),
                member.addr.clone(),
                member.role.as_str().to_string(),
                leader.to_string(),
            ]
        })
        .collect();
    table(&["ID", "ADDR", "ROLE", ""], &rows)
}
