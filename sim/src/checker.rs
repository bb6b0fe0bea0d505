//! The properties a run must keep, checked from what the clients and the
//! harness saw, not from what the nodes say about themselves.
//!
//! - **Budget**: per key, the most jobs whose `[start, end)` overlap never
//!   exceeds the key's limit. A job starts when its client holds the permit
//!   (the acquire returned) and ends before its release is sent. Equal
//!   instants count as overlapping: conservative.
//! - **Fences**: a grant asked for after another grant of the same key was
//!   answered carries a larger fence.
//! - **One leader per term**: no two nodes were seen leading the same term.
//! - **Every job ran**: once the faults stop and the cluster heals, every job
//!   a client began must end (no grant lost, no client stuck).
//! - **No leak**: at the end, with every job ended, each key's usage is back
//!   to 0 (read from the leader).

use std::collections::BTreeMap;
use std::time::Duration;

/// One job: a permit held by a client from `start` to `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub key: String,
    pub client: String,
    /// When the acquire was sent.
    pub asked: Duration,
    /// When the permit was held (the acquire returned).
    pub start: Duration,
    /// When the job stopped using it (before the release was sent); `None`
    /// while it runs.
    pub end: Option<Duration>,
    pub fence: u64,
}

/// A broken property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

/// Most jobs of one key that overlap; `limit` is exceeded if greater.
pub fn check_budget(
    jobs: &[Job],
    limits: &BTreeMap<String, u64>,
    run_end: Duration,
) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<(Duration, i8)>> = BTreeMap::new();
    for job in jobs {
        let points = by_key.entry(&job.key).or_default();
        // At one instant a start sorts before an end (-1 < +1 is wrong for that,
        // so starts are 0 and ends 1).
        points.push((job.start, 0));
        points.push((job.end.unwrap_or(run_end), 1));
    }
    let mut violations = Vec::new();
    for (key, mut points) in by_key {
        points.sort();
        let limit = limits.get(key).copied().unwrap_or(0);
        let mut running = 0u64;
        for (at, kind) in points {
            if kind == 0 {
                running += 1;
                if running > limit {
                    violations.push(Violation {
                        kind: "over_limit",
                        detail: format!("{key}: {running} jobs at {at:?}, limit {limit}"),
                    });
                    break;
                }
            } else {
                running -= 1;
            }
        }
    }
    violations
}

/// A grant asked for after another of its key was answered has a larger fence.
pub fn check_fences(jobs: &[Job]) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<&Job>> = BTreeMap::new();
    for job in jobs {
        by_key.entry(&job.key).or_default().push(job);
    }
    let mut violations = Vec::new();
    for (key, mut grants) in by_key {
        grants.sort_by_key(|job| job.start);
        for later in &grants {
            let earlier = grants
                .iter()
                .filter(|job| job.start < later.asked)
                .max_by_key(|job| job.fence);
            if let Some(earlier) = earlier {
                if earlier.fence >= later.fence {
                    violations.push(Violation {
                        kind: "fence_not_increasing",
                        detail: format!(
                            "{key}: fence {} (asked {:?}) after fence {} (held {:?})",
                            later.fence, later.asked, earlier.fence, earlier.start
                        ),
                    });
                    return violations;
                }
            }
        }
    }
    violations
}

/// No two nodes lead one term.
pub fn check_leaders(seen: &BTreeMap<u64, std::collections::BTreeSet<u64>>) -> Vec<Violation> {
    seen.iter()
        .filter(|(_, leaders)| leaders.len() > 1)
        .map(|(term, leaders)| Violation {
            kind: "two_leaders",
            detail: format!("term {term}: nodes {leaders:?}"),
        })
        .collect()
}

/// Every job ended.
pub fn check_every_job_ended(jobs: &[Job]) -> Vec<Violation> {
    jobs.iter()
        .filter(|job| job.end.is_none())
        .take(1)
        .map(|job| Violation {
            kind: "job_never_ended",
            detail: format!("{} of {} held since {:?}", job.key, job.client, job.start),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn job(key: &str, asked: u64, start: u64, end: u64, fence: u64) -> Job {
        Job {
            key: key.into(),
            client: "c".into(),
            asked: ms(asked),
            start: ms(start),
            end: Some(ms(end)),
            fence,
        }
    }

    #[test]
    fn overlapping_jobs_past_the_limit_are_caught_and_touching_ones_count() {
        let limits = BTreeMap::from([("k".to_string(), 1)]);
        let apart = [job("k", 0, 0, 10, 1), job("k", 5, 11, 20, 2)];
        assert!(check_budget(&apart, &limits, ms(100)).is_empty());
        let touching = [job("k", 0, 0, 10, 1), job("k", 5, 10, 20, 2)];
        assert_eq!(
            check_budget(&touching, &limits, ms(100))[0].kind,
            "over_limit"
        );
    }

    #[test]
    fn a_later_grant_with_a_smaller_fence_is_caught() {
        let good = [job("k", 0, 1, 2, 1), job("k", 3, 4, 5, 2)];
        assert!(check_fences(&good).is_empty());
        let bad = [job("k", 0, 1, 2, 5), job("k", 3, 4, 5, 2)];
        assert_eq!(check_fences(&bad)[0].kind, "fence_not_increasing");
        // Asked before the other was answered: concurrent, any order.
        let concurrent = [job("k", 0, 4, 6, 5), job("k", 1, 3, 5, 2)];
        assert!(check_fences(&concurrent).is_empty());
    }

    #[test]
    fn two_leaders_in_one_term_are_caught() {
        let mut seen = BTreeMap::new();
        seen.insert(3, [1, 2].into_iter().collect());
        seen.insert(4, [2].into_iter().collect());
        assert_eq!(check_leaders(&seen).len(), 1);
    }
}
