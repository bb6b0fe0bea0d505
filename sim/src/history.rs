//! What the runners, the operator and the sampler saw, as the checkers read
//! it: every request for permits and its fate, every lease, every write the
//! operator sent and whether it was answered, every usage read, every
//! `requestId` replay, and the configuration read back at the end.
//!
//! Times are simulated time since the run began, taken by the host that saw
//! the event; a record is written when its call is sent and completed when
//! its answer (or its end) comes, so a run cut short still shows what was
//! under way.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use permitd_core::{GroupConfig, KeyConfig};

/// One request for permits (a `request`, a batch item, or a whole
/// `acquire_with`), as its runner saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub key: String,
    pub group: String,
    pub client_id: String,
    /// Permits asked for.
    pub count: u64,
    pub sent: Duration,
    /// The request's `waitMs`: how long a leader may hold it.
    pub wait: Duration,
    /// The runner saw every call of it (`false`: an `acquire_with`, whose
    /// requests and claims the client makes out of sight).
    pub seen: bool,
    pub outcome: AskOutcome,
}

/// How an [`Ask`] ended for its runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskOutcome {
    /// No answer yet.
    Waiting,
    /// The runner stopped waiting for the answer (its call dropped).
    Abandoned { at: Duration },
    /// The call failed (its deadline passed, or the cluster refused it).
    Failed { at: Duration },
    /// Answered: `granted` permits (possibly none) with the newest grant's
    /// fence; what the runner then did with them.
    Answered {
        at: Duration,
        granted: u64,
        fence: u64,
        held: Option<Held>,
        /// When the report releasing every granted permit was answered: from
        /// then on none of them is outstanding.
        returned: Option<Duration>,
    },
}

/// Permits a runner confirmed it holds (its claim answered `ok`), and used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub permits: u64,
    /// When the claim's answer came.
    pub from: Duration,
    /// When the runner stopped using them (its release is sent right after);
    /// `None` while it runs.
    pub until: Option<Duration>,
}

impl Ask {
    /// A request the runner drives itself, sent at `sent`, not answered yet.
    pub fn waiting(
        key: &str,
        group: &str,
        client_id: &str,
        count: u64,
        sent: Duration,
        wait: Duration,
    ) -> Self {
        Self {
            key: key.to_owned(),
            group: group.to_owned(),
            client_id: client_id.to_owned(),
            count,
            sent,
            wait,
            seen: true,
            outcome: AskOutcome::Waiting,
        }
    }

    /// When the answer came, if it did.
    pub fn answered(&self) -> Option<Duration> {
        match self.outcome {
            AskOutcome::Answered { at, .. } => Some(at),
            _ => None,
        }
    }

    /// The permits the runner held and when, if it held any.
    pub fn held(&self) -> Option<&Held> {
        match &self.outcome {
            AskOutcome::Answered { held, .. } => held.as_ref().filter(|held| held.permits > 0),
            _ => None,
        }
    }
}

/// A lease-capable request and the lease it brought, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseAsk {
    pub key: String,
    pub client_id: String,
    pub sent: Duration,
    /// The most one lease of the key holds (`permitsPerLease`).
    pub most: u64,
    /// When the answer came; `None`: never (abandoned, failed or under way).
    pub answered: Option<Duration>,
    /// When the runner stopped waiting without an answer.
    pub gave_up: Option<Duration>,
    pub lease: Option<LeaseHeld>,
}

/// A lease a runner was granted, from its acknowledgement to its settling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHeld {
    /// Its size as the answer granted it.
    pub size: u64,
    /// Its size as the acknowledgement echoed it (0 until acknowledged).
    pub permits: u64,
    /// When the report acknowledging it was answered with the lease live.
    pub acknowledged: Option<Duration>,
    /// When the report retiring and releasing it was sent.
    pub settle_sent: Option<Duration>,
    /// When that report was answered: the lease is gone.
    pub settled: Option<Duration>,
    /// Permits drawn from it, each `(from, until)` as a job would hold them.
    pub draws: Vec<Draw>,
}

/// Permits a runner drew from a lease and worked under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    pub group: String,
    pub permits: u64,
    pub from: Duration,
    pub until: Option<Duration>,
}

/// One configuration write the operator sent: a key's whole configuration, a
/// group's setting, or a key's delete.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub key: String,
    pub what: Written,
    pub sent: Duration,
    /// When the cluster answered it with success; `None`: it failed, and may
    /// or may not have been applied.
    pub acked: Option<Duration>,
}

/// What a [`Write`] set.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    Key(KeyConfig),
    Group(String, GroupConfig),
    Deleted,
}

/// An operator's force release of one client's holdings on a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceRelease {
    pub key: String,
    pub client_id: String,
    pub sent: Duration,
    pub acked: Option<Duration>,
}

/// One answered usage read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRead {
    pub key: String,
    pub sent: Duration,
    pub answered: Duration,
    pub granted: u64,
    pub leased: u64,
}

/// A request sent again with the same `requestId` after its answer (or after
/// its answer was lost), and the two answers' bodies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    pub key: String,
    pub client_id: String,
    /// When the request was first sent.
    pub sent: Duration,
    /// When the repeated request was answered.
    pub answered: Duration,
    pub first: Vec<u8>,
    pub again: Vec<u8>,
}

/// A key's settings as read back from the healed cluster at the end.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReadBack {
    /// `None`: the key is gone (or never had settings).
    pub config: Option<KeyConfig>,
    pub groups: BTreeMap<String, GroupConfig>,
}

/// Everything one run's hosts saw.
#[derive(Debug, Clone, Default)]
pub struct Records {
    pub asks: Vec<Ask>,
    pub leases: Vec<LeaseAsk>,
    pub writes: Vec<Write>,
    pub force_releases: Vec<ForceRelease>,
    pub usage_reads: Vec<UsageRead>,
    pub replays: Vec<Replay>,
    /// Keys read back at the end; `None` if the read failed.
    pub read_back: Option<BTreeMap<String, ReadBack>>,
}

/// The records, shared by every host of one run (they all run on the
/// simulator's one thread).
#[derive(Debug, Clone, Default)]
pub struct History(Arc<Mutex<Records>>);

impl History {
    pub fn lock(&self) -> MutexGuard<'_, Records> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a request for permits just sent; answers its index.
    pub fn ask(&self, ask: Ask) -> usize {
        let mut records = self.lock();
        records.asks.push(ask);
        records.asks.len() - 1
    }

    /// Changes the request recorded at `index`.
    pub fn update_ask(&self, index: usize, change: impl FnOnce(&mut Ask)) {
        change(&mut self.lock().asks[index]);
    }

    pub fn lease(&self, lease: LeaseAsk) -> usize {
        let mut records = self.lock();
        records.leases.push(lease);
        records.leases.len() - 1
    }

    pub fn update_lease(&self, index: usize, change: impl FnOnce(&mut LeaseAsk)) {
        change(&mut self.lock().leases[index]);
    }

    pub fn snapshot(&self) -> Records {
        self.lock().clone()
    }
}
