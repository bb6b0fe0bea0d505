//! Early reports (docs/protocol.md, "Early reports"): a request's grant
//! reports ride the next entry, at the latest `EARLY_SYNC_WAIT_MAX` after
//! they came, while its demand waits for the key's round; its answer carries
//! their results. A
//! request whose reports could not go ahead is refused whole or fails, and
//! gets no grant.

use permitd_node::leader::rounds::RoundLimits;
use permitd_node::leader::schedule::EARLY_SYNC_WAIT_MAX;
use permitd_sim::scenario::{now, Cluster, Scenario};
use serde_json::{json, Value};

use crate::{
    config, ms, path, pause_followers, report, request, resume_all, take, with_commit_timeout,
    COMMIT_TIMEOUT,
};

const KEY: &str = "early";
/// Long enough that a release applied before it did not wait for the round.
const ROUND_WAIT_MS: u64 = 4_000;

/// A request of `a` that releases `grant_id` and asks for one permit again.
fn release_and_ask(grant_id: &str) -> Value {
    let mut body = request("a", None);
    body["grants"] = report(grant_id, 1);
    body
}

/// The key, of limit 1, held by `a` with its claim confirmed, then
/// configured with `then`. Returns the leader and a's grant id.
async fn held_by_a(cluster: &Cluster, then: Value) -> (u64, String) {
    let leader = cluster.leader().await;
    cluster.configure(leader, KEY, config(1, 1, 1)).await;
    let grant_id = take(cluster, leader, KEY, "a").await.grant_id();
    let claim = json!({"type": "sync", "v": 1, "clientId": "a", "grants": report(&grant_id, 0)});
    let claimed = cluster.post(leader, &path(KEY), &claim).await;
    assert_eq!(
        claimed.body["grantResults"][0]["status"], "ok",
        "{}",
        claimed.body
    );
    cluster.configure(leader, KEY, then).await;
    (leader, grant_id)
}

async fn usage(cluster: &Cluster, leader: u64) -> Value {
    let answer = cluster.get(leader, &format!("{}/usage", path(KEY))).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// Replaces the e2e `a_release_in_a_request_takes_effect_before_the_requests_round`
/// (tests/tests/early_reports.rs): the release goes with an entry of its own
/// once it waited `EARLY_SYNC_WAIT_MAX` (the permit is free within a few ms),
/// not the round's 4 s, and the request's demand waits for its round
/// (`roundWaitMs` later), whose answer carries the release's results and the
/// freed permit.
#[test]
fn a_release_in_a_request_takes_effect_before_the_requests_round() {
    Scenario::new().run(|cluster| async move {
        let slow = config(1, ROUND_WAIT_MS, ROUND_WAIT_MS);
        let (leader, grant_id) = held_by_a(&cluster, slow).await;
        let sent = now();
        let asked = cluster.spawn_post(leader, &path(KEY), &release_and_ask(&grant_id));
        let freed = cluster
            .eventually(EARLY_SYNC_WAIT_MAX + ms(50), || async {
                let usage = usage(&cluster, leader).await;
                (usage["granted"].as_u64(), usage["available"].as_u64()) == (Some(0), Some(1))
            })
            .await;
        assert!(freed, "the release waited for the round");
        assert!(!asked.is_finished(), "answered before its round");

        let answer = asked.await.expect("the call");
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(
            answer.body["grantResults"],
            json!([{"grantId": grant_id, "claimed": 1, "status": "ok"}])
        );
        assert_eq!(answer.granted(), 1, "the freed permit: {}", answer.body);
        let round = sent + ms(1 + ROUND_WAIT_MS);
        assert!(
            answer.at >= round && answer.at <= round + ms(6),
            "{:?}",
            answer.at
        );
    });
}

/// Replaces the e2e `a_request_whose_reports_cannot_go_ahead_is_refused_whole`:
/// with room for one waiting message, a request with reports (two: its sync
/// and its demand) is refused 503 `overloaded`, and its release is not applied.
#[test]
fn a_request_whose_reports_cannot_go_ahead_is_refused_whole() {
    let limits = RoundLimits {
        max_parked_messages: 1,
        ..RoundLimits::default()
    };
    Scenario::new().rounds(limits).run(|cluster| async move {
        let (leader, grant_id) = held_by_a(&cluster, config(1, 1, 1)).await;
        let refused = cluster
            .post(leader, &path(KEY), &release_and_ask(&grant_id))
            .await;
        assert_eq!(
            (refused.status, refused.code()),
            (503, "overloaded"),
            "{}",
            refused.body
        );
        assert_eq!(
            usage(&cluster, leader).await["granted"],
            1,
            "the release was not applied"
        );
        let holders = cluster.get(leader, &format!("{}/holders", path(KEY))).await;
        let a = &holders.body["clients"]["a"];
        assert_eq!(a["grants"].as_array().map(Vec::len), Some(1), "{a}");
        assert_eq!(a["grants"][0]["grantId"], grant_id.as_str(), "{a}");
        assert_eq!(a["waiting"], json!([]), "nothing parked: {a}");
    });
}

/// Replaces the e2e `a_request_whose_early_reports_fail_gets_the_error_and_no_grant`:
/// the early sync's entry (leaving `EARLY_SYNC_WAIT_MAX` after the request)
/// cannot commit (the followers are paused) and the round is not due before
/// the commit timeout, so the request fails with the sync, `no_quorum`, at
/// the commit timeout. Once the followers are back the
/// stuck entry commits: the permit is free and nobody was granted it.
#[test]
fn a_request_whose_early_reports_fail_gets_the_error_and_no_grant() {
    Scenario::new()
        .rounds(with_commit_timeout())
        .run(|cluster| async move {
            let slow = config(1, ROUND_WAIT_MS, ROUND_WAIT_MS);
            let (leader, grant_id) = held_by_a(&cluster, slow).await;
            let followers = pause_followers(&cluster, leader);
            let sent = now();
            let failed = cluster
                .post(leader, &path(KEY), &release_and_ask(&grant_id))
                .await;
            resume_all(&cluster, &followers);
            assert_eq!(
                (failed.status, failed.code()),
                (503, "no_quorum"),
                "{}",
                failed.body
            );
            let timed_out = sent + ms(1) + EARLY_SYNC_WAIT_MAX + COMMIT_TIMEOUT;
            assert!(
                failed.at >= timed_out && failed.at <= timed_out + ms(3),
                "{:?}",
                failed.at
            );

            let settled = cluster
                .eventually(ms(5_000), || async {
                    let answer = cluster.get(leader, &format!("{}/usage", path(KEY))).await;
                    answer.status == 200 && answer.body["granted"] == 0
                })
                .await;
            assert!(settled, "the stuck release never committed");
            let holders = cluster.get(leader, &format!("{}/holders", path(KEY))).await;
            assert_eq!(holders.body["clients"], json!({}), "{}", holders.body);
        });
}
