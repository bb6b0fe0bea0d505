//! The followers' leader contact gaps over a measured window: how long each
//! follower went between two AppendEntries (heartbeats or appends) from the
//! leader, from the nodes' `permitd_raft_leader_contact_gap_seconds`
//! histogram (`node/src/raft/stall_probe.rs`).
//!
//! The histogram keeps cumulative bucket counts since the node started, so a
//! window's gaps are the difference of two readings, summed over the
//! followers. A histogram only knows which bucket a gap fell in, so the p99.9
//! and the longest gap are given as their bucket, `(above, at most]` in ms:
//! with heartbeats every 40 ms an idle follower sits in the 40–60 ms bucket,
//! and a gap past the leader lease plus the election timeout lets a follower
//! start an election.

use serde_json::{json, Value};

/// The histogram's bucket series in a Prometheus text page.
const BUCKET_SERIES: &str = "permitd_raft_leader_contact_gap_seconds_bucket{";

/// Cumulative counts by upper bound (seconds, `+Inf` last), as exported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GapBuckets(Vec<(f64, u64)>);

impl GapBuckets {
    /// The contact gap buckets of one node's `/metrics` page (empty when the
    /// node has recorded none: a leader, or a follower before its second
    /// append).
    pub fn parse(page: &str) -> Self {
        let buckets = page
            .lines()
            .filter(|line| line.starts_with(BUCKET_SERIES))
            .filter_map(|line| {
                let bound = line.split("le=\"").nth(1)?.split('"').next()?;
                let bound = match bound {
                    "+Inf" => f64::INFINITY,
                    finite => finite.parse().ok()?,
                };
                let count = line.rsplit(' ').next()?.parse::<f64>().ok()?;
                Some((bound, count as u64))
            })
            .collect();
        Self(buckets)
    }

    /// The count in the bucket bounded by `bound` (0 when there is none).
    fn count_at(&self, bound: f64) -> u64 {
        self.0
            .iter()
            .find(|(other, _)| *other == bound)
            .map_or(0, |(_, count)| *count)
    }

    /// The gaps recorded between `earlier` and `self` (a node that recorded
    /// nothing at the opening counts from zero).
    pub fn since(&self, earlier: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|&(bound, count)| (bound, count.saturating_sub(earlier.count_at(bound))))
                .collect(),
        )
    }

    /// Both nodes' gaps together (the buckets are the same on every node).
    pub fn plus(&self, other: &Self) -> Self {
        if self.0.is_empty() {
            return other.clone();
        }
        Self(
            self.0
                .iter()
                .map(|&(bound, count)| (bound, count + other.count_at(bound)))
                .collect(),
        )
    }

    /// Gaps recorded (the `+Inf` bucket's count).
    pub fn count(&self) -> u64 {
        self.0.last().map_or(0, |(_, count)| *count)
    }

    /// The bucket of the `q` quantile (nearest rank), in ms.
    pub fn quantile_ms(&self, q: f64) -> Option<Bucket> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = ((count as f64 * q).ceil() as u64).clamp(1, count);
        let at = self.0.iter().position(|(_, below)| *below >= rank)?;
        Some(self.bucket(at))
    }

    /// The bucket of the longest gap, in ms.
    pub fn max_ms(&self) -> Option<Bucket> {
        self.quantile_ms(1.0)
    }

    fn bucket(&self, at: usize) -> Bucket {
        let above = if at == 0 { 0.0 } else { self.0[at - 1].0 * 1e3 };
        let at_most = self.0[at].0 * 1e3;
        Bucket {
            above_ms: above,
            at_most_ms: at_most.is_finite().then_some(at_most),
        }
    }
}

/// A histogram bucket in ms: `(above_ms, at_most_ms]`, unbounded above when
/// `at_most_ms` is `None`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub above_ms: f64,
    pub at_most_ms: Option<f64>,
}

impl Bucket {
    /// `40–60 ms`, `≤ 1 ms`, `> 2000 ms`.
    pub fn cell(&self) -> String {
        match self.at_most_ms {
            None => format!("> {:.0} ms", self.above_ms),
            Some(at_most) if self.above_ms == 0.0 => format!("≤ {} ms", trim(at_most)),
            Some(at_most) => format!("{}–{} ms", trim(self.above_ms), trim(at_most)),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"aboveMs": self.above_ms, "atMostMs": self.at_most_ms})
    }
}

/// `1`, `2.5`: bucket bounds without trailing zeros.
fn trim(ms: f64) -> String {
    let text = format!("{ms:.1}");
    text.trim_end_matches(".0").to_owned()
}

/// The followers' contact gaps over one window.
#[derive(Debug, Clone, Default)]
pub struct ContactGaps {
    pub buckets: GapBuckets,
}

impl ContactGaps {
    /// `p99.9 40–60 ms · max 60–80 ms (1,234 gaps)`; `—` without gaps.
    pub fn cell(&self) -> String {
        match (self.buckets.quantile_ms(0.999), self.buckets.max_ms()) {
            (Some(p999), Some(max)) => format!(
                "p99.9 {} · max {} ({} gaps)",
                p999.cell(),
                max.cell(),
                super::report::thousands(self.buckets.count() as f64)
            ),
            _ => "—".into(),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({"gaps": self.buckets.count(),
            "p999Ms": self.buckets.quantile_ms(0.999).map(|bucket| bucket.to_json()),
            "maxMs": self.buckets.max_ms().map(|bucket| bucket.to_json())})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(counts: &[(&str, u64)]) -> String {
        let mut text = "# TYPE permitd_raft_leader_contact_gap_seconds histogram\n".to_owned();
        for (bound, count) in counts {
            text.push_str(&format!(
                "permitd_raft_leader_contact_gap_seconds_bucket{{le=\"{bound}\"}} {count}\n"
            ));
        }
        text.push_str("permitd_raft_leader_contact_gap_seconds_sum 1.5\n");
        text
    }

    #[test]
    fn window_gaps_are_differences_summed_over_followers() {
        let before = GapBuckets::parse(&page(&[("0.04", 5), ("0.06", 10), ("+Inf", 10)]));
        let after = GapBuckets::parse(&page(&[("0.04", 5), ("0.06", 1_009), ("+Inf", 1_010)]));
        let other = GapBuckets::parse(&page(&[("0.04", 0), ("0.06", 0), ("+Inf", 0)]));
        let window = after
            .since(&before)
            .plus(&other.since(&GapBuckets::default()));
        assert_eq!(window.count(), 1_000);
        let p999 = window.quantile_ms(0.999).expect("gaps");
        assert_eq!(p999.cell(), "40–60 ms");
        let max = window.max_ms().expect("gaps");
        assert_eq!(max.cell(), "> 60 ms");
        assert_eq!(window.quantile_ms(0.5).expect("gaps").cell(), "40–60 ms");
    }

    #[test]
    fn no_gaps_have_no_quantile() {
        let gaps = ContactGaps {
            buckets: GapBuckets::parse("permitd_http_requests_total{} 3\n"),
        };
        assert_eq!(gaps.cell(), "—");
        assert_eq!(
            GapBuckets::parse(&page(&[("0.001", 2), ("+Inf", 2)]))
                .max_ms()
                .map(|bucket| bucket.cell()),
            Some("≤ 1 ms".into())
        );
    }
}
