//! `GET /v1/events` and `permitctl events` against a real three-node cluster:
//! a follower streams the rounds and grants of permits taken through the
//! leader; another node resumes from a log index; `from=0` on a fresh cluster
//! streams from the first event; a restarted node answers `too_far_behind` for
//! events applied before it started; streams are bounded. At three shards, a
//! stream of every key merges the shards and resumes after its composite
//! cursor with every event exactly once; bad cursors are refused.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use permitd_client::events::{EventStream, SseMessage};
use permitd_client::{ClientConfig, SemaphoreClient};
use permitd_core::contract::EventCursor;
use permitd_core::limits::MAX_EVENT_SUBSCRIBERS;
use permitd_core::shard::shard_of;
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
    let settings = Settings::default();
    let shards = settings.shards.unwrap_or(1);
    let cluster = Cluster::start(settings).await;
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
                // A stream of every shard: the id names each shard's position,
                // the event's own shard's at its entry's index.
                let id = message.cursor.expect("every event carries its cursor");
                let cursor = EventCursor::parse(&id, shards).expect("a cursor of every shard");
                let key = record["key"].as_str().expect("a key");
                let shard = shard_of(key, shards).unwrap();
                let index = record["logIndex"].as_u64().expect("a log index");
                assert_eq!(cursor.positions()[shard as usize], index, "{id}: {record}");
                let granted = (key == "ev-0" && record["type"] == "round")
                    .then(|| record["granted"].as_u64())
                    .flatten();
                seen.push((shard, index, granted));
                if granted == Some(3) {
                    return;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("node {}: the rounds from 0: {seen:?}", node.id));
        // Each shard's events in its log's order (shards have no order
        // between them).
        for shard in 0..shards {
            let indexes: Vec<u64> = seen
                .iter()
                .filter(|(of, _, _)| *of == shard)
                .map(|(_, index, _)| *index)
                .collect();
            assert!(indexes.is_sorted(), "shard {shard}: {seen:?}");
        }
        assert!(
            seen.iter().any(|(_, _, granted)| *granted == Some(2)),
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

/// Shards of the merged-stream tests.
const MERGED_SHARDS: u32 = 3;

fn three_shards() -> Settings {
    Settings {
        shards: Some(MERGED_SHARDS),
        ..Settings::default()
    }
}

/// One event as a merged stream sent it: its record's key, type and log
/// index, and the message's id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Seen {
    key: String,
    kind: String,
    log_index: u64,
}

/// Checks a merged stream's message: its id is a cursor of every shard whose
/// position of the event's shard is the event's log index.
fn seen(id: &str, data: &str) -> Seen {
    let record: Value = serde_json::from_str(data).expect("JSON record");
    let key = record["key"].as_str().expect("a key").to_owned();
    let log_index = record["logIndex"].as_u64().expect("a log index");
    let cursor = EventCursor::parse(id, MERGED_SHARDS).expect("the id is a cursor of every shard");
    let shard = shard_of(&key, MERGED_SHARDS).unwrap() as usize;
    assert_eq!(cursor.positions()[shard], log_index, "{id}: {record}");
    Seen {
        key,
        kind: record["type"].as_str().expect("a type").to_owned(),
        log_index,
    }
}

/// Reads a merged stream with a bare `GET` that sends `Last-Event-ID`, as a
/// reconnecting `EventSource` does: (id, data) per message, until `enough`.
async fn read_with_last_event_id(
    url: &str,
    last_event_id: &str,
    enough: impl Fn(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    let response = reqwest::Client::new()
        .get(format!("{url}/v1/events"))
        .bearer_auth(ADMIN_TOKEN)
        .header("last-event-id", last_event_id)
        .send()
        .await
        .expect("the node answers");
    assert_eq!(response.status(), 200, "resumed after {last_event_id}");
    let mut response = response;
    let mut text = String::new();
    let mut messages = Vec::new();
    tokio::time::timeout(EVENT_WAIT, async {
        while !enough(&messages) {
            let chunk = response
                .chunk()
                .await
                .expect("stream")
                .expect("open stream");
            text.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                let field = |name: &str| {
                    block
                        .lines()
                        .find_map(|line| line.strip_prefix(name))
                        .map(str::to_owned)
                };
                if let (Some(id), Some(data)) = (field("id: "), field("data: ")) {
                    messages.push((id, data));
                }
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the resumed stream sent too little: {messages:?}"));
    messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_every_shard_resumes_after_its_cursor_exactly_once() {
    let cluster = Cluster::start(three_shards()).await;
    cluster.wait_spread().await;
    let keys = permitd_tests::cluster::keys_covering_shards("merged", 12, MERGED_SHARDS);
    let (first_half, second_half) = keys.split_at(8);

    // A live stream of every key, on node 2 (which leads one shard of three).
    let mut live = client_of(&cluster, 2)
        .events(None, None)
        .await
        .expect("a stream of every shard opens");
    // One round (one entry, one event) per take: takes run one at a time.
    for key in first_half {
        cluster.take(1, key, "c1", 1).await;
    }
    // Read half of what was written, then disconnect with the rest in flight.
    let mut received = Vec::new();
    let mut last_id = String::new();
    while received.len() < 4 {
        let message = tokio::time::timeout(EVENT_WAIT, live.next())
            .await
            .expect("an event in time")
            .expect("stream")
            .expect("open stream");
        let id = message.cursor.clone().expect("every message has an id");
        assert_eq!(message.id, None, "a cursor of three shards is no log index");
        received.push(seen(&id, &message.data));
        last_id = id;
    }
    drop(live);
    for key in second_half {
        cluster.take(3, key, "c1", 1).await;
    }

    // Resuming after the last id on another node sends the rest, each once.
    let expected = keys.len();
    let first_part = received.len();
    let resumed = read_with_last_event_id(&cluster.node(3).url(), &last_id, |messages| {
        first_part + messages.len() >= expected
    })
    .await;
    received.extend(resumed.iter().map(|(id, data)| seen(id, data)));
    let rounds: BTreeSet<&str> = received
        .iter()
        .filter(|event| event.kind == "round")
        .map(|event| event.key.as_str())
        .collect();
    assert_eq!(received.len(), expected, "no event repeated: {received:?}");
    assert_eq!(
        rounds,
        keys.iter().map(String::as_str).collect(),
        "every key's round arrived: {received:?}"
    );

    // The same resume through the client's `cursor=` on node 1.
    let mut again = client_of(&cluster, 1)
        .events_after(None, &last_id)
        .await
        .expect("resumes after the cursor");
    let mut rest = Vec::new();
    while rest.len() < expected - first_part {
        let message = tokio::time::timeout(EVENT_WAIT, again.next())
            .await
            .expect("an event in time")
            .expect("stream")
            .expect("open stream");
        rest.push(seen(&message.cursor.expect("an id"), &message.data));
    }
    // Another node may interleave the shards otherwise (docs/protocol.md, "The
    // merged order"): only each shard's own order is promised.
    let per_shard = |events: &[Seen]| {
        let mut shards: BTreeMap<u32, Vec<Seen>> = BTreeMap::new();
        for event in events {
            let shard = cluster.shard_of_key(&event.key);
            shards.entry(shard).or_default().push(event.clone());
        }
        shards
    };
    assert_eq!(
        per_shard(&rest),
        per_shard(&received[first_part..]),
        "the same rest, in the same order per shard"
    );

    // A key's stream, and a stream of one named shard, keep plain log indexes.
    let key = &keys[0];
    let mut one = client_of(&cluster, 2)
        .events(Some(key), Some(0))
        .await
        .expect("a key's stream opens");
    let message = one.next().await.expect("stream").expect("an event");
    let index = received
        .iter()
        .find(|event| &event.key == key)
        .unwrap()
        .log_index;
    assert_eq!(message.id, Some(index), "{message:?}");
}

/// A refused stream: its query, its `Last-Event-ID`, and the field the 400
/// names.
type BadCursor<'a> = (Vec<(&'a str, &'a str)>, Option<&'a str>, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cursors_are_refused_with_400() {
    let cluster = Cluster::start(three_shards()).await;
    let url = format!("{}/v1/events", cluster.node(1).url());
    let http = reqwest::Client::new();
    let too_long = "1,".repeat(200) + "1";
    let cases: Vec<BadCursor> = vec![
        (vec![("cursor", "x,y,z")], None, "cursor"),
        (vec![("cursor", "1,2")], None, "cursor"),
        (vec![("cursor", "5")], None, "cursor"),
        (vec![("cursor", "1,2,3,4")], None, "cursor"),
        (vec![("cursor", "1,-2,3")], None, "cursor"),
        (vec![("cursor", "1,2,99999999999999999999")], None, "cursor"),
        (vec![("cursor", &too_long)], None, "cursor"),
        (vec![], Some("1,2"), "Last-Event-ID"),
        (vec![], Some("garbage"), "Last-Event-ID"),
        (vec![], Some(&too_long), "Last-Event-ID"),
        // A key's stream covers one shard: its cursor is one index.
        (vec![("key", "k"), ("cursor", "1,2,3")], None, "cursor"),
    ];
    for (query, last_event_id, field) in cases {
        let mut request = http.get(&url).bearer_auth(ADMIN_TOKEN).query(&query);
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let answer = request.send().await.expect("the node answers");
        let status = answer.status().as_u16();
        let body: Value = answer.json().await.expect("a JSON error");
        assert_eq!(status, 400, "{query:?} {last_event_id:?}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
        assert_eq!(body["error"]["field"], field, "{query:?}: {body}");
    }
    let both = cluster.get(1, "/v1/events?cursor=1,2,3&from=4").await;
    assert_eq!(both.status, 400, "{}", both.body);
    // A good cursor opens the stream, and the node still answers.
    let answer = http
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .query(&[("cursor", "0,0,0")])
        .send()
        .await
        .expect("the node answers");
    assert_eq!(answer.status(), 200);
}
