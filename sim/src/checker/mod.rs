//! The properties a run must keep, checked from what the clients and the
//! harness saw ([`crate::history`]), not from what the nodes say about
//! themselves.
//!
//! - **Budget** (here): per key, and per capped group, the permits jobs hold
//!   at once never exceed the limit that applied to the newest grant among
//!   them. A job holds from its claim's answer to just before its release is
//!   sent (lease draws count, a lease's footprint counting against the same
//!   limit). A lowered limit applies to new grants only: work already
//!   running keeps its permits, so the bound is the largest limit that could
//!   have been in force while some job of the overlap was being granted. A
//!   force release ends a job's hold when it is sent (the job's release
//!   will find its grant gone).
//! - **Fences** (here): a grant asked for after another grant of the same
//!   key was answered carries a larger fence.
//! - **One leader per term** (here).
//! - **Every job ended** (here): once the faults stop, every job a client
//!   began must end.
//! - **Usage is linearizable** (`usage.rs`): every usage read lies between
//!   the permits definitely held and those possibly held while it ran.
//! - **Acknowledged writes are kept** and **a repeated `requestId` gets the
//!   same answer** (`writes.rs`).

pub mod usage;
pub mod writes;

use std::collections::BTreeMap;
use std::time::Duration;

use permitd_core::KeyConfig;

use crate::history::{ForceRelease, Records, Write, Written};

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

/// When faults may act: `[from, until]`, the nemesis's window and the time
/// the cluster takes to settle after it heals. Outside it the network
/// delivers in milliseconds, every clock is right and no node is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turbulence {
    pub from: Duration,
    pub until: Duration,
}

impl Turbulence {
    /// Whether faults may have acted at some instant of `[from, until]`.
    pub fn touches(turbulence: Option<Turbulence>, from: Duration, until: Duration) -> bool {
        turbulence.is_some_and(|window| from <= window.until && until >= window.from)
    }
}

/// One job: permits a client held from `start` to `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub key: String,
    pub group: String,
    pub client_id: String,
    pub permits: u64,
    /// When the request that brought the permits was sent.
    pub asked: Duration,
    /// When the request was answered (for lease draws: when the lease was).
    pub answered: Duration,
    /// When the permits were held (the claim answered, or the draw made).
    pub start: Duration,
    /// When the job stopped using them (before the release was sent); `None`
    /// while it runs.
    pub end: Option<Duration>,
    pub fence: u64,
}

/// Every job of the history: held grants, and draws from leases.
pub fn jobs(records: &Records) -> Vec<Job> {
    let mut jobs = Vec::new();
    for ask in &records.asks {
        let (Some(held), Some(answered)) = (ask.held(), ask.answered()) else {
            continue;
        };
        let crate::history::AskOutcome::Answered { fence, .. } = ask.outcome else {
            continue;
        };
        jobs.push(Job {
            key: ask.key.clone(),
            group: ask.group.clone(),
            client_id: ask.client_id.clone(),
            permits: held.permits,
            asked: ask.sent,
            answered,
            start: held.from,
            end: held.until,
            fence,
        });
    }
    for lease in &records.leases {
        let (Some(held), Some(answered)) = (&lease.lease, lease.answered) else {
            continue;
        };
        for draw in &held.draws {
            jobs.push(Job {
                key: lease.key.clone(),
                group: draw.group.clone(),
                client_id: lease.client_id.clone(),
                permits: draw.permits,
                asked: lease.sent,
                answered,
                start: draw.from,
                end: draw.until,
                fence: 0,
            });
        }
    }
    jobs
}

/// One limit write of a key or a group: `None` is no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LimitWrite {
    sent: Duration,
    acked: Option<Duration>,
    limit: Option<u64>,
}

/// The largest limit that may have been in force at some instant of
/// `[from, to]`, given the writes (in the order they were sent, each sent
/// after the one before was answered or failed); `None`: uncapped. A write
/// was possibly in force then if it was sent by `to` and no write sent after
/// it was answered had itself been answered by `from`. A write that was
/// never answered may take effect at any time after it was sent.
fn largest_limit(writes: &[LimitWrite], from: Duration, to: Duration) -> Option<u64> {
    let superseded = |write: &LimitWrite| {
        write.acked.is_some_and(|acked| {
            writes
                .iter()
                .any(|later| later.sent >= acked && later.acked.is_some_and(|at| at <= from))
        })
    };
    let mut largest = Some(0);
    for write in writes.iter().filter(|w| w.sent <= to && !superseded(w)) {
        largest = match (largest, write.limit) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    largest
}

/// The limit writes of every key, starting with the cluster's default.
fn key_limits(writes: &[Write], defaults: &KeyConfig) -> BTreeMap<String, Vec<LimitWrite>> {
    let mut limits: BTreeMap<String, Vec<LimitWrite>> = BTreeMap::new();
    for write in writes {
        let Written::Key(config) = &write.what else {
            continue;
        };
        let scope = limits.entry(write.key.clone()).or_insert_with(|| {
            vec![LimitWrite {
                sent: Duration::ZERO,
                acked: Some(Duration::ZERO),
                limit: Some(defaults.limit),
            }]
        });
        scope.push(LimitWrite {
            sent: write.sent,
            acked: write.acked,
            limit: Some(config.limit),
        });
    }
    limits
}

/// The cap writes of every capped group, starting uncapped.
fn group_caps(writes: &[Write]) -> BTreeMap<(String, String), Vec<LimitWrite>> {
    let mut caps: BTreeMap<(String, String), Vec<LimitWrite>> = BTreeMap::new();
    for write in writes {
        let Written::Group(group, config) = &write.what else {
            continue;
        };
        let scope = caps
            .entry((write.key.clone(), group.clone()))
            .or_insert_with(|| {
                vec![LimitWrite {
                    sent: Duration::ZERO,
                    acked: Some(Duration::ZERO),
                    limit: None,
                }]
            });
        scope.push(LimitWrite {
            sent: write.sent,
            acked: write.acked,
            limit: config.limit,
        });
    }
    caps
}

/// `job` as far as its permits are certainly its own: a force release of its
/// client on its key, sent after it began, ends it then; one that may have
/// taken effect after its grant (sent before the job held, and not answered
/// before the job asked) leaves it nothing.
fn unless_force_released(job: &Job, force_releases: &[ForceRelease]) -> Option<Job> {
    let mut job = job.clone();
    for release in force_releases
        .iter()
        .filter(|release| release.key == job.key && release.client_id == job.client_id)
    {
        if release.sent <= job.start {
            if release.acked.is_none_or(|acked| acked >= job.asked) {
                return None;
            }
        } else if job.end.is_none_or(|end| release.sent < end) {
            job.end = Some(release.sent);
        }
    }
    Some(job)
}

/// Per key and per capped group, the permits held at once never exceed the
/// largest limit that may have applied to the newest grant among them.
///
/// At any instant the jobs holding permits were all granted and none
/// released, so when the newest of them was granted all of them were
/// outstanding, and that grant kept the outstanding permits within the limit
/// in force then: a limit in force at some instant between its request and
/// its claim. A lowered limit applies to new grants only, which this bound
/// allows: running work is never evicted.
pub fn check_budget(
    jobs: &[Job],
    writes: &[Write],
    force_releases: &[ForceRelease],
    defaults: &KeyConfig,
    run_end: Duration,
) -> Vec<Violation> {
    let jobs: Vec<Job> = jobs
        .iter()
        .filter_map(|job| unless_force_released(job, force_releases))
        .collect();
    let mut violations = Vec::new();
    for (key, limits) in key_limits(writes, defaults) {
        let scope: Vec<&Job> = jobs.iter().filter(|job| job.key == key).collect();
        violations.extend(over_limit(&key, &scope, &limits, run_end));
    }
    for ((key, group), caps) in group_caps(writes) {
        let scope: Vec<&Job> = jobs
            .iter()
            .filter(|job| job.key == key && job.group == group)
            .collect();
        violations.extend(over_limit(
            &format!("{key}/{group}"),
            &scope,
            &caps,
            run_end,
        ));
    }
    violations
}

/// The first instant `jobs` hold more than the largest limit that may have
/// applied to the newest grant among them.
fn over_limit(
    scope: &str,
    jobs: &[&Job],
    limits: &[LimitWrite],
    run_end: Duration,
) -> Option<Violation> {
    // Equal instants count as overlapping: conservative.
    for job in jobs {
        let at = job.start;
        let holding: Vec<&&Job> = jobs
            .iter()
            .filter(|other| other.start <= at && other.end.unwrap_or(run_end) >= at)
            .collect();
        let permits: u64 = holding.iter().map(|other| other.permits).sum();
        // The newest grant among them: not one that was held before another
        // of them was even asked for.
        let newest = holding
            .iter()
            .filter(|candidate| holding.iter().all(|other| other.asked <= candidate.start));
        let mut largest = Some(0);
        for other in newest {
            largest = match (largest, largest_limit(limits, other.asked, other.start)) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        if let Some(limit) = largest.filter(|limit| permits > *limit) {
            return Some(Violation {
                kind: "over_limit",
                detail: format!(
                    "{scope}: {permits} permits held at {at:?} by {} jobs, limit at most {limit}",
                    holding.len()
                ),
            });
        }
    }
    None
}

/// A grant asked for after another of its key was answered has a larger fence.
pub fn check_fences(jobs: &[Job]) -> Vec<Violation> {
    let mut by_key: BTreeMap<&str, Vec<&Job>> = BTreeMap::new();
    for job in jobs.iter().filter(|job| job.fence > 0) {
        by_key.entry(&job.key).or_default().push(job);
    }
    let mut violations = Vec::new();
    for (key, mut grants) in by_key {
        grants.sort_by_key(|job| job.answered);
        for later in &grants {
            let earlier = grants
                .iter()
                .filter(|job| job.answered < later.asked)
                .max_by_key(|job| job.fence);
            if let Some(earlier) = earlier {
                if earlier.fence >= later.fence {
                    violations.push(Violation {
                        kind: "fence_not_increasing",
                        detail: format!(
                            "{key}: fence {} (asked {:?}) after fence {} (answered {:?})",
                            later.fence, later.asked, earlier.fence, earlier.answered
                        ),
                    });
                    return violations;
                }
            }
        }
    }
    violations
}

/// Every job ended.
pub fn check_every_job_ended(jobs: &[Job]) -> Vec<Violation> {
    jobs.iter()
        .filter(|job| job.end.is_none())
        .take(1)
        .map(|job| Violation {
            kind: "job_never_ended",
            detail: format!(
                "{} of {} held since {:?}",
                job.key, job.client_id, job.start
            ),
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
            group: "g".into(),
            client_id: format!("c{asked}-{start}"),
            permits: 1,
            asked: ms(asked),
            answered: ms(start),
            start: ms(start),
            end: Some(ms(end)),
            fence,
        }
    }

    fn limit_write(key: &str, sent: u64, acked: Option<u64>, limit: u64) -> Write {
        Write {
            key: key.into(),
            what: Written::Key(KeyConfig {
                limit,
                ..KeyConfig::default()
            }),
            sent: ms(sent),
            acked: acked.map(ms),
        }
    }

    fn budget(jobs: &[Job], writes: &[Write], releases: &[ForceRelease]) -> Vec<Violation> {
        check_budget(jobs, writes, releases, &KeyConfig::default(), ms(1_000))
    }

    #[test]
    fn overlapping_jobs_past_the_limit_are_caught_and_touching_ones_count() {
        let writes = [limit_write("k", 0, Some(1), 1)];
        let apart = [job("k", 2, 2, 10, 1), job("k", 5, 11, 20, 2)];
        assert!(budget(&apart, &writes, &[]).is_empty());
        let touching = [job("k", 2, 2, 10, 1), job("k", 5, 10, 20, 2)];
        assert_eq!(budget(&touching, &writes, &[])[0].kind, "over_limit");
    }

    #[test]
    fn permits_count_and_a_capped_group_is_held_to_its_cap() {
        let mut two = job("k", 2, 2, 10, 1);
        two.permits = 2;
        let writes = [limit_write("k", 0, Some(1), 2)];
        assert!(budget(std::slice::from_ref(&two), &writes, &[]).is_empty());
        let with_one_more = [two.clone(), job("k", 3, 4, 6, 2)];
        assert_eq!(budget(&with_one_more, &writes, &[])[0].kind, "over_limit");
        let capped = [
            writes[0].clone(),
            Write {
                key: "k".into(),
                what: Written::Group(
                    "g".into(),
                    permitd_core::GroupConfig {
                        limit: Some(1),
                        permitted: true,
                    },
                ),
                sent: ms(0),
                acked: Some(ms(1)),
            },
        ];
        let in_the_group = [job("k", 2, 2, 10, 1), job("k", 3, 4, 6, 2)];
        let caught = budget(&in_the_group, &capped, &[]);
        assert!(caught[0].detail.starts_with("k/g"), "{caught:?}");
    }

    #[test]
    fn a_lowered_limit_binds_new_grants_only() {
        // Limit 2, both jobs granted; lowered to 1 while they run: fine.
        let writes = [
            limit_write("k", 0, Some(1), 2),
            limit_write("k", 5, Some(6), 1),
        ];
        let granted_before = [job("k", 2, 3, 20, 1), job("k", 2, 4, 20, 2)];
        assert!(budget(&granted_before, &writes, &[]).is_empty());
        // A second job granted after the lowering was answered: caught.
        let granted_after = [job("k", 2, 3, 20, 1), job("k", 7, 8, 20, 2)];
        assert_eq!(budget(&granted_after, &writes, &[])[0].kind, "over_limit");
        // Asked while the lowering was under way: the old limit may have applied.
        let racing = [job("k", 2, 3, 20, 1), job("k", 5, 8, 20, 2)];
        assert!(budget(&racing, &writes, &[]).is_empty());
        // An unanswered raise may take effect at any time.
        let unanswered = [
            limit_write("k", 0, Some(1), 1),
            limit_write("k", 5, None, 2),
        ];
        let after_it = [job("k", 2, 3, 20, 1), job("k", 300, 301, 320, 2)];
        assert!(budget(&after_it, &unanswered, &[]).is_empty());
    }

    #[test]
    fn a_force_released_job_holds_nothing_from_the_release() {
        let writes = [limit_write("k", 0, Some(1), 1)];
        let first = job("k", 2, 2, 50, 1);
        let second = job("k", 12, 13, 20, 2);
        let release = ForceRelease {
            key: "k".into(),
            client_id: first.client_id.clone(),
            sent: ms(10),
            acked: Some(ms(11)),
        };
        let jobs = [first, second];
        assert_eq!(budget(&jobs, &writes, &[])[0].kind, "over_limit");
        assert!(budget(&jobs, &writes, &[release]).is_empty());
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
}
