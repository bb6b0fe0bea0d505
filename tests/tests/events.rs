//! `GET /v1/events` and `permitctl events` against a real three-node cluster:
//! a follower streams the rounds and grants of permits taken through the
//! leader; another node resumes from a log index; `from=0` on a fresh cluster
//! streams from the first event; a restarted node answers `too_far_behind` for
//! events applied before it started; streams are bounded.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use permitd_client::events::{EventStream, SseMessage};
use permitd_client::{ClientConfig, SemaphoreClient};
use permitd_core::limits::MAX_EVENT_SUBSCRIBERS;
use permitd_tests::{permitctl_bin, Cluster, Settings, ADMIN_TOKEN};
use serde_json::Value;

/// How long a test waits for one expected event.
const EVENT_WAIT: Duration = Duration::from_secs(15);

fn client_of(cluster: &Cluster, node: u64) -> SemaphoreClient {
    let mut config = ClientConfig::new([cluster.node(node).url()]);
    config.token = Some(ADMIN_TOKEN.to_owned());
    SemaphoreClient::new(config).expect("client")
}

/// The next message whose record matches `wanted`, within [`EVENT_WAIT`].
async fn next_matching(
    stream: &mut EventStream,
    wanted: impl Fn(&Value) -> bool,
) -> (SseMessage, Value) {
    let found = tokio::time::timeout(EVENT_WAIT, async {
        loop {
            let message = stream.next().await.expect("stream").expect("open stream");
            let record: Value = serde_json::from_str(&message.data).expect("JSON record");
            if wanted(&record) {
                return (message, record);
            }
        }
    })
    .await;
    found.expect("the expected event arrived in time")
}

fn is_round_granting(record: &Value, permits: u64) -> bool {
    record["type"] == "round" && record["granted"].as_u64() == Some(permits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_stream_rounds_and_streams_resume_from_an_index() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    let other = cluster
        .nodes
        .iter()
        .map(|node| node.id)
        .find(|id| *id != leader && *id != follower)
        .expect("a third node");

    // A live stream of one key on a follower, opened before any permit is taken.
    let mut live = client_of(&cluster, follower)
        .events(Some("ev-1"), None)
        .await
        .expect("stream opens");
    cluster.take(leader, "ev-2", "c9", 2).await;
    cluster.take(leader, "ev-1", "c1", 3).await;
    let (round, record) = next_matching(&mut live, |record| is_round_granting(record, 3)).await;
    assert_eq!(record["key"], "ev-1", "only the asked key: {record}");
    assert_eq!(round.event, "round");
    let index = round.id.expect("every event carries its log index");
    assert_eq!(record["logIndex"].as_u64(), Some(index));
    assert!(record["usage"]["granted"].as_u64() >= Some(3), "{record}");

    // Resuming from that index on another node replays the same round first.
    let mut resumed = client_of(&cluster, other)
        .events(Some("ev-1"), Some(index))
        .await
        .expect("resume opens");
    let first = resumed.next().await.expect("stream").expect("an event");
    assert_eq!(
        (first.id, first.data.clone()),
        (round.id, round.data.clone())
    );

    // `permitctl events` prints the same record as a JSON line.
    let mut ctl = Command::new(permitctl_bin())
        .args(["--endpoints", &cluster.node(other).url()])
        .args(["--token", ADMIN_TOKEN])
        .args(["events", "ev-1", "--from", &index.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("permitctl starts");
    let stdout = ctl.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .expect("reader")
    .expect("a line");
    ctl.kill().expect("stop permitctl");
    let _ = ctl.wait();
    let printed: Value = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(printed, record, "the CLI prints the stream's record");

    // New permits on the same stream: the next round arrives live.
    cluster.take(leader, "ev-1", "c2", 4).await;
    let (later, _) = next_matching(&mut live, |record| is_round_granting(record, 4)).await;
    assert!(later.id > round.id);

    // A restarted node keeps only what it applies from now on.
    cluster.stop(other);
    cluster.restart(other);
    cluster.wait_healthy().await;
    let behind = cluster
        .get(other, &format!("/v1/events?key=ev-1&from={index}"))
        .await;
    assert_eq!(behind.status, 410, "{}", behind.body);
    assert_eq!(behind.code(), "too_far_behind");
    let from_zero = cluster.get(other, "/v1/events?from=0").await;
    assert_eq!(from_zero.status, 410, "events are gone: {}", from_zero.body);
    assert_eq!(from_zero.code(), "too_far_behind");
    let ctl = Command::new(permitctl_bin())
        .args(["--endpoints", &cluster.node(other).url()])
        .args(["--token", ADMIN_TOKEN])
        .args(["events", "ev-1", "--from", &index.to_string()])
        .output()
        .expect("permitctl runs");
    assert!(!ctl.status.success());
    assert!(
        String::from_utf8_lossy(&ctl.stderr).contains("too_far_behind"),
        "{ctl:?}"
    );
    // Its live stream still works.
    let mut fresh = client_of(&cluster, other)
        .events(Some("ev-1"), None)
        .await
        .expect("live stream after restart");
    cluster.take(leader, "ev-1", "c3", 5).await;
    next_matching(&mut fresh, |record| is_round_granting(record, 5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_zero_on_a_fresh_cluster_streams_from_the_first_event() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    cluster.take(leader, "ev-0", "c1", 2).await;
    cluster.take(leader, "ev-0", "c2", 3).await;
    for node in &cluster.nodes {
        // Every node applied every entry since the cluster began and dropped
        // nothing: asking from the beginning is not too far behind.
        let mut stream = client_of(&cluster, node.id)
            .events(None, Some(0))
            .await
            .unwrap_or_else(|error| panic!("node {}: from=0 refused: {error}", node.id));
        // Everything up to the second round, in log order, the first included.
        let mut seen = Vec::new();
        tokio::time::timeout(EVENT_WAIT, async {
            loop {
                let message = stream.next().await.expect("stream").expect("open stream");
                let record: Value = serde_json::from_str(&message.data).expect("JSON record");
                let id = message.id.expect("every event carries its log index");
                let granted = (record["key"] == "ev-0" && record["type"] == "round")
                    .then(|| record["granted"].as_u64())
                    .flatten();
                seen.push((id, granted));
                if granted == Some(3) {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("node {}: the rounds from 0: {seen:?}", node.id));
        assert!(
            seen.windows(2).all(|pair| pair[0].0 <= pair[1].0),
            "{seen:?}"
        );
        assert!(
            seen.iter().any(|(_, granted)| *granted == Some(2)),
            "node {}: the first round is streamed too: {seen:?}",
            node.id
        );
        let with_key = client_of(&cluster, node.id)
            .events(Some("ev-0"), Some(0))
            .await
            .expect("a key's stream from 0 opens");
        drop(with_key);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queries_and_too_many_streams_are_refused() {
    let cluster = Cluster::start(Settings::default()).await;
    let node = cluster.wait_for_leader().await;
    for (query, code) in [("from=abc", "bad_request"), ("unknown=1", "bad_request")] {
        let answer = cluster.get(node, &format!("/v1/events?{query}")).await;
        assert_eq!(answer.code(), code, "{query}: {}", answer.body);
    }
    let long_key = "k".repeat(300);
    let answer = cluster
        .get(node, &format!("/v1/events?key={long_key}"))
        .await;
    assert_eq!(answer.status, 400, "{}", answer.body);

    let client = client_of(&cluster, node);
    let mut open = Vec::new();
    for _ in 0..MAX_EVENT_SUBSCRIBERS {
        open.push(client.events(None, None).await.expect("within the limit"));
    }
    let refused = cluster.get(node, "/v1/events").await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.code(), "too_many_subscribers");
    assert!(refused.retry_after.is_some());
    // A closed stream frees its place.
    open.pop();
    let reopened = tokio::time::timeout(EVENT_WAIT, async {
        loop {
            if let Ok(stream) = client.events(None, None).await {
                return stream;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(reopened.is_ok(), "a place frees up once a stream closes");
}
