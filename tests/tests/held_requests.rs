//! Held requests (docs/protocol.md "Held requests"): a demand request with
//! `waitMs` (and no claim or lease report) that a round leaves empty-handed is not answered with nothing but
//! held until its key is woken — a permit returned, a raised limit — or until
//! its wait is over; without `waitMs` the first round answers it as before.

use std::time::{Duration, Instant};

use permitd_tests::{eventually, wait_for_pending, Cluster, Settings};
use serde_json::{json, Value};

const KEY: &str = "/v1/semaphores/held";

/// The held requests' `waitMs`: the longest allowed, so that a wake that
/// works answers long before the wait would (a slow CI machine took over 5 s).
const HELD_WAIT_MS: u64 = permitd_core::limits::MAX_REQUEST_WAIT_MS;
/// How long a woken request may take to be answered: well under
/// [`HELD_WAIT_MS`], so an answer that came only because the wait ended fails.
const WOKEN_WITHIN: Duration = Duration::from_secs(12);

fn request(client: &str, wait_ms: Option<u64>) -> Value {
    let mut body = json!({"type": "request", "v": 1, "clientId": client,
        "demand": [{"group": "g", "count": 1, "oldestAt": 1}]});
    if let Some(wait_ms) = wait_ms {
        body["waitMs"] = json!(wait_ms);
    }
    body
}

/// A cluster whose key `held` has `limit` and 1 ms rounds; `a` holds its one
/// permit (claimed). Returns the cluster, the leader and a's grant id.
async fn key_taken_by_a(limit: u64) -> (Cluster, u64, String) {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let config = json!({"limit": limit, "roundWaitMs": 1, "roundPeriodMs": 1});
    let answer = cluster.put(leader, &format!("{KEY}/config"), &config).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let mut grant_id = String::new();
    for _ in 0..limit {
        let answer = cluster.post(leader, KEY, &request("a", None)).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        grant_id = answer.body["grants"][0]["grantId"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    (cluster, leader, grant_id)
}

/// Sends `body` in the background; the task ends with (status, answer, when).
fn send_later(
    cluster: &Cluster,
    leader: u64,
    body: Value,
) -> tokio::task::JoinHandle<(u16, Value, Instant)> {
    let http = cluster.http.clone();
    let url = format!("{}{KEY}", cluster.node(leader).url());
    tokio::spawn(async move {
        let response = http.post(url).json(&body).send().await.expect("sent");
        let status = response.status().as_u16();
        let answer = response.json::<Value>().await.expect("json");
        (status, answer, Instant::now())
    })
}

/// Waits (at most [`WOKEN_WITHIN`]) for a held request's answer, which must
/// grant it one permit because `woken_by` happened; returns the answer and
/// when it came.
async fn answered_with_a_permit(
    held: tokio::task::JoinHandle<(u16, Value, Instant)>,
    woken_by: &str,
) -> (Value, Instant) {
    let (status, answer, answered) = tokio::time::timeout(WOKEN_WITHIN, held)
        .await
        .unwrap_or_else(|_| panic!("not answered once {woken_by}"))
        .expect("task");
    assert_eq!(status, 200, "{answer:?}");
    assert_eq!(answer["grants"][0]["permits"], 1, "{answer:?}");
    (answer, answered)
}

/// After rounds that could have answered `held` have been answered: the leader
/// still holds it (a held request counts as pending) and it has no answer.
async fn still_held(
    cluster: &Cluster,
    leader: u64,
    held: &tokio::task::JoinHandle<(u16, Value, Instant)>,
) {
    // A held request rejoins its key's later rounds: while one is in flight the
    // gauge reads 0 for a moment, so wait for it to read 1 again.
    wait_for_pending(cluster, leader, 1).await;
    assert!(!held.is_finished(), "b was answered with nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_is_answered_with_the_permit_once_it_is_released() {
    let (cluster, leader, grant_id) = key_taken_by_a(1).await;
    // Without waitMs: answered by the first round, blocked.
    let at_once = cluster.post(leader, KEY, &request("c", None)).await;
    assert_eq!(at_once.status, 200, "{:?}", at_once.body);
    assert_eq!(at_once.body["grants"], json!([]));
    assert_eq!(at_once.body["blocked"][0]["reason"], "limit");

    let held = send_later(&cluster, leader, request("b", Some(HELD_WAIT_MS)));
    // b has reached the leader before the rounds below.
    wait_for_pending(&cluster, leader, 1).await;
    // Many rounds pass (every message to the key makes one): b is not answered.
    for _ in 0..5 {
        let other = cluster.post(leader, KEY, &request("c", None)).await;
        assert_eq!(other.body["grants"], json!([]), "{:?}", other.body);
    }
    still_held(&cluster, leader, &held).await;

    let released = Instant::now();
    let sync = json!({"type": "sync", "v": 1, "clientId": "a",
        "grants": [{"grantId": grant_id, "claimed": 1, "released": 1}]});
    let synced = cluster.post(leader, KEY, &sync).await;
    assert_eq!(synced.status, 200, "{:?}", synced.body);
    let (_, answered) = answered_with_a_permit(held, "the permit came back").await;
    assert!(answered >= released);
}

/// A request whose grant reports give back everything they claimed awaits
/// nothing but its round, so it is held like pure demand: its release frees
/// the permit with the next entry (the older held request gets it), and its
/// own answer comes with the next permit, carrying the release's results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_gives_back_all_it_claimed_is_held_and_answered_with_its_results() {
    let (cluster, leader, a_grant) = key_taken_by_a(1).await;
    let b = send_later(&cluster, leader, request("b", Some(HELD_WAIT_MS)));
    wait_for_pending(&cluster, leader, 1).await;
    // A round that includes b, or runs after b's own, has been answered: b is
    // held, so it joins a's round ahead of a (not in a round of its own that
    // a's could overtake while it is in flight).
    let other = cluster.post(leader, KEY, &request("c", None)).await;
    assert_eq!(other.body["grants"], json!([]), "{:?}", other.body);
    still_held(&cluster, leader, &b).await;

    let mut release_and_ask = request("a", Some(HELD_WAIT_MS));
    release_and_ask["demand"][0]["oldestAt"] = json!(2);
    release_and_ask["grants"] = json!([{"grantId": a_grant, "claimed": 1, "released": 1}]);
    let a = send_later(&cluster, leader, release_and_ask);
    let (answer, _) = answered_with_a_permit(b, "a gave its permit back").await;
    let b_grant = answer["grants"][0]["grantId"].as_str().unwrap().to_owned();
    still_held(&cluster, leader, &a).await;

    let sync = json!({"type": "sync", "v": 1, "clientId": "b",
        "grants": [{"grantId": b_grant, "claimed": 1, "released": 1}]});
    let synced = cluster.post(leader, KEY, &sync).await;
    assert_eq!(synced.status, 200, "{:?}", synced.body);
    let (answer, _) = answered_with_a_permit(a, "b gave the permit back").await;
    assert_eq!(
        answer["grantResults"],
        json!([{"grantId": a_grant, "claimed": 1, "status": "ok"}]),
        "{answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_limit_wakes_held_requests_and_an_expired_wait_answers_empty() {
    let (cluster, leader, _) = key_taken_by_a(1).await;
    let sent = Instant::now();
    let short = send_later(&cluster, leader, request("s", Some(400)));
    let (status, answer, answered) = short.await.expect("task");
    assert_eq!(status, 200, "{answer:?}");
    assert_eq!(answer["grants"], json!([]), "nothing freed: answered empty");
    assert!(
        answered.duration_since(sent) >= Duration::from_millis(400),
        "held until its wait was over"
    );

    let held = send_later(&cluster, leader, request("b", Some(HELD_WAIT_MS)));
    wait_for_pending(&cluster, leader, 1).await;
    // A round that includes b, or runs after b's own, has been answered.
    let other = cluster.post(leader, KEY, &request("c", None)).await;
    assert_eq!(other.body["grants"], json!([]), "{:?}", other.body);
    still_held(&cluster, leader, &held).await;
    let config = json!({"limit": 2, "roundWaitMs": 1, "roundPeriodMs": 1});
    let answer = cluster.put(leader, &format!("{KEY}/config"), &config).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    answered_with_a_permit(held, "the limit was raised").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_beyond_the_bound_is_refused_and_changes_nothing() {
    let (cluster, leader, _) = key_taken_by_a(1).await;
    let refused = cluster
        .post(leader, KEY, &request("b", Some(HELD_WAIT_MS + 1)))
        .await;
    assert_eq!(refused.status, 400, "{:?}", refused.body);
    assert_eq!(refused.body["error"]["field"], "waitMs");
}

/// A request whose caller went away before its round is left out of it: the
/// permit freed meanwhile stays free instead of going, unclaimed, to nobody
/// for the whole claim deadline (docs/protocol.md, "request").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_caller_went_away_is_granted_nothing() {
    let (cluster, leader, grant_id) = key_taken_by_a(1).await;
    // Rounds 2 s apart: b's request waits that long for its round.
    let config = json!({"limit": 1, "roundWaitMs": 2_000, "roundPeriodMs": 2_000});
    let configured = cluster.put(leader, &format!("{KEY}/config"), &config).await;
    assert_eq!(configured.status, 200, "{:?}", configured.body);
    let gone = send_later(&cluster, leader, request("b", None));
    wait_for_pending(&cluster, leader, 1).await;
    gone.abort(); // drops the call, which closes its connection
    let sync = json!({"type": "sync", "v": 1, "clientId": "a",
        "grants": [{"grantId": grant_id, "claimed": 1, "released": 1}]});
    let synced = cluster.post(leader, KEY, &sync).await;
    assert_eq!(synced.status, 200, "{:?}", synced.body);
    let left_out = eventually(Duration::from_secs(15), || async {
        cluster
            .metric_total(leader, "permitd_requests_abandoned_total")
            .await
            .unwrap_or(0.0)
            >= 1.0
    })
    .await;
    assert!(left_out, "b's request was left out of its round");
    let usage = cluster.usage(leader, "held").await;
    assert_eq!(usage["granted"], 0, "{usage}");
}
