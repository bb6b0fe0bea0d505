//! The reuse gap: how long a freed permit sits idle before it is admitted
//! again, on a key whose demand is far above its limit.
//!
//! A key's permits are alike, so a freed permit is matched to a later admission
//! by count: with limit `L`, no more than `L` permits are admitted and not yet
//! returned, so the `(k + L)`-th admission of the key (its first one numbered
//! 0) cannot happen before the `k`-th permit returned reached the holder. The
//! gap of returned permit `k` is the time between the two. A permit's return
//! is timed when the queue's message reporting it leaves the runner (the
//! `RELEASES_SENT_TARGET` trace event); on loopback it reaches the leader tens
//! of microseconds later, so the gap measured is the real one plus that.
//!
//! The trace events are caught by a `tracing` layer installed once per
//! process ([`install`]), filtered to that one target so nothing else is
//! dispatched.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use permitd_client::queue::RELEASES_SENT_TARGET;
use tracing::field::{Field, Visit};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Returns caught so far: (time sent, key, permits).
static SENT: Mutex<Vec<(Instant, String, u64)>> = Mutex::new(Vec::new());
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Installs the layer as the process's subscriber (once); false when another
/// subscriber was there first (no gaps are measured then).
pub fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        let filter = Targets::new().with_target(RELEASES_SENT_TARGET, tracing::Level::TRACE);
        let subscriber = tracing_subscriber::registry().with(ReleasesSent.with_filter(filter));
        tracing::subscriber::set_global_default(subscriber).is_ok()
    })
}

/// Takes every return of `key` caught so far, oldest first, one entry per
/// permit.
pub fn take_returns(key: &str) -> Vec<Instant> {
    let mut sent = SENT.lock().expect("returns lock");
    let mut returns = Vec::new();
    sent.retain(|(at, of, permits)| {
        if of != key {
            return true;
        }
        returns.extend(std::iter::repeat_n(*at, *permits as usize));
        false
    });
    returns.sort_unstable();
    returns
}

/// Gaps in ms of the returns that fall in `[from, to)`, each matched to the
/// admission `limit` later (see the module's comment); returns whose match
/// is not in `admissions` are left out.
pub fn gaps_ms(
    returns: &[Instant],
    admissions: &[Instant],
    limit: usize,
    from: Instant,
    to: Instant,
) -> Vec<f64> {
    let mut admissions = admissions.to_vec();
    admissions.sort_unstable();
    returns
        .iter()
        .enumerate()
        .filter(|(_, at)| (from..to).contains(*at))
        .filter_map(|(k, at)| {
            let admitted = admissions.get(k + limit)?;
            Some(admitted.saturating_duration_since(*at).as_secs_f64() * 1_000.0)
        })
        .collect()
}

struct ReleasesSent;

impl<S: tracing::Subscriber> Layer<S> for ReleasesSent {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let at = Instant::now();
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let (Some(key), Some(permits)) = (fields.key, fields.releases) {
            SENT.lock().expect("returns lock").push((at, key, permits));
        }
    }
}

#[derive(Default)]
struct Fields {
    key: Option<String>,
    releases: Option<u64>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "releases" {
            self.releases = Some(value);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "key" {
            self.key = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "key" {
            self.key = Some(format!("{value:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_return_is_matched_to_the_admission_a_limit_later() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // Limit 2: admissions 0 and 1 need no return; 2 follows return 0, 3 return 1.
        let admissions = [at(0), at(0), at(13), at(25)];
        let returns = [at(10), at(20), at(30)];
        let gaps = gaps_ms(&returns, &admissions, 2, at(0), at(100));
        assert_eq!(gaps, [3.0, 5.0], "the third return has no admission yet");
        let windowed = gaps_ms(&returns, &admissions, 2, at(15), at(100));
        assert_eq!(windowed, [5.0]);
    }
}
