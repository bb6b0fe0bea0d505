//! Usage reads are linearizable: a read sent at `s` and answered at `r` took
//! effect at some instant of `[s, r]`, so what it says a key has granted lies
//! between
//!
//! - the permits **definitely** held throughout `[s, r]`: granted and claimed
//!   (the claim answered `ok`) before `s`, their release not sent before `r`,
//!   their client not force-released; and
//! - the permits **possibly** held at some instant of `[s, r]`: every request
//!   sent before `r` counts, while it waits, what its answer granted (its
//!   whole demand if it got no answer, or faults may have hidden a grant);
//!   once answered, its grants count until their release is answered
//!   (forever, if it never is). A request whose caller went away (abandoned, or its call failed)
//!   counts until its claim deadline could have passed, which depends on
//!   whether the leader could have granted it after the caller left: see
//!   [`ABANDON_MARGIN`] and [`FAULT_SLACK`].
//!
//! Leases the same way, against the read's `leased`: a lease counts its
//! whole size from the request that may bring it until its settling report is
//! answered, and definitely from its acknowledgement until its settling
//! report is sent (a lease that lapsed is retired but keeps its footprint
//! until its client settles it, docs/protocol.md "Retirement and settling").
//!
//! Under faults (the [`Turbulence`] window) a call may have had several
//! attempts, one of whose answers was lost after its round: if the retry came
//! after the claim window, the leader forgot the `requestId` and granted
//! anew, and the first grant sits unclaimed until its claim deadline. Every
//! request whose life touched the window therefore also counts its demand
//! (for a lease request, a whole lease) until its answer plus the claim
//! window plus [`FAULT_SLACK`].
//!
//! This catches a leader that grants to a caller that went away: a request
//! abandoned outside the window is possibly held only until
//! `abandoned + ABANDON_MARGIN + grantTimeoutMs`, so a grant made to it later
//! shows as usage above what anyone may hold.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Turbulence, Violation};
use crate::history::{Ask, AskOutcome, ForceRelease, LeaseAsk, Records, UsageRead};

/// How soon after its caller goes away, with no fault about, a request's
/// leader may still grant it: the close reaches the node the caller used in
/// one link latency (at most 4 ms), a follower's forwarded call to the leader
/// in one more, and a round the leader planned just before (5 ms of round
/// wait, then a commit of a few ms) still grants it. 50 ms is several times
/// that, and far less than the seconds a held request waits.
pub const ABANDON_MARGIN: Duration = Duration::from_millis(50);

/// What faults add to how long a grant nobody claims may stay counted: a
/// request held on a link reaches the leader up to 2 s late (a held link
/// lasts at most 2 s), the grant's round stamps its claim deadline with its
/// leader's clock and a usage read judges it by another's, each up to 2 s
/// off (the nemesis's clock jumps), and a leader change may delay a round by
/// about a second.
pub const FAULT_SLACK: Duration = Duration::from_secs(7);

/// The history a usage check reads, with the run's facts.
#[derive(Debug)]
pub struct UsageHistory<'a> {
    pub records: &'a Records,
    /// Each key's claim window (`grantTimeoutMs`).
    pub grant_timeouts: &'a BTreeMap<String, Duration>,
    pub turbulence: Option<Turbulence>,
}

/// Every usage read lies between the permits definitely and possibly held
/// while it ran; at most one violation per key.
pub fn check_usage(history: &UsageHistory<'_>) -> Vec<Violation> {
    let mut violations: BTreeMap<&str, Violation> = BTreeMap::new();
    for read in &history.records.usage_reads {
        if violations.contains_key(read.key.as_str()) {
            continue;
        }
        if let Some(violation) = judge(history, read) {
            violations.insert(&read.key, violation);
        }
    }
    violations.into_values().collect()
}

fn judge(history: &UsageHistory<'_>, read: &UsageRead) -> Option<Violation> {
    let records = history.records;
    let timeout = history
        .grant_timeouts
        .get(&read.key)
        .copied()
        .unwrap_or_default();
    let asks: Vec<&Ask> = records.asks.iter().filter(|a| a.key == read.key).collect();
    let leases: Vec<&LeaseAsk> = records
        .leases
        .iter()
        .filter(|l| l.key == read.key)
        .collect();
    let releases: Vec<&ForceRelease> = records
        .force_releases
        .iter()
        .filter(|release| release.key == read.key && release.sent <= read.answered)
        .collect();
    let released = |client_id: &str| releases.iter().any(|r| r.client_id == client_id);
    let life = Life {
        timeout,
        turbulence: history.turbulence,
    };
    let granted_most = most_over(read, asks.iter().map(|ask| ask.sent), |at| {
        asks.iter().map(|ask| life.possibly_granted(ask, at)).sum()
    });
    let granted_least: u64 = asks
        .iter()
        .filter(|ask| !released(&ask.client_id))
        .filter_map(|ask| ask.held())
        .filter(|held| held.from < read.sent && held.until.is_none_or(|u| u > read.answered))
        .map(|held| held.permits)
        .sum();
    let leased_most = most_over(read, leases.iter().map(|lease| lease.sent), |at| {
        leases
            .iter()
            .map(|lease| life.possibly_leased(lease, at))
            .sum()
    });
    let leased_least: u64 = leases
        .iter()
        .filter(|lease| !released(&lease.client_id))
        .filter_map(|lease| lease.lease.as_ref())
        .filter(|held| {
            held.acknowledged.is_some_and(|at| at < read.sent)
                && held.settle_sent.is_none_or(|sent| sent > read.answered)
        })
        .map(|held| held.permits)
        .sum();
    let what = if read.granted > granted_most {
        format!(
            "{} granted, at most {granted_most} possibly held",
            read.granted
        )
    } else if read.granted < granted_least {
        format!(
            "{} granted, at least {granted_least} definitely held",
            read.granted
        )
    } else if read.leased > leased_most {
        format!(
            "{} leased, at most {leased_most} possibly leased",
            read.leased
        )
    } else if read.leased < leased_least {
        format!(
            "{} leased, at least {leased_least} definitely leased",
            read.leased
        )
    } else {
        return None;
    };
    Some(Violation {
        kind: "usage_not_linearizable",
        detail: format!(
            "{}: read sent {:?}, answered {:?}: {what}",
            read.key, read.sent, read.answered
        ),
    })
}

/// The most of `count(t)` over `t` in `[read.sent, read.answered]`, where
/// `count` only rises at the instants of `rises`: its value at the read's
/// start and at each rise within the read.
fn most_over(
    read: &UsageRead,
    rises: impl Iterator<Item = Duration>,
    count: impl Fn(Duration) -> u64,
) -> u64 {
    rises
        .filter(|at| *at > read.sent && *at <= read.answered)
        .chain(std::iter::once(read.sent))
        .map(count)
        .max()
        .unwrap_or(0)
}

/// How long a key's requests may stay counted.
struct Life {
    timeout: Duration,
    turbulence: Option<Turbulence>,
}

/// Later than any read: for what may be held forever.
const FOREVER: Duration = Duration::MAX;

impl Life {
    /// Whether faults may have touched `[from, until]`.
    fn turbulent(&self, from: Duration, until: Duration) -> bool {
        Turbulence::touches(self.turbulence, from, until)
    }

    /// Until when a grant may be made to a request whose caller left at
    /// `left`, having sent it at `sent` with a `waitMs` of `wait`.
    fn last_grant_after_leaving(&self, sent: Duration, left: Duration, wait: Duration) -> Duration {
        if self.turbulent(sent, left) {
            left + wait + FAULT_SLACK
        } else {
            left + ABANDON_MARGIN
        }
    }

    /// Until when a grant made by `granted_by` may stay counted unclaimed.
    fn unclaimed_until(&self, granted_by: Duration, turbulent: bool) -> Duration {
        let slack = if turbulent {
            FAULT_SLACK
        } else {
            Duration::ZERO
        };
        granted_by + self.timeout + slack
    }

    /// The permits `ask` may hold at `at`.
    fn possibly_granted(&self, ask: &Ask, at: Duration) -> u64 {
        if at < ask.sent {
            return 0;
        }
        match &ask.outcome {
            AskOutcome::Waiting => ask.count,
            AskOutcome::Abandoned { at: left } | AskOutcome::Failed { at: left } => {
                // An `acquire_with` that failed may leave its inner request
                // running, its grants returned when its answer comes.
                let until = if ask.seen {
                    let by = self.last_grant_after_leaving(ask.sent, *left, ask.wait);
                    self.unclaimed_until(by, self.turbulent(ask.sent, by))
                } else {
                    FOREVER
                };
                if at < until {
                    ask.count
                } else {
                    0
                }
            }
            AskOutcome::Answered {
                at: answered,
                granted,
                returned,
                ..
            } => {
                let turbulent = self.turbulent(ask.sent, *answered);
                if at < *answered {
                    // Without faults the answer is the whole truth: the
                    // request got what it says, at some instant before it
                    // came. (An `acquire_with` asks again and again out of
                    // sight: its whole count.)
                    return if turbulent || !ask.seen {
                        ask.count
                    } else {
                        *granted
                    };
                }
                let mut permits = 0;
                if at < returned.unwrap_or(FOREVER) {
                    permits += granted;
                }
                if turbulent && at < self.unclaimed_until(*answered, true) {
                    permits += ask.count;
                }
                permits
            }
        }
    }

    /// The lease permits `lease` may hold at `at`.
    fn possibly_leased(&self, lease: &LeaseAsk, at: Duration) -> u64 {
        if at < lease.sent {
            return 0;
        }
        let Some(answered) = lease.answered else {
            let until = match lease.gave_up {
                Some(left) => {
                    let by = self.last_grant_after_leaving(lease.sent, left, Duration::ZERO);
                    self.unclaimed_until(by, self.turbulent(lease.sent, by))
                }
                None => FOREVER,
            };
            return if at < until { lease.most } else { 0 };
        };
        if at < answered {
            return lease.most;
        }
        let mut permits = 0;
        if let Some(held) = &lease.lease {
            if at < held.settled.unwrap_or(FOREVER) {
                permits += held.size;
            }
        }
        if self.turbulent(lease.sent, answered) && at < self.unclaimed_until(answered, true) {
            permits += lease.most;
        }
        permits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Held, LeaseHeld};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn ask(client: &str, sent: u64, outcome: AskOutcome) -> Ask {
        Ask {
            key: "k".into(),
            group: "g".into(),
            client_id: client.into(),
            count: 1,
            sent: ms(sent),
            wait: ms(3_000),
            seen: true,
            outcome,
        }
    }

    /// Granted at `answered`, claimed at `answered + 1`, used until `until`,
    /// released (answered) at `until + 2`.
    fn held(client: &str, sent: u64, answered: u64, until: u64) -> Ask {
        ask(
            client,
            sent,
            AskOutcome::Answered {
                at: ms(answered),
                granted: 1,
                fence: 1,
                held: Some(Held {
                    permits: 1,
                    from: ms(answered + 1),
                    until: Some(ms(until)),
                }),
                returned: Some(ms(until + 2)),
            },
        )
    }

    fn read(sent: u64, answered: u64, granted: u64) -> UsageRead {
        UsageRead {
            key: "k".into(),
            sent: ms(sent),
            answered: ms(answered),
            granted,
            leased: 0,
        }
    }

    fn check(records: &Records, turbulence: Option<Turbulence>) -> Vec<Violation> {
        let timeouts = BTreeMap::from([("k".to_owned(), ms(1_000))]);
        check_usage(&UsageHistory {
            records,
            grant_timeouts: &timeouts,
            turbulence,
        })
    }

    #[test]
    fn a_read_within_the_held_and_the_asked_passes() {
        let records = Records {
            asks: vec![held("a", 0, 10, 500), ask("b", 100, AskOutcome::Waiting)],
            usage_reads: vec![read(200, 210, 1), read(200, 210, 2), read(600, 610, 1)],
            ..Records::default()
        };
        assert!(check(&records, None).is_empty());
    }

    #[test]
    fn a_read_below_what_is_definitely_held_is_caught() {
        let records = Records {
            asks: vec![held("a", 0, 10, 500)],
            usage_reads: vec![read(200, 210, 0)],
            ..Records::default()
        };
        let found = check(&records, None);
        assert_eq!(found[0].kind, "usage_not_linearizable");
        assert!(found[0].detail.contains("definitely"), "{found:?}");
        // Force-released before the read answered: no longer definitely held.
        let records = Records {
            force_releases: vec![ForceRelease {
                key: "k".into(),
                client_id: "a".into(),
                sent: ms(150),
                acked: Some(ms(160)),
            }],
            ..records
        };
        assert!(check(&records, None).is_empty());
    }

    #[test]
    fn a_grant_to_a_caller_gone_for_longer_than_the_margin_is_caught() {
        // b abandons its held request at 300; a releases at 500 and the
        // leader, wrongly, grants b's request then: usage shows it until
        // 500 + 1 s, though b's request may count only until
        // 300 + 50 ms + 1 s.
        let asks = vec![
            held("a", 0, 10, 500),
            ask("b", 100, AskOutcome::Abandoned { at: ms(300) }),
        ];
        let records = Records {
            asks: asks.clone(),
            usage_reads: vec![read(1_300, 1_310, 1), read(1_400, 1_410, 1)],
            ..Records::default()
        };
        let found = check(&records, None);
        assert_eq!(found.len(), 1, "one violation per key");
        assert!(found[0].detail.contains("possibly"), "{found:?}");
        // Within the margin, or under faults, such a grant may be legitimate.
        let records = Records {
            asks,
            usage_reads: vec![read(1_300, 1_310, 1), read(1_340, 1_345, 1)],
            ..Records::default()
        };
        assert!(check(&records, None).is_empty());
        let window = Turbulence {
            from: ms(0),
            until: ms(400),
        };
        let late = Records {
            usage_reads: vec![read(1_400, 1_410, 1)],
            ..records
        };
        assert!(check(&late, Some(window)).is_empty());
    }

    #[test]
    fn a_lease_counts_from_its_acknowledgement_to_its_settling() {
        let lease = LeaseAsk {
            key: "k".into(),
            client_id: "l".into(),
            sent: ms(0),
            most: 2,
            answered: Some(ms(10)),
            gave_up: None,
            lease: Some(LeaseHeld {
                size: 2,
                permits: 2,
                acknowledged: Some(ms(20)),
                settle_sent: Some(ms(900)),
                settled: Some(ms(905)),
                draws: vec![],
            }),
        };
        let leased = |sent: u64, answered: u64, leased: u64| UsageRead {
            leased,
            ..read(sent, answered, 0)
        };
        let records = Records {
            leases: vec![lease.clone()],
            usage_reads: vec![leased(100, 110, 2), leased(1_000, 1_010, 0)],
            ..Records::default()
        };
        assert!(check(&records, None).is_empty());
        for (bad, word) in [
            (leased(100, 110, 1), "definitely"),
            (leased(1_000, 1_010, 2), "possibly"),
        ] {
            let records = Records {
                leases: vec![lease.clone()],
                usage_reads: vec![bad],
                ..Records::default()
            };
            let found = check(&records, None);
            assert!(found[0].detail.contains(word), "{found:?}");
        }
    }
}
