//! The rounds driver's scheduling (`node/src/leader/rounds.rs`, its rules in
//! `schedule.rs`): when a key's round falls due, what shares an entry, how
//! many entries are in flight, the bounds on waiting work, and a leader that
//! cannot commit.

use std::time::Duration;

use permitd_node::leader::rounds::RoundLimits;
use permitd_sim::scenario::{now, Scenario};

use crate::{
    config, last_log_index, ms, path, pause_followers, release, request, resume_all, take,
    with_commit_timeout, COMMIT_TIMEOUT,
};

/// A call's own exchange with a node that answers at once: the connection's
/// handshake, the request and the answer, over 1 ms links (3 ms measured).
const EXCHANGE: Duration = ms(3);
/// From a round's leaving to its answer at the client: the append exchange
/// with the followers (a connection per call, as every call), the commit,
/// and the answer (5 ms measured).
const COMMIT_WITHIN: Duration = ms(6);

/// Requests arriving within one `roundWaitMs` of the first share its round,
/// and its one log entry; they are answered together, `roundWaitMs` after the
/// first arrived.
#[test]
fn requests_arriving_within_one_round_wait_share_one_log_entry() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        cluster
            .configure(leader, "shared", config(10, 50, 50))
            .await;
        let before = last_log_index(&cluster, leader).await;
        let sent = now();
        let mut calls = Vec::new();
        for client in ["a", "b", "c"] {
            calls.push(cluster.spawn_post(leader, &path("shared"), &request(client, None)));
            tokio::time::sleep(ms(20)).await;
        }
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.expect("a call"));
        }
        for answer in &answers {
            assert_eq!(answer.granted(), 1, "{}", answer.body);
            assert_eq!(answer.at, answers[0].at, "answered together");
        }
        // The first arrives 1 ms after it is sent; its round leaves 50 ms later.
        let round_leaves = sent + ms(1 + 50);
        assert!(answers[0].at >= round_leaves, "{:?}", answers[0].at);
        assert!(
            answers[0].at <= round_leaves + COMMIT_WITHIN,
            "{:?}",
            answers[0].at
        );
        assert_eq!(
            last_log_index(&cluster, leader).await,
            before + 1,
            "one entry"
        );
    });
}

/// The rounds of two keys that fall due together share one entry.
#[test]
fn rounds_of_keys_that_fall_due_together_share_one_entry() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        for key in ["x", "y"] {
            cluster.configure(leader, key, config(10, 50, 50)).await;
        }
        let before = last_log_index(&cluster, leader).await;
        let x = cluster.spawn_post(leader, &path("x"), &request("a", None));
        let y = cluster.spawn_post(leader, &path("y"), &request("a", None));
        let (x, y) = (x.await.expect("x"), y.await.expect("y"));
        assert_eq!((x.granted(), y.granted()), (1, 1), "{} {}", x.body, y.body);
        assert_eq!(x.at, y.at, "answered by one entry");
        assert_eq!(
            last_log_index(&cluster, leader).await,
            before + 1,
            "one entry"
        );
    });
}

/// A key falls due at `max(first arrival + roundWaitMs, last round start +
/// roundPeriodMs)`: a request right after a round waits out the period.
#[test]
fn a_request_right_after_a_round_waits_for_the_period() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        cluster
            .configure(leader, "periodic", config(10, 10, 300))
            .await;
        let sent = now();
        let first = take(&cluster, leader, "periodic", "a").await;
        // The first round leaves 10 ms after the request arrives (1 ms link).
        let round_started = sent + ms(1 + 10);
        assert!(first.at <= round_started + COMMIT_WITHIN, "{:?}", first.at);
        let second = take(&cluster, leader, "periodic", "b").await;
        let due = round_started + ms(300);
        assert!(second.at >= due, "{:?}, due at {due:?}", second.at);
        assert!(second.at <= due + COMMIT_WITHIN, "{:?}", second.at);
    });
}

/// A sync does not wait for its key's round: it rides the next entry, while
/// a request of the key waits out its `roundWaitMs`.
#[test]
fn a_sync_rides_the_next_entry_while_a_request_waits_for_its_round() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        cluster.configure(leader, "slow", config(2, 1, 1)).await;
        let a_grant = take(&cluster, leader, "slow", "a").await.grant_id();
        cluster
            .configure(leader, "slow", config(2, 2_000, 2_000))
            .await;
        let sent = now();
        let waiting = cluster.spawn_post(leader, &path("slow"), &request("b", None));
        let synced = cluster
            .post(leader, &path("slow"), &release("a", &a_grant))
            .await;
        assert_eq!(synced.status, 200, "{}", synced.body);
        assert!(
            synced.at <= sent + EXCHANGE + COMMIT_WITHIN,
            "synced at {:?}, sent at {sent:?}",
            synced.at
        );
        let waiting = waiting.await.expect("b's call");
        assert_eq!(waiting.granted(), 1, "{}", waiting.body);
        assert!(waiting.at >= sent + ms(2_000), "{:?}", waiting.at);
    });
}

/// At most `entries_in_flight` entries are being committed at once; the rounds
/// that fall due meanwhile share the next entry.
#[test]
fn rounds_due_while_the_entries_in_flight_are_full_share_the_next_entry() {
    let limits = RoundLimits {
        entries_in_flight: 1,
        ..RoundLimits::default()
    };
    Scenario::new().rounds(limits).run(|cluster| async move {
        let leader = cluster.leader().await;
        for key in ["x", "y", "z"] {
            cluster.configure(leader, key, config(10, 1, 1)).await;
        }
        let before = last_log_index(&cluster, leader).await;
        let followers = pause_followers(&cluster, leader);
        let x = cluster.spawn_post(leader, &path("x"), &request("a", None));
        tokio::time::sleep(ms(20)).await;
        // x's entry cannot commit: y's and z's rounds fall due behind it.
        let y = cluster.spawn_post(leader, &path("y"), &request("a", None));
        let z = cluster.spawn_post(leader, &path("z"), &request("a", None));
        tokio::time::sleep(ms(300)).await;
        assert!(
            !x.is_finished(),
            "x's entry committed without the followers"
        );
        resume_all(&cluster, &followers);
        let (x, y, z) = (x.await.unwrap(), y.await.unwrap(), z.await.unwrap());
        for answer in [&x, &y, &z] {
            assert_eq!(answer.granted(), 1, "{}", answer.body);
        }
        assert_eq!(y.at, z.at, "y and z share an entry");
        assert!(x.at < y.at, "x's entry first: {:?} {:?}", x.at, y.at);
        assert_eq!(
            last_log_index(&cluster, leader).await,
            before + 2,
            "two entries"
        );
    });
}

/// Replaces the e2e `requests_beyond_the_pending_bound_get_429_with_retry_after`
/// (tests/tests/pending_limit.rs): beyond `max_pending_per_key` a request
/// gets 429 `too_many_pending` with `Retry-After`; the parked ones and other
/// keys are not disturbed.
#[test]
fn requests_beyond_the_pending_bound_get_429_with_retry_after() {
    let limits = RoundLimits {
        max_pending_per_key: 2,
        ..RoundLimits::default()
    };
    Scenario::new().rounds(limits).run(|cluster| async move {
        let leader = cluster.leader().await;
        cluster
            .configure(leader, "slow", config(10, 60_000, 60_000))
            .await;
        let _parked: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|client| cluster.spawn_post(leader, &path("slow"), &request(client, None)))
            .collect();
        tokio::time::sleep(ms(10)).await;
        let refused = cluster
            .post(leader, &path("slow"), &request("c", None))
            .await;
        assert_eq!((refused.status, refused.code()), (429, "too_many_pending"));
        assert!(refused.retry_after.is_some(), "429 carries Retry-After");
        assert_eq!(
            cluster.waiting(leader, "slow").await,
            2,
            "both still parked"
        );
        let other = cluster
            .post(leader, &path("fast"), &request("c", None))
            .await;
        assert_eq!(other.status, 200, "{}", other.body);
    });
}

/// Replaces the e2e `requests_beyond_the_leaders_parked_bound_get_503_overloaded`
/// (tests/tests/pending_limit.rs): beyond `max_parked_messages`, all keys
/// together, a request to any key gets 503 `overloaded` with `Retry-After`.
#[test]
fn requests_beyond_the_leaders_parked_bound_get_503_overloaded() {
    let limits = RoundLimits {
        max_parked_messages: 2,
        ..RoundLimits::default()
    };
    Scenario::new().rounds(limits).run(|cluster| async move {
        let leader = cluster.leader().await;
        for key in ["one", "two", "three"] {
            cluster
                .configure(leader, key, config(10, 60_000, 60_000))
                .await;
        }
        let _parked: Vec<_> = ["one", "two"]
            .into_iter()
            .map(|key| cluster.spawn_post(leader, &path(key), &request("a", None)))
            .collect();
        tokio::time::sleep(ms(10)).await;
        let refused = cluster
            .post(leader, &path("three"), &request("b", None))
            .await;
        assert_eq!((refused.status, refused.code()), (503, "overloaded"));
        assert!(refused.retry_after.is_some(), "503 carries Retry-After");
        for key in ["one", "two"] {
            assert_eq!(cluster.waiting(leader, key).await, 1, "{key} still parked");
        }
    });
}

/// Replaces the e2e `a_leader_without_its_followers_answers_no_quorum_within_the_commit_timeout`
/// (tests/tests/no_quorum.rs): an entry not committed within `commit_timeout`
/// fails its callers with 503 `no_quorum` and `Retry-After` at that moment;
/// new requests are refused at once; service resumes when the followers are
/// back.
#[test]
fn a_leader_without_its_followers_answers_no_quorum_at_the_commit_timeout() {
    Scenario::new()
        .rounds(with_commit_timeout())
        .run(|cluster| async move {
            let leader = cluster.leader().await;
            cluster.configure(leader, "k", config(10, 1, 1)).await;
            take(&cluster, leader, "k", "a").await;
            let followers = pause_followers(&cluster, leader);
            let sent = now();
            let stuck = cluster.post(leader, &path("k"), &request("b", None)).await;
            assert_eq!(
                (stuck.status, stuck.code()),
                (503, "no_quorum"),
                "{}",
                stuck.body
            );
            assert!(stuck.retry_after.is_some(), "503 carries Retry-After");
            // Its entry left 1 ms (link) + 1 ms (roundWaitMs) after it was sent.
            let timed_out = sent + ms(2) + COMMIT_TIMEOUT;
            assert!(stuck.at >= timed_out, "{:?}", stuck.at);
            assert!(stuck.at <= timed_out + ms(3), "{:?}", stuck.at);

            let sent = now();
            let refused = cluster.post(leader, &path("k"), &request("c", None)).await;
            assert_eq!((refused.status, refused.code()), (503, "no_quorum"));
            assert!(
                refused.at <= sent + EXCHANGE,
                "refused at once, not parked: {:?} {sent:?}",
                refused.at
            );

            resume_all(&cluster, &followers);
            let served = cluster
                .eventually(ms(5_000), || async {
                    let answer = cluster.post(leader, &path("k"), &request("d", None)).await;
                    answer.status == 200
                })
                .await;
            assert!(served, "service resumes once the followers are back");
        });
}

/// Replaces the e2e `a_read_outlasts_a_short_silence_of_the_followers`
/// (tests/tests/no_quorum.rs): a read confirms the leadership with a quorum;
/// followers silent for 300 ms must not make it answer `503 no_quorum` (the
/// leader asks again, for up to a second).
#[test]
fn a_read_outlasts_a_short_silence_of_the_followers() {
    Scenario::new().run(|cluster| async move {
        let leader = cluster.leader().await;
        take(&cluster, leader, "k", "a").await;
        let followers = pause_followers(&cluster, leader);
        let read = {
            let cluster = cluster.clone();
            tokio::spawn(async move { cluster.get(leader, &format!("{}/usage", path("k"))).await })
        };
        tokio::time::sleep(ms(300)).await;
        resume_all(&cluster, &followers);
        let answer = read.await.expect("the read");
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.body["granted"], 1, "{}", answer.body);
    });
}
