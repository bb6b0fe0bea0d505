//! A one-way cut: a follower's own calls to the leader vanish on the way,
//! while the leader's appends still reach it, so it keeps naming the leader.
//! Real `permitd` processes, each in a network namespace of its own
//! (`permitd_tests::netns`), with the shipped Raft timings and limits.
//!
//! Every call to the cut-off follower is answered within 3 s, with the error
//! its `/readyz` gives at the same time, and a client that asks it first gets
//! around it; a call that legitimately waits on the leader longer than that,
//! on a healthy path, still gets its answer.
//!
//! At several shards (`PERMITD_TEST_SHARDS`) every node leads some shards: the
//! leader is the key's shard leader, the cut-off node one that follows that
//! shard, every call is about keys of that shard, and the calls through the
//! cut and `/readyz` name it (`x-permitd-shard`), so that a batch is forwarded
//! to that shard's leader as one call, as at one shard. The shards the cut-off node leads lose its appends to
//! that leader; what they do meanwhile is not this test's concern.

use std::time::{Duration, Instant};

use permitd_client::{ClientConfig, SemaphoreClient};
use permitd_tests::cluster::NAMESPACED_RAFT_PORT;
use permitd_tests::{eventually_seen, netns, request, Answer, Cluster, Settings, ADMIN_TOKEN};
use reqwest::Method;
use serde_json::{json, Value};

/// The longest a call to the cut-off follower may wait for its answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);
/// Rounds of calls made through the cut.
const CUT_ROUNDS: usize = 3;
const KEY: &str = "cut-key";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_calls_to_the_leader_are_cut_answers_within_3_s_as_its_readyz_says() {
    if let Some(why) = netns::unavailable() {
        eprintln!("skipped: this test needs network namespaces: {why}");
        return;
    }
    let cluster = Cluster::start(Settings {
        namespaces: true,
        ..Settings::shipped()
    })
    .await;
    // The leader of the key's shard, and a node that follows that shard (at
    // several shards it leads others, which the cut may legitimately disturb).
    let leader = cluster.key_leader(KEY).await;
    let follower = cluster.follower_of(leader);

    healthy_calls_are_forwarded(&cluster, leader, follower).await;
    a_held_request_gets_its_answer_through_the_follower(&cluster, leader, follower).await;

    let lan = cluster.lan.as_ref().expect("a namespaced cluster");
    lan.cut_calls(follower, leader, &[NAMESPACED_RAFT_PORT])
        .expect("cut the follower's calls to the leader");
    calls_through_the_cut_are_answered_in_time(&cluster, leader, follower).await;
    a_client_that_asks_the_cut_off_follower_first_gets_around_it(&cluster, follower).await;
    the_leaders_appends_still_reach_the_follower(&cluster, leader, follower).await;
    assert!(lan.dropped(leader) > 0, "the cut dropped nothing");

    lan.heal(leader);
    the_follower_is_ready_again_once_healed(&cluster, leader, follower).await;
}

/// Before the cut: the follower is ready, forwarding, and its calls answer.
async fn healthy_calls_are_forwarded(cluster: &Cluster, leader: u64, follower: u64) {
    let config = cluster
        .put(follower, &key_path("/config"), &json!({"limit": 1}))
        .await;
    assert_eq!(config.status, 200, "{}", config.body);
    let ready = readyz(cluster, follower).await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(
        ready.body,
        json!({"status": "ready", "leader": leader, "serving": "forwarded"})
    );
    let ready = readyz(cluster, leader).await;
    assert_eq!(ready.body["serving"], "local", "{}", ready.body);
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let usage = cluster.get(follower, &key_path("/usage")).await;
        latencies.push(started.elapsed());
        assert_eq!(usage.status, 200, "{}", usage.body);
    }
    latencies.sort();
    eprintln!(
        "forwarded usage reads before the cut: p50 {:?}, max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
}

/// A request held by the leader for longer than any reach limit (its
/// `waitMs`) is answered through the follower, on a healthy path: the
/// follower's deadline follows what the call may wait.
async fn a_held_request_gets_its_answer_through_the_follower(
    cluster: &Cluster,
    leader: u64,
    follower: u64,
) {
    cluster.take(leader, KEY, "holder", 1).await;
    let wait_ms = 2_500;
    let mut held = request("waiter", &[("g", 1, 1)]);
    held["waitMs"] = json!(wait_ms);
    let started = Instant::now();
    let answer = cluster.post(follower, &key_path(""), &held).await;
    let waited = started.elapsed();
    eprintln!("a request held {wait_ms} ms, through the follower: {waited:?}");
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(permitd_tests::granted(&answer.body), 0, "{}", answer.body);
    assert!(
        waited >= Duration::from_millis(wait_ms),
        "answered after {waited:?}, before its wait ended"
    );
}

/// Every kind of forwarded call, as the follower answers it through the cut.
async fn calls_through_the_cut_are_answered_in_time(cluster: &Cluster, leader: u64, follower: u64) {
    let calls: Vec<(&str, Method, String, Option<Value>)> = vec![
        (
            "request",
            Method::POST,
            key_path(""),
            Some(request("c", &[("g", 1, 1)])),
        ),
        ("usage", Method::GET, key_path("/usage"), None),
        (
            "config",
            Method::PUT,
            key_path("/config"),
            Some(json!({"limit": 2})),
        ),
        (
            "batch",
            Method::POST,
            "/v1/batch".into(),
            Some(json!({"v": 1, "items": [{"key": KEY, "message": request("c", &[("g", 1, 1)])}]})),
        ),
    ];
    for round in 0..CUT_ROUNDS {
        for (name, method, path, body) in &calls {
            let started = Instant::now();
            let answer = cluster
                .call_in_shard(
                    follower,
                    method.clone(),
                    path,
                    body.as_ref(),
                    named_shard(cluster),
                )
                .await;
            let took = started.elapsed();
            eprintln!(
                "through the cut, round {round}: {name} answered {} {} in {took:?}",
                answer.status,
                answer.code()
            );
            assert!(took < ANSWER_WITHIN, "{name} took {took:?}: {answer:?}");
            assert_unreachable(&answer, leader, name);
            let ready = readyz(cluster, follower).await;
            assert_unreachable(&ready, leader, "/readyz");
        }
    }
}

/// `SemaphoreClient` with the cut-off follower first among its endpoints: the
/// follower's answer (and its `/readyz`, which the client asks while no node
/// serves) sends it elsewhere, so the call succeeds within the same 3 s.
async fn a_client_that_asks_the_cut_off_follower_first_gets_around_it(
    cluster: &Cluster,
    follower: u64,
) {
    let mut endpoints = vec![cluster.node(follower).url()];
    let others = cluster.nodes.iter().filter(|node| node.id != follower);
    endpoints.extend(others.map(|node| node.url()));
    let mut config = ClientConfig::new(endpoints);
    config.token = Some(ADMIN_TOKEN.to_owned());
    let client = SemaphoreClient::new(config).expect("client");
    for _ in 0..CUT_ROUNDS {
        let started = Instant::now();
        let usage = client.usage(KEY).await;
        let took = started.elapsed();
        eprintln!("a client with the cut-off follower first: usage in {took:?}");
        assert!(usage.is_ok(), "{usage:?}");
        assert!(took < ANSWER_WITHIN, "took {took:?}");
    }
}

/// A clean 503 `timeout` with `Retry-After`, naming the leader to call instead.
fn assert_unreachable(answer: &Answer, leader: u64, what: &str) {
    assert_eq!(
        (answer.status, answer.code()),
        (503, "timeout"),
        "{what}: {answer:?}"
    );
    assert!(answer.retry_after.is_some(), "{what}: no Retry-After");
    assert_eq!(answer.leader, Some(leader), "{what}: {answer:?}");
}

/// The cut is one-way: the follower still names the leader and applies what
/// the leader commits.
async fn the_leaders_appends_still_reach_the_follower(
    cluster: &Cluster,
    leader: u64,
    follower: u64,
) {
    let shard = cluster.shard_of_key(KEY);
    let key = cluster.key_in_shard("through-leader", shard);
    cluster.take(leader, &key, "direct", 1).await;
    let target = cluster
        .shard_applied(leader, shard)
        .await
        .expect("leader status");
    let (applied, status) = eventually_seen(Duration::from_secs(10), || async {
        let map = cluster.admin_get(follower, "/cluster/shards").await;
        let status = map.map_or(Value::Null, |map| map["shards"][shard as usize].clone());
        let applied = status["appliedIndex"].as_u64() >= Some(target);
        (applied && status["leader"] == json!(leader), status)
    })
    .await;
    assert!(
        applied,
        "the follower applies the leader's entries: {status}"
    );
}

/// Healed: the follower's probe finds the leader again, and calls answer.
async fn the_follower_is_ready_again_once_healed(cluster: &Cluster, leader: u64, follower: u64) {
    let started = Instant::now();
    let (ready, seen) = eventually_seen(Duration::from_secs(10), || async {
        let ready = readyz(cluster, follower).await;
        (ready.status == 200, ready)
    })
    .await;
    assert!(ready, "the follower is ready again: {seen:?}");
    eprintln!("ready again {:?} after the heal", started.elapsed());
    assert_eq!(seen.body["leader"], json!(leader));
    let usage = cluster.get(follower, &key_path("/usage")).await;
    assert_eq!(usage.status, 200, "{}", usage.body);
}

/// At several shards, the key's shard, which calls through the cut name
/// (`x-permitd-shard`): a batch then goes to that shard's leader as one call,
/// and `/readyz` answers for that shard alone (the node leads others). `None`
/// at one shard, whose calls name none.
fn named_shard(cluster: &Cluster) -> Option<u32> {
    (cluster.shard_count() > 1).then(|| cluster.shard_of_key(KEY))
}

/// `/readyz` of node `id`, about the key's shard ([`named_shard`]).
async fn readyz(cluster: &Cluster, id: u64) -> Answer {
    let shard = named_shard(cluster);
    cluster
        .call_in_shard(id, Method::GET, "/readyz", None, shard)
        .await
}

fn key_path(rest: &str) -> String {
    format!("/v1/semaphores/{KEY}{rest}")
}
