//! Held requests (docs/protocol.md, "Held requests"): a demand request with
//! `waitMs` that a round leaves empty-handed is held until its key is woken (a
//! permit returned, a raised limit) or its wait is over; without `waitMs` the
//! first round answers it as it is.

use permitd_sim::scenario::{now, Answer, Cluster, Scenario};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::{config, last_log_index, ms, path, release, report, request, take};

const KEY: &str = "held";
/// A held request's `waitMs`: the longest allowed, far longer than any wake takes.
const HELD_WAIT_MS: u64 = permitd_core::limits::MAX_REQUEST_WAIT_MS;
/// From the release's answer to the held request's: the release's entry, or
/// the round right after it, commits (1 ms rounds, 1 ms links: a few ms).
const WOKEN_WITHIN: std::time::Duration = ms(10);

/// The key's one permit granted to a, and b's request held for it: the
/// leader, a's grant id, and b's call.
async fn a_holds_the_permit_and_b_is_held(cluster: &Cluster) -> (u64, String, JoinHandle<Answer>) {
    let leader = cluster.leader().await;
    cluster.configure(leader, KEY, config(1, 1, 1)).await;
    let a_grant = take(cluster, leader, KEY, "a").await.grant_id();
    let b = cluster.spawn_post(leader, &path(KEY), &request("b", Some(HELD_WAIT_MS)));
    tokio::time::sleep(ms(10)).await;
    assert_eq!(cluster.waiting(leader, KEY).await, 1, "b is held");
    (leader, a_grant, b)
}

/// `client` releases `grant_id`; the held request `waiting` is then granted
/// (see [`granted_soon_after`]).
async fn granted_after_release(
    cluster: &Cluster,
    leader: u64,
    (client, grant_id): (&str, &str),
    waiting: JoinHandle<Answer>,
) -> Answer {
    let synced = cluster
        .post(leader, &path(KEY), &release(client, grant_id))
        .await;
    granted_soon_after(&synced, waiting).await
}

/// The held request `waiting` is granted its permit within [`WOKEN_WITHIN`]
/// of `waking`'s answer (a release, a raised limit).
async fn granted_soon_after(waking: &Answer, waiting: JoinHandle<Answer>) -> Answer {
    assert_eq!(waking.status, 200, "{}", waking.body);
    let granted = waiting.await.expect("the held call");
    assert_eq!(granted.granted(), 1, "{}", granted.body);
    assert!(
        granted.at <= waking.at + WOKEN_WITHIN,
        "granted at {:?}, woken at {:?}",
        granted.at,
        waking.at
    );
    granted
}

/// Replaces the e2e `a_held_request_is_answered_with_the_permit_once_it_is_released`
/// (tests/tests/held_requests.rs). A request without `waitMs` is answered by
/// the first round, blocked; one with it stays held through rounds that have
/// nothing for it, and is granted in the first round after the release that
/// frees a permit.
#[test]
fn a_held_request_is_granted_in_the_first_round_after_the_release() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        cluster.configure(leader, KEY, config(1, 1, 1)).await;
        let a_grant = take(&cluster, leader, KEY, "a").await.grant_id();
        let at_once = cluster.post(leader, &path(KEY), &request("c", None)).await;
        assert_eq!(at_once.body["grants"], json!([]), "{}", at_once.body);
        assert_eq!(at_once.body["blocked"][0]["reason"], "limit");

        let held = cluster.spawn_post(leader, &path(KEY), &request("b", Some(HELD_WAIT_MS)));
        tokio::time::sleep(ms(10)).await;
        for _ in 0..5 {
            let other = cluster.post(leader, &path(KEY), &request("c", None)).await;
            assert_eq!(other.body["grants"], json!([]), "{}", other.body);
        }
        assert_eq!(cluster.waiting(leader, KEY).await, 1, "b is held");
        assert!(!held.is_finished(), "b was answered with nothing");

        granted_after_release(&cluster, leader, ("a", &a_grant), held).await;
    });
}

/// A request that a round now could not serve (the key is full, and nothing
/// freed permits since its last round) is held on arrival: no round, so no
/// log entry. A release then serves the held requests oldest first.
#[test]
fn a_request_no_round_could_serve_is_held_on_arrival_without_an_entry() {
    Scenario::new().run(|cluster| async move {
        let (leader, a_grant, b) = a_holds_the_permit_and_b_is_held(&cluster).await;

        let before = last_log_index(&cluster, leader).await;
        let c = cluster.spawn_post(leader, &path(KEY), &request("c", Some(HELD_WAIT_MS)));
        tokio::time::sleep(ms(10)).await;
        assert_eq!(cluster.waiting(leader, KEY).await, 2, "c is held too");
        assert_eq!(
            last_log_index(&cluster, leader).await,
            before,
            "no round ran"
        );
        assert!(!c.is_finished(), "c was answered with nothing");

        // b, older, gets a's permit.
        let b = granted_after_release(&cluster, leader, ("a", &a_grant), b).await;
        tokio::time::sleep(ms(10)).await;
        assert!(!c.is_finished(), "c waits for the next release");
        granted_after_release(&cluster, leader, ("b", &b.grant_id()), c).await;
    });
}

/// Replaces the e2e `a_request_that_gives_back_all_it_claimed_is_held_and_answered_with_its_results`.
/// A request whose reports give back all they claimed is held like pure
/// demand: its release frees the permit with the next entry (the older held
/// request gets it), and its own answer comes with the next permit, carrying
/// the release's results.
#[test]
fn a_request_that_gives_back_all_it_claimed_is_held_and_answered_with_its_results() {
    Scenario::new().run(|cluster| async move {
        let (leader, a_grant, b) = a_holds_the_permit_and_b_is_held(&cluster).await;

        let mut release_and_ask = request("a", Some(HELD_WAIT_MS));
        release_and_ask["demand"][0]["oldestAt"] = json!(2);
        release_and_ask["grants"] = report(&a_grant, 1);
        let a = cluster.spawn_post(leader, &path(KEY), &release_and_ask);
        let b = b.await.expect("b's call");
        assert_eq!(b.granted(), 1, "b, older, gets a's permit: {}", b.body);
        tokio::time::sleep(ms(10)).await;
        assert_eq!(cluster.waiting(leader, KEY).await, 1, "a is held");
        assert!(!a.is_finished(), "a was answered with nothing");

        let a = granted_after_release(&cluster, leader, ("b", &b.grant_id()), a).await;
        assert_eq!(
            a.body["grantResults"],
            json!([{"grantId": a_grant, "claimed": 1, "status": "ok"}]),
            "{}",
            a.body
        );
    });
}

/// Replaces the e2e `a_raised_limit_wakes_held_requests_and_an_expired_wait_answers_empty`.
/// A request whose `waitMs` runs out with nothing freed is answered, empty,
/// at `waitMs`; a raised limit wakes a held request at once.
#[test]
fn an_expired_wait_is_answered_empty_at_wait_ms_and_a_raised_limit_wakes_at_once() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        cluster.configure(leader, KEY, config(1, 1, 1)).await;
        take(&cluster, leader, KEY, "a").await;
        let sent = now();
        let short = cluster
            .post(leader, &path(KEY), &request("s", Some(400)))
            .await;
        assert_eq!(short.status, 200, "{}", short.body);
        assert_eq!(
            short.body["grants"],
            json!([]),
            "nothing freed: answered empty"
        );
        let waited = short.at - sent;
        // The wait counts from its arrival (1 ms after sending); the round that
        // answers it leaves then and commits within a few ms.
        assert!(
            waited >= ms(400) && waited <= ms(410),
            "answered after {waited:?}, not at its waitMs"
        );

        let held = cluster.spawn_post(leader, &path(KEY), &request("b", Some(HELD_WAIT_MS)));
        tokio::time::sleep(ms(10)).await;
        assert_eq!(cluster.waiting(leader, KEY).await, 1, "b is held");
        let raised = cluster
            .put(leader, &format!("{}/config", path(KEY)), &config(2, 1, 1))
            .await;
        granted_soon_after(&raised, held).await;
    });
}

/// Replaces the e2e `a_wait_beyond_the_bound_is_refused_and_changes_nothing`.
#[test]
fn a_wait_beyond_the_bound_is_refused_naming_wait_ms() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        let bound = permitd_core::limits::MAX_REQUEST_WAIT_MS;
        let refused = cluster
            .post(leader, &path(KEY), &request("b", Some(bound + 1)))
            .await;
        assert_eq!(refused.status, 400, "{}", refused.body);
        assert_eq!(refused.body["error"]["field"], "waitMs");
        assert_eq!(cluster.waiting(leader, KEY).await, 0, "nothing parked");
    });
}

/// Replaces the e2e `a_request_whose_caller_went_away_is_granted_nothing`.
/// A request whose caller closed its connection before its round is left
/// out of it: the permit freed meanwhile stays free instead of going,
/// unclaimed, to nobody until its claim deadline (docs/protocol.md, "request").
#[test]
fn a_request_whose_caller_went_away_is_granted_nothing() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        cluster.configure(leader, KEY, config(1, 1, 1)).await;
        let a_grant = take(&cluster, leader, KEY, "a").await.grant_id();
        cluster
            .configure(leader, KEY, config(1, 2_000, 2_000))
            .await;
        let gone = cluster.spawn_post(leader, &path(KEY), &request("b", None));
        tokio::time::sleep(ms(10)).await;
        assert_eq!(cluster.waiting(leader, KEY).await, 1, "b is parked");
        gone.abort(); // drops the call, which closes its connection
        let synced = cluster
            .post(leader, &path(KEY), &release("a", &a_grant))
            .await;
        assert_eq!(synced.status, 200, "{}", synced.body);
        // Past b's round (2 s after it arrived).
        tokio::time::sleep(ms(2_100)).await;
        assert_eq!(cluster.waiting(leader, KEY).await, 0, "b's round ran");
        let usage = cluster.get(leader, &format!("{}/usage", path(KEY))).await;
        assert_eq!(usage.body["granted"], 0, "{}", usage.body);
    });
}
