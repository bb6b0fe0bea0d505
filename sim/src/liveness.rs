//! A held request is not left waiting while its key has a free permit, nor
//! overtaken by a younger request of its key.
//!
//! The rule (docs/protocol.md, "Held requests"): a request a round left
//! empty-handed waits for its key's next round, and anything that frees
//! permits of the key (a release, a reclaim) wakes it into that round. So in
//! quiet times (no fault, restart or stop for [`SETTLE`] before it was sent
//! and none until its answer), a held request that waited out its whole
//! `waitMs` empty-handed must have found every permit of its key possibly
//! occupied for all but a round or two of that wait. Safety checkers cannot
//! see a breach: no budget is exceeded, a permit just sits unused while
//! somebody waits for it (the bug of entries reaching the log out of order).
//!
//! What occupies a waiter key is known from the waiters' own records
//! (`waiters.rs`), counted generously: a granted request from when it was sent
//! until its release was acknowledged; a request that got no answer from when
//! it was sent until the claim deadline of a grant it may have had.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::checker::Violation;
use crate::waiters::{Answer, Wait, WAIT_MS};

/// How long after the last disturbance the cluster counts as settled: a
/// restarted node caught up, leadership stable.
pub const SETTLE: Duration = Duration::from_secs(2);
/// The longest a held request may see a free permit of its key unused: a
/// round's wait and period (5 and 20 ms by default), a commit and a round
/// trip, with room to spare.
pub const FREE_AT_MOST: Duration = Duration::from_millis(200);
/// A request waited out its `waitMs` if answered this close to it or later.
const WAITED_OUT: Duration = Duration::from_millis(WAIT_MS - 5);

/// `[from, to)` during which a permit of a key may be occupied.
fn occupied(
    wait: &Wait,
    claim_deadline: Duration,
    run_end: Duration,
) -> Option<(Duration, Duration)> {
    match wait.answer {
        Answer::Granted { released } => Some((wait.sent, released.unwrap_or(run_end))),
        Answer::Unknown => Some((wait.sent, wait.answered + claim_deadline)),
        Answer::Empty => None,
    }
}

/// The longest stretch of `[from, to]` during which fewer than `limit` of
/// `spans` cover the instant.
fn longest_free(
    spans: &[(Duration, Duration)],
    limit: u64,
    from: Duration,
    to: Duration,
) -> Duration {
    let mut edges: Vec<(Duration, i64)> = Vec::new();
    let mut covering = 0i64;
    for &(start, end) in spans {
        if start <= from && end > from {
            covering += 1;
        } else if start > from && start < to {
            edges.push((start, 1));
        }
        if end > from && end < to {
            edges.push((end, -1));
        }
    }
    // At one instant an end sorts before a start: the permit is passed on.
    edges.sort();
    let (mut longest, mut free_since) = (Duration::ZERO, None);
    let mut at = from;
    for (when, change) in edges.into_iter().chain(std::iter::once((to, 0))) {
        if (covering as u64) < limit {
            free_since.get_or_insert(at);
        } else if let Some(since) = free_since.take() {
            longest = longest.max(at - since);
        }
        at = when;
        covering += change;
    }
    if let Some(since) = free_since {
        longest = longest.max(to - since);
    }
    longest
}

/// Held requests that waited out their `waitMs` in quiet times while a permit
/// of their key was free for longer than [`FREE_AT_MOST`].
pub fn check_held_while_free(
    waits: &[Wait],
    limits: &BTreeMap<String, u64>,
    disturbances: &BTreeSet<Duration>,
    claim_deadline: Duration,
    run_end: Duration,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for wait in waits {
        let waited_out = wait.answered.saturating_sub(wait.sent) >= WAITED_OUT;
        if wait.answer != Answer::Empty || !waited_out {
            continue;
        }
        let settled_from = wait.sent.saturating_sub(SETTLE);
        if disturbances
            .range(settled_from..=wait.answered)
            .next()
            .is_some()
        {
            continue;
        }
        let spans: Vec<_> = waits
            .iter()
            .filter(|other| other.key == wait.key)
            .filter_map(|other| occupied(other, claim_deadline, run_end))
            .collect();
        let limit = limits.get(&wait.key).copied().unwrap_or(0);
        let free = longest_free(&spans, limit, wait.sent, wait.answered);
        if free > FREE_AT_MOST {
            violations.push(Violation {
                kind: "held_while_free",
                detail: format!(
                    "{} of {} held from {:?} to {:?}, empty-handed, while a permit was free for {free:?}",
                    wait.key, wait.client, wait.sent, wait.answered
                ),
            });
            break;
        }
    }
    violations
}

/// How much younger a request must be, and how much earlier answered, to
/// count as overtaking: more than a round and a few network delays.
const OVERTAKE_MARGIN: Duration = Duration::from_millis(50);

/// A held request overtaken: in quiet times, a request sent well after it, for
/// the same key, was granted well before it was answered. A freed permit wakes
/// every request held for its key into the next round, where the oldest demand
/// comes first, so a younger request can only win a permit a held one was not
/// woken for (the bug of entries reaching the log out of order: the round met
/// the release's entry before it, held the request again, and the next
/// arrival took the permit).
pub fn check_no_overtaking(waits: &[Wait], disturbances: &BTreeSet<Duration>) -> Vec<Violation> {
    for held in waits {
        if matches!(held.answer, Answer::Unknown) {
            continue;
        }
        let settled_from = held.sent.saturating_sub(SETTLE);
        if disturbances
            .range(settled_from..=held.answered)
            .next()
            .is_some()
        {
            continue;
        }
        let overtaker = waits.iter().find(|other| {
            other.key == held.key
                && matches!(other.answer, Answer::Granted { .. })
                && other.sent > held.sent + OVERTAKE_MARGIN
                && other.answered + OVERTAKE_MARGIN < held.answered
        });
        if let Some(overtaker) = overtaker {
            return vec![Violation {
                kind: "held_request_overtaken",
                detail: format!(
                    "{} of {} sent {:?}, answered {:?}; {} sent {:?} was granted at {:?}",
                    held.key,
                    held.client,
                    held.sent,
                    held.answered,
                    overtaker.client,
                    overtaker.sent,
                    overtaker.answered
                ),
            }];
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn wait(client: &str, sent: u64, answered: u64, answer: Answer) -> Wait {
        Wait {
            key: "k".into(),
            client: client.into(),
            sent: ms(sent),
            answered: ms(answered),
            answer,
        }
    }

    fn check(waits: &[Wait], disturbances: &[u64]) -> Vec<Violation> {
        let limits = BTreeMap::from([("k".to_string(), 1)]);
        let disturbances = disturbances.iter().copied().map(ms).collect();
        check_held_while_free(waits, &limits, &disturbances, ms(10_000), ms(60_000))
    }

    #[test]
    fn a_request_held_while_the_permit_sat_free_is_caught() {
        let released_early = Answer::Granted {
            released: Some(ms(5_100)),
        };
        let waits = [
            wait("a", 5_000, 5_010, released_early),
            wait("b", 5_050, 5_050 + WAIT_MS, Answer::Empty),
        ];
        assert_eq!(check(&waits, &[100])[0].kind, "held_while_free");
        // Not in quiet times: a fault may explain it.
        assert!(check(&waits, &[5_200]).is_empty());
    }

    #[test]
    fn a_request_held_while_others_held_the_permit_is_fine() {
        let holds = |released| Answer::Granted {
            released: Some(ms(released)),
        };
        let waits = [
            wait("a", 5_000, 5_010, holds(5_800)),
            wait("c", 5_790, 5_820, holds(7_000)),
            wait("b", 5_050, 5_050 + WAIT_MS, Answer::Empty),
        ];
        assert!(check(&waits, &[100]).is_empty());
        // One that got no answer may hold it until its claim deadline.
        let unknown = [
            wait("a", 5_000, 5_010, Answer::Unknown),
            wait("b", 5_050, 5_050 + WAIT_MS, Answer::Empty),
        ];
        assert!(check(&unknown, &[100]).is_empty());
    }

    #[test]
    fn a_younger_request_granted_while_an_older_one_waits_is_caught() {
        let granted = Answer::Granted {
            released: Some(ms(5_300)),
        };
        let waits = [
            wait("b", 5_000, 5_000 + WAIT_MS, Answer::Empty),
            wait("c", 5_200, 5_210, granted.clone()),
        ];
        let quiet = BTreeSet::from([ms(100)]);
        let caught = check_no_overtaking(&waits, &quiet);
        assert_eq!(caught[0].kind, "held_request_overtaken");
        // Sent together, or answered together: no order to keep.
        let close = [
            wait("b", 5_000, 5_000 + WAIT_MS, Answer::Empty),
            wait("c", 5_020, 5_210, granted),
        ];
        assert!(check_no_overtaking(&close, &quiet).is_empty());
        // Under faults: not judged.
        let faulty = BTreeSet::from([ms(5_100)]);
        assert!(check_no_overtaking(&waits, &faulty).is_empty());
    }

    #[test]
    fn the_longest_free_stretch_counts_permits() {
        let spans = [(ms(0), ms(10)), (ms(5), ms(20))];
        assert_eq!(longest_free(&spans, 1, ms(0), ms(30)), ms(10));
        assert_eq!(longest_free(&spans, 2, ms(0), ms(30)), ms(20));
    }
}
