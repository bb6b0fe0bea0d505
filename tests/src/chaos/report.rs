//! The report of one chaos run: JSON and a short markdown table, written to
//! `$CARGO_TARGET_DIR/chaos/<random state>.json` and `.md` (or `target/chaos/` next to
//! the test binary's profile folder when `CARGO_TARGET_DIR` is not set).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{json, Value};

use super::checker::{Concurrency, Drained, SampleStats, Violation};
use super::nemesis::{FaultKind, FaultRecord};
use super::random::RandomState;
use super::workload::KeySpec;
use super::REPLAY_VARIABLE;

/// Everything one run found.
#[derive(Debug, Clone)]
pub struct Report {
    pub random_state: RandomState,
    pub profile: &'static str,
    pub requested_seconds: u64,
    pub elapsed_ms: u64,
    pub faults: Vec<FaultRecord>,
    pub fault_counts: BTreeMap<FaultKind, usize>,
    pub keys: Vec<KeyReport>,
    pub jobs_enqueued: usize,
    pub jobs_run: usize,
    pub jobs_never_run: usize,
    pub repeated_admits: u64,
    pub violations_by_kind: BTreeMap<&'static str, u64>,
    pub violations: Vec<Violation>,
}

/// One key's figures.
#[derive(Debug, Clone)]
pub struct KeyReport {
    pub spec: KeySpec,
    pub jobs_run: usize,
    pub by_grant: usize,
    pub by_lease: usize,
    pub concurrency: Concurrency,
    pub samples: SampleStats,
    /// How usage came back to zero after the drain.
    pub drained: Drained,
}

impl Report {
    pub fn violation_total(&self) -> u64 {
        self.violations_by_kind.values().sum()
    }

    pub fn to_json(&self) -> Value {
        let counts: BTreeMap<&str, usize> = self
            .fault_counts
            .iter()
            .map(|(kind, count)| (kind.name(), *count))
            .collect();
        let keys: Vec<Value> = self
            .keys
            .iter()
            .map(|key| {
                json!({
                    "key": key.spec.key,
                    "mode": key.spec.mode,
                    "limit": key.spec.limit,
                    "bound": key.spec.bound,
                    "jobsRun": key.jobs_run,
                    "byGrant": key.by_grant,
                    "byLease": key.by_lease,
                    "maxConcurrency": key.concurrency.max,
                    "maxConcurrencyAtMs": key.concurrency.at_ms,
                    "usageSamples": key.samples.samples,
                    "usageReadsFailed": key.samples.failed_reads,
                    "maxHeldByCluster": key.samples.max_held,
                    "maxRunningDuringRead": key.samples.max_running_during_read,
                    "drainedAfterMs": match &key.drained {
                        Drained::Zero(ms) => Some(*ms),
                        _ => None,
                    },
                    "expiredLeasesLeftUntilARound": match &key.drained {
                        Drained::ZeroAfterRound(left) => Some(left),
                        _ => None,
                    },
                    "leftAfterDrain": match &key.drained {
                        Drained::Leak(left) => Some(left),
                        _ => None,
                    },
                })
            })
            .collect();
        json!({
            "randomState": self.random_state,
            "replay": format!("{REPLAY_VARIABLE}={}", self.random_state),
            "profile": self.profile,
            "requestedSeconds": self.requested_seconds,
            "elapsedMs": self.elapsed_ms,
            "faultCounts": counts,
            "faults": self.faults.iter().map(FaultRecord::to_json).collect::<Vec<_>>(),
            "jobs": {
                "enqueued": self.jobs_enqueued,
                "run": self.jobs_run,
                "neverRun": self.jobs_never_run,
                "repeatedAdmits": self.repeated_admits,
            },
            "keys": keys,
            "violationTotal": self.violation_total(),
            "violationsByKind": self.violations_by_kind,
            "violations": self.violations.iter().map(Violation::to_json).collect::<Vec<_>>(),
        })
    }

    pub fn to_markdown(&self) -> String {
        let mut text = format!(
            "# chaos run `{REPLAY_VARIABLE}={}` ({} profile, {} s requested, {:.1} s elapsed)\n\n",
            self.random_state,
            self.profile,
            self.requested_seconds,
            self.elapsed_ms as f64 / 1000.0
        );
        text.push_str("| fault | injected |\n|---|---:|\n");
        for (kind, count) in &self.fault_counts {
            text.push_str(&format!("| {} | {count} |\n", kind.name()));
        }
        let total: usize = self.fault_counts.values().sum();
        text.push_str(&format!("| **total** | **{total}** |\n\n"));
        text.push_str(
            "| key | mode | jobs run (grant/lease) | max running | bound | max held (cluster) | drained |\n\
             |---|---|---:|---:|---:|---:|---|\n",
        );
        for key in &self.keys {
            let drained = match &key.drained {
                Drained::Zero(ms) => format!("{ms} ms"),
                Drained::ZeroAfterRound(left) => format!("after a round (left {left})"),
                Drained::Leak(left) => format!("LEAK: {left}"),
            };
            text.push_str(&format!(
                "| {} | {} | {} ({}/{}) | {} | {} | {} | {} |\n",
                key.spec.key,
                key.spec.mode,
                key.jobs_run,
                key.by_grant,
                key.by_lease,
                key.concurrency.max,
                key.spec.bound,
                key.samples.max_held,
                drained
            ));
        }
        text.push_str(&format!(
            "\njobs: {} enqueued, {} run, {} never run, {} repeated admits (no-ops)\n\n",
            self.jobs_enqueued, self.jobs_run, self.jobs_never_run, self.repeated_admits
        ));
        text.push_str(&format!("violations: **{}**", self.violation_total()));
        for (kind, count) in &self.violations_by_kind {
            text.push_str(&format!(", {kind}: {count}"));
        }
        text.push('\n');
        for violation in &self.violations {
            text.push_str(&format!(
                "- {} {:?} at {} ms: {}\n",
                violation.kind, violation.key, violation.at_ms, violation.detail
            ));
        }
        text
    }

    /// Writes `<dir>/<random state>.json` and `.md`; returns the JSON path.
    pub fn write(&self) -> std::io::Result<PathBuf> {
        let dir = report_dir();
        std::fs::create_dir_all(&dir)?;
        let json_path = dir.join(format!("{}.json", self.random_state));
        let json = serde_json::to_string_pretty(&self.to_json()).map_err(std::io::Error::other)?;
        std::fs::write(&json_path, json)?;
        std::fs::write(
            dir.join(format!("{}.md", self.random_state)),
            self.to_markdown(),
        )?;
        Ok(json_path)
    }
}

/// `$CARGO_TARGET_DIR/chaos`, else `<target>/chaos` from the test's own path.
pub fn report_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir).join("chaos");
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> → target
    exe.ancestors()
        .nth(3)
        .map(|target| target.join("chaos"))
        .unwrap_or_else(|| PathBuf::from("target/chaos"))
}
