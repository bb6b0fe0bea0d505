//! The election guard (`node/src/raft/election_guard.rs`): a node that was
//! away (paused, cut off, restarted) and comes back never deposes a healthy
//! leader, with the shipped Raft timings (heartbeats every 40 ms, elections
//! 120–240 ms: `RaftTimings::default()`, as in `cluster.toml`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use permitd_sim::scenario::{Cluster, Scenario};
use serde_json::json;

use crate::{ms, path, release, request};

/// How long a node is away: well past the leader lease plus the election
/// timeout (360–480 ms), so its election timer is overdue when it is back.
const AWAY: Duration = Duration::from_secs(2);

/// Light load on the leader until `stop`: a permit taken and given back every
/// 20 ms. Ends with the answers that were not 200.
fn light_load(
    cluster: &Cluster,
    leader: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    let cluster = cluster.clone();
    tokio::spawn(async move {
        let mut failures = Vec::new();
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            round += 1;
            let client = format!("light-{}", round % 4);
            let mut body = request(&client, None);
            body["demand"][0]["oldestAt"] = json!(round);
            let answer = cluster.post(leader, &path("steady"), &body).await;
            if answer.status != 200 {
                failures.push(format!("{} {}", answer.status, answer.body));
            }
            if answer.granted() == 1 {
                let released = cluster
                    .post(
                        leader,
                        &path("steady"),
                        &release(&client, &answer.grant_id()),
                    )
                    .await;
                if released.status != 200 {
                    failures.push(format!("{} {}", released.status, released.body));
                }
            }
            tokio::time::sleep(ms(20)).await;
        }
        failures
    })
}

/// `(leader, term)` as node `id` reports them.
async fn leader_and_term(cluster: &Cluster, id: u64) -> (Option<u64>, Option<u64>) {
    match cluster.status(id).await {
        Some(status) => (status.leader, Some(status.term)),
        None => (None, None),
    }
}

/// Whether node `id` names a leader and has applied what `leader` has.
async fn caught_up(cluster: &Cluster, id: u64, leader: u64) -> bool {
    let (theirs, ours) = (cluster.status(id).await, cluster.status(leader).await);
    match (theirs, ours) {
        (Some(theirs), Some(ours)) => {
            theirs.leader.is_some() && theirs.last_applied == ours.last_applied
        }
        _ => false,
    }
}

/// Each follower in turn is kept away for [`AWAY`] (`away` starts it,
/// `back` ends it) under light load: it catches up, and the leader and its
/// term never change; no request sees a leader change.
fn away_and_back_keeps_the_leader(away: fn(&Cluster, u64), back: fn(&Cluster, u64)) {
    Scenario::new().run(move |cluster| async move {
        let leader = cluster.leader().await;
        let (_, term) = leader_and_term(&cluster, leader).await;
        let stop = Arc::new(AtomicBool::new(false));
        let load = light_load(&cluster, leader, stop.clone());
        let followers = cluster.others(leader);
        for turn in 0..4 {
            let follower = followers[turn % followers.len()];
            away(&cluster, follower);
            tokio::time::sleep(AWAY).await;
            back(&cluster, follower);
            let back_in = cluster
                .eventually(ms(2_000), || caught_up(&cluster, follower, leader))
                .await;
            assert!(back_in, "turn {turn}: node {follower} did not catch up");
            for id in [leader, follower] {
                assert_eq!(
                    leader_and_term(&cluster, id).await,
                    (Some(leader), term),
                    "turn {turn}: node {id} names another leader or term after node {follower} came back"
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        let failures = load.await.expect("the load");
        assert_eq!(failures, Vec::<String>::new(), "no request saw a leader change");
    });
}

/// A follower whose links hold everything for 2 s (then deliver it in a
/// burst), back, does not depose the leader. This does not replace
/// `tests/tests/steady_leader.rs`, which SIGSTOPs a real follower: a held link
/// leaves the node's own timers running, so the guard's rule for a node that
/// was itself stalled (its overdue timer firing before it reads the
/// heartbeats waiting for it) is not exercised here.
#[test]
fn a_paused_follower_back_after_2_s_does_not_depose_the_leader() {
    away_and_back_keeps_the_leader(Cluster::pause, Cluster::resume);
}

/// The same with a follower whose links drop everything for 2 s: its
/// pre-votes are lost, and once back it rejoins the leader's term.
#[test]
fn a_follower_cut_off_for_2_s_does_not_depose_the_leader() {
    away_and_back_keeps_the_leader(Cluster::cut_off, Cluster::reconnect);
}

/// A follower cut off from the leader alone (it still reaches the other
/// follower) for 2 s never stands: its pre-vote is refused by a voter that
/// hears the leader, so its term stays, and once the link is back the leader
/// goes on in its term. (A guard whose voters grant while they hear a leader
/// fails here: the follower stands in a higher term, which deposes the leader
/// when the link is back.)
#[test]
fn a_follower_cut_off_from_the_leader_alone_never_stands() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        let (_, term) = leader_and_term(&cluster, leader).await;
        let follower = cluster.others(leader)[0];
        cluster.partition(follower, leader);
        tokio::time::sleep(AWAY).await;
        assert_eq!(
            leader_and_term(&cluster, follower).await.1,
            term,
            "the cut-off follower stood for election"
        );
        cluster.repair(follower, leader);
        let back_in = cluster
            .eventually(ms(2_000), || caught_up(&cluster, follower, leader))
            .await;
        assert!(back_in, "node {follower} did not catch up");
        for id in cluster.nodes() {
            assert_eq!(
                leader_and_term(&cluster, id).await,
                (Some(leader), term),
                "node {id}"
            );
        }
    });
}

/// Replaces the e2e `a_restarted_follower_rejoins_without_an_election`
/// (tests/tests/restarts.rs): a follower restarted after the leader gave up
/// calling it for a while hears from the leader before its election timer
/// runs out, and does not stand for election on its stale log (which bumps
/// the term and makes openraft delay that node's next election). Each restart
/// lands at another point of the leader's retry pause.
#[test]
fn a_restarted_follower_rejoins_without_an_election() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        let follower = cluster.others(leader)[0];
        for restart in 0..3u64 {
            cluster.crash(follower).await;
            tokio::time::sleep(ms(1_200 + 170 * restart)).await;
            let (_, term) = leader_and_term(&cluster, leader).await;
            // Committed while the follower is down (the other two are a quorum).
            cluster
                .configure(leader, &format!("rejoin-{restart}"), json!({"limit": 1}))
                .await;
            cluster.restart(follower).await;
            let back_in = cluster
                .eventually(ms(3_000), || caught_up(&cluster, follower, leader))
                .await;
            assert!(back_in, "restart {restart}: the follower did not catch up");
            assert_eq!(
                leader_and_term(&cluster, follower).await,
                (Some(leader), term),
                "restart {restart}: an election"
            );
        }
    });
}
