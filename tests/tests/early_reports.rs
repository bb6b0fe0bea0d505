//! Early reports (docs/protocol.md, "Early reports"): a request's grant
//! reports are applied with the next entry, as a sync's would be, while its
//! demand waits for the key's round; its answer carries their results. A
//! request whose reports could not go ahead is refused whole or fails, and
//! gets no grant.

use std::time::Duration;

use permitd_tests::{eventually, granted, request, Cluster, Settings};
use serde_json::{json, Value};

const PATH: &str = "/v1/semaphores/early";
/// Long enough that a release seen applied did not wait for the round.
const ROUND_WAIT_MS: u64 = 4_000;
const COMMIT_TIMEOUT_MS: u64 = 1_000;

fn slow_rounds() -> Value {
    json!({"limit": 1, "roundWaitMs": ROUND_WAIT_MS, "roundPeriodMs": ROUND_WAIT_MS})
}

/// A grant report of `grant_id` with one permit claimed and `released`.
fn report(grant_id: &str, released: u64) -> Value {
    json!([{"grantId": grant_id, "claimed": 1, "released": released}])
}

/// A request of `a` that releases `grant_id` and asks for one permit again.
fn release_and_ask(grant_id: &str) -> Value {
    let mut body = request("a", &[("g", 1, 1)]);
    body["grants"] = report(grant_id, 1);
    body
}

async fn configure(cluster: &Cluster, leader: u64, config: &Value) {
    let answer = cluster.put(leader, &format!("{PATH}/config"), config).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}

/// A cluster whose key has limit 1, held by `a` with its claim confirmed,
/// then configured with `then` (rounds far apart). Returns the leader and
/// a's grant id.
async fn held_by_a(cluster: &Cluster, then: &Value) -> (u64, String) {
    let leader = cluster.wait_for_leader().await;
    configure(
        cluster,
        leader,
        &json!({"limit": 1, "roundWaitMs": 1, "roundPeriodMs": 1}),
    )
    .await;
    let answer = cluster
        .post(leader, PATH, &request("a", &[("g", 1, 1)]))
        .await;
    assert_eq!(granted(&answer.body), 1, "{}", answer.body);
    let grant_id = answer.body["grants"][0]["grantId"]
        .as_str()
        .expect("a grant id")
        .to_owned();
    let claim = json!({"type": "sync", "v": 1, "clientId": "a", "grants": report(&grant_id, 0)});
    let claimed = cluster.post(leader, PATH, &claim).await;
    assert_eq!(
        claimed.body["grantResults"][0]["status"], "ok",
        "{}",
        claimed.body
    );
    configure(cluster, leader, then).await;
    (leader, grant_id)
}

async fn granted_now(cluster: &Cluster, leader: u64) -> u64 {
    cluster.usage(leader, "early").await["granted"]
        .as_u64()
        .expect("granted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_a_request_takes_effect_before_the_requests_round() {
    let cluster = Cluster::start(Settings::default()).await;
    let (leader, grant_id) = held_by_a(&cluster, &slow_rounds()).await;
    let http = cluster.http.clone();
    let url = format!("{}{PATH}", cluster.node(leader).url());
    let body = release_and_ask(&grant_id);
    let asked = tokio::spawn(async move {
        let response = http.post(url).json(&body).send().await.expect("sent");
        (
            response.status().as_u16(),
            response.json::<Value>().await.expect("json"),
        )
    });

    let returned = eventually(Duration::from_millis(ROUND_WAIT_MS / 2), || async {
        let usage = cluster.usage(leader, "early").await;
        usage["granted"] == 0 && usage["available"] == 1
    })
    .await;
    assert!(returned, "the release waited for the round");
    assert!(!asked.is_finished(), "answered before its round");
    let early = cluster.metric(leader, "permitd_early_reports_total").await;
    assert_eq!(early, Some(1.0));

    let (status, answer) = asked.await.expect("task");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["grantResults"],
        json!([{"grantId": grant_id, "claimed": 1, "status": "ok"}])
    );
    assert_eq!(granted(&answer), 1, "the freed permit: {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_reports_cannot_go_ahead_is_refused_whole() {
    // Room for one waiting message: a request with reports needs two.
    let settings = Settings {
        extra_toml: "[limits]\nmax_parked_messages = 1\n".into(),
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let fast = json!({"limit": 1, "roundWaitMs": 1, "roundPeriodMs": 1});
    let (leader, grant_id) = held_by_a(&cluster, &fast).await;
    let refused = cluster
        .post(leader, PATH, &release_and_ask(&grant_id))
        .await;
    assert_eq!(
        (refused.status, refused.code()),
        (503, "overloaded"),
        "{}",
        refused.body
    );
    assert_eq!(
        granted_now(&cluster, leader).await,
        1,
        "the release was not applied"
    );
    let holders = cluster.get(leader, &format!("{PATH}/holders")).await;
    assert_eq!(holders.status, 200, "{}", holders.body);
    let a = &holders.body["clients"]["a"];
    assert_eq!(a["grants"].as_array().map(Vec::len), Some(1), "{a}");
    assert_eq!(a["grants"][0]["grantId"], grant_id.as_str(), "{a}");
    assert_eq!(a["waiting"], json!([]), "nothing parked: {a}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_early_reports_fail_gets_the_error_and_no_grant() {
    let settings = Settings {
        extra_toml: format!("[limits]\ncommit_timeout_ms = {COMMIT_TIMEOUT_MS}\n"),
        ..Settings::default()
    };
    let cluster = Cluster::start(settings).await;
    let (leader, grant_id) = held_by_a(&cluster, &slow_rounds()).await;
    let followers = cluster.followers_of(leader);
    for id in &followers {
        cluster.pause(*id, true);
    }
    // The early sync's entry cannot commit; the round is not due before the
    // commit timeout, so the request fails with the sync.
    let failed = cluster
        .post(leader, PATH, &release_and_ask(&grant_id))
        .await;
    for id in &followers {
        cluster.pause(*id, false);
    }
    assert_eq!(
        (failed.status, failed.code()),
        (503, "no_quorum"),
        "{}",
        failed.body
    );
    // Once the stuck entry commits, the release is applied: the permit is
    // free and nobody was granted it, since the failed request never reached
    // a round.
    let settled = eventually(Duration::from_secs(20), || async {
        let answer = cluster.get(leader, &format!("{PATH}/usage")).await;
        answer.status == 200 && answer.body["granted"] == 0
    })
    .await;
    assert!(settled, "the stuck release never committed");
    let holders = cluster.get(leader, &format!("{PATH}/holders")).await;
    assert_eq!(holders.status, 200, "{}", holders.body);
    assert_eq!(holders.body["clients"], json!({}), "{}", holders.body);
}
