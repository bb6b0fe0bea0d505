//! The rounds driver's decisions, pure: what goes into an entry, how the
//! entry's answers map back to the requests waiting for them, and which
//! empty-handed requests are held for a later round. No IO, no clock: time is
//! passed in, as in [`super::schedule`], so every rule is unit-tested here and
//! the async driver (`rounds.rs`) keeps only proposing, locking and sending.

use std::time::Duration;

use permitd_core::contract::protocol::{
    BlockedReason, GrantReport, PermitGrant, PermitRequest, PermitSync, PermitSyncResult, V1,
};
use permitd_core::engine::rehearsal::Rehearsal;
use permitd_core::limits::MAX_REQUEST_WAIT_MS;
use permitd_core::Event;
use permitd_storage::{Command, KeyRound, KeySync};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::round_error::RoundError;

/// Where one answer goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, RoundError>>;

/// A request parked until its key's round.
#[derive(Debug)]
pub(crate) struct WaitingRequest {
    pub(crate) request: PermitRequest,
    pub(crate) reply: Reply<PermitGrant>,
    /// Its bytes as received (the schedule's bounds count them).
    pub(crate) bytes: usize,
    /// Until when a round that grants it nothing may hold it instead of
    /// answering: only pure demand requests with a `waitMs` (see [`holdable`]).
    pub(crate) answer_by: Option<Instant>,
}

impl WaitingRequest {
    /// A request arrived at `now`, with its hold deadline if it may be held.
    pub(crate) fn new(
        request: PermitRequest,
        reply: Reply<PermitGrant>,
        bytes: usize,
        now: Instant,
    ) -> Self {
        let answer_by = holdable(&request).map(|wait| now + wait);
        Self {
            request,
            reply,
            bytes,
            answer_by,
        }
    }
}

/// What a grant report weighs in an entry besides its id: the JSON around it
/// and two counts (the leader's bounds count bytes as received; a split-off
/// report was never received alone).
const GRANT_REPORT_BYTES: usize = 64;

/// A request's grant reports, split off to be applied with the next entry as
/// a sync would, while its demand waits for the key's round.
#[derive(Debug, PartialEq)]
pub(crate) struct EarlyReports {
    pub(crate) sync: PermitSync,
    /// Their share of the request's bytes.
    pub(crate) bytes: usize,
}

/// Splits a request's grant reports off into a sync for the next entry and
/// returns the request to park without them, with the bytes left to it. A
/// request without grant reports is parked whole. Lease reports stay: they
/// are heartbeats, and the round's lease pass reads them. `waiting` is made
/// first, so that whether it may be held still looks at the request as
/// received ([`holdable`]): a client waiting to hear about its claims is
/// answered by the first round.
pub(crate) fn split_early_reports(
    mut waiting: WaitingRequest,
) -> (WaitingRequest, Option<EarlyReports>) {
    if waiting.request.grants.is_empty() {
        return (waiting, None);
    }
    let grants = std::mem::take(&mut waiting.request.grants);
    let estimate: usize = grants
        .iter()
        .map(|report| report.grant_id.len() + GRANT_REPORT_BYTES)
        .sum();
    let bytes = estimate.min(waiting.bytes);
    waiting.bytes -= bytes;
    let sync = PermitSync {
        v: V1,
        client_id: waiting.request.client_id.clone(),
        grants,
        leases: None,
    };
    (waiting, Some(EarlyReports { sync, bytes }))
}

/// The answer to a request whose grant reports went ahead: the round's
/// answer with the early sync's grant results. A remembered answer (a retried
/// `requestId`) gets them too, in place of the ones it was stored with: the
/// reports were applied again now, and cumulative reports make that harmless.
pub(crate) fn with_early_results(mut answer: PermitGrant, early: PermitSyncResult) -> PermitGrant {
    answer.grant_results = early.grant_results;
    answer
}

/// A sync parked until the next entry.
#[derive(Debug)]
pub(crate) struct WaitingSync {
    pub(crate) key: String,
    pub(crate) sync: PermitSync,
    pub(crate) reply: Reply<PermitSyncResult>,
}

/// Where a round's answer to one request goes.
#[derive(Debug)]
pub(crate) enum RoundReply {
    /// Answered whatever the round gives.
    Now(Reply<PermitGrant>),
    /// May be held if the round gives nothing: the request is kept (a copy
    /// went into the entry) to join a later round.
    Holdable(Box<WaitingRequest>),
}

impl RoundReply {
    pub(crate) fn send(self, answer: Result<PermitGrant, RoundError>) {
        let reply = match self {
            Self::Now(reply) => reply,
            Self::Holdable(waiting) => waiting.reply,
        };
        let _ = reply.send(answer);
    }
}

/// One key's round: where its answers go, in request order.
pub(crate) type KeyReplies = (String, Vec<RoundReply>);

/// The reply channels of one entry, in the command's order.
#[derive(Debug, Default)]
pub(crate) struct Replies {
    pub(crate) syncs: Vec<Reply<PermitSyncResult>>,
    pub(crate) rounds: Vec<KeyReplies>,
    /// Requests left out because their caller went away (see [`into_command`]).
    pub(crate) abandoned: usize,
}

impl Replies {
    /// Nothing to propose: every request was abandoned and no sync came.
    pub(crate) fn is_empty(&self) -> bool {
        self.syncs.is_empty() && self.rounds.is_empty()
    }
}

/// Splits an entry's messages into its command, at the leader's clock
/// `now_ms`, and its replies. A holdable request goes in as a copy, so that
/// it can join a later round if this one leaves it empty-handed.
///
/// A request whose caller went away (its connection closed, so the handler
/// and the answer's receiver were dropped) is left out, and a key left with
/// none drops out: permits granted to it would sit unclaimed until their
/// claim deadline while live clients wait. (A `permitctl run --timeout` that
/// gave up with a request parked took the next free permit that way, for the
/// whole `grantTimeoutMs`.) Syncs always go in: a release whose sender left is
/// still a release. The simulator's bug hunt puts the old behaviour back with
/// the test-only switch `permitd_storage::bugs::gone_caller_granted`.
pub(crate) fn into_command(
    syncs: Vec<WaitingSync>,
    rounds: Vec<(String, Vec<WaitingRequest>)>,
    now_ms: u64,
) -> (Command, Replies) {
    let mut replies = Replies::default();
    let mut key_syncs = Vec::with_capacity(syncs.len());
    for waiting in syncs {
        key_syncs.push(KeySync {
            key: waiting.key,
            sync: waiting.sync,
        });
        replies.syncs.push(waiting.reply);
    }
    let mut keys = Vec::with_capacity(rounds.len());
    for (key, waiting) in rounds {
        let (live, gone): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|waiting| {
            !waiting.reply.is_closed() || permitd_storage::bugs::gone_caller_granted()
        });
        replies.abandoned += gone.len();
        if live.is_empty() {
            continue;
        }
        let (requests, key_replies) = live
            .into_iter()
            .map(|waiting| match waiting.answer_by {
                Some(_) => (
                    waiting.request.clone(),
                    RoundReply::Holdable(Box::new(waiting)),
                ),
                None => (waiting.request, RoundReply::Now(waiting.reply)),
            })
            .unzip();
        keys.push(KeyRound {
            key: key.clone(),
            requests,
        });
        replies.rounds.push((key, key_replies));
    }
    let command = Command::Round {
        now_ms,
        syncs: key_syncs,
        keys,
    };
    (command, replies)
}

/// One key's answers paired with their replies, or, when the round answered
/// another number of requests than it was sent (a bug), the replies alone, to
/// fail with [`RoundError::Mismatch`].
pub(crate) type KeyAnswers = (
    String,
    Result<Vec<(RoundReply, PermitGrant)>, Vec<RoundReply>>,
);

/// An entry's result matched to its replies.
#[derive(Debug)]
pub(crate) struct Matched {
    pub(crate) syncs: Vec<(Reply<PermitSyncResult>, PermitSyncResult)>,
    pub(crate) rounds: Vec<KeyAnswers>,
}

/// Pairs every answer with the reply it belongs to: the one place the answer
/// counts are checked. Answers come back in the command's order, one list per
/// key round and one result per sync; a result with another number of syncs
/// or rounds gives the replies back whole, a key whose round has another number
/// of answers than requests is marked alone.
pub(crate) fn match_answers(
    replies: Replies,
    answers: Vec<Vec<PermitGrant>>,
    synced: Vec<PermitSyncResult>,
) -> Result<Matched, Replies> {
    if answers.len() != replies.rounds.len() || synced.len() != replies.syncs.len() {
        return Err(replies);
    }
    let syncs = replies.syncs.into_iter().zip(synced).collect();
    let rounds = replies
        .rounds
        .into_iter()
        .zip(answers)
        .map(|((key, replies), answers)| {
            let paired = if answers.len() == replies.len() {
                Ok(replies.into_iter().zip(answers).collect())
            } else {
                Err(replies)
            };
            (key, paired)
        })
        .collect();
    Ok(Matched { syncs, rounds })
}

/// Holds the requests each round left empty-handed that may still wait, by
/// calling `hold(key, request, answer_by)` (the schedule's, which may refuse
/// and hand the request back), and returns how many it held and the answers
/// left to send now. A held request gets no answer from this round; a key
/// whose every request was held drops out. `now` is the deadline of a
/// holdable request without one of its own.
pub(crate) fn hold_empty_handed(
    rounds: Vec<KeyAnswers>,
    now: Instant,
    mut hold: impl FnMut(&str, Box<WaitingRequest>, Instant) -> Result<(), Box<WaitingRequest>>,
) -> (usize, Vec<KeyAnswers>) {
    let mut held = 0;
    let mut out = Vec::with_capacity(rounds.len());
    for (key, paired) in rounds {
        let Ok(paired) = paired else {
            out.push((key, paired));
            continue;
        };
        let mut kept = Vec::with_capacity(paired.len());
        for (reply, answer) in paired {
            let reply = match reply {
                RoundReply::Holdable(waiting) if empty_handed(&answer) => {
                    let answer_by = waiting.answer_by.unwrap_or(now);
                    match hold(&key, waiting, answer_by) {
                        Ok(()) => {
                            held += 1;
                            continue;
                        }
                        Err(waiting) => RoundReply::Holdable(waiting),
                    }
                }
                reply => reply,
            };
            kept.push((reply, answer));
        }
        if !kept.is_empty() {
            out.push((key, Ok(kept)));
        }
    }
    (held, out)
}

/// The permits a round's answers grant, all together (for its log line).
pub(crate) fn granted(answers: &[(RoundReply, PermitGrant)]) -> u64 {
    answers
        .iter()
        .flat_map(|(_, answer)| &answer.grants)
        .map(|grant| grant.permits)
        .sum()
}

/// How long a request may be held, if at all: a demand request with a
/// `waitMs` whose client awaits nothing from the answer but the round's: no
/// lease reports, and grant reports only that give back everything they
/// claim ([`gives_back_all_it_claims`]).
pub(crate) fn holdable(request: &PermitRequest) -> Option<Duration> {
    let wait_ms = request.wait_ms.unwrap_or(0).min(MAX_REQUEST_WAIT_MS);
    let lease_reports = request.leases.as_ref().is_some_and(|l| !l.is_empty());
    let awaited_reports = lease_reports || !request.grants.iter().all(gives_back_all_it_claims);
    (wait_ms > 0 && !awaited_reports && !request.demand.is_empty())
        .then(|| Duration::from_millis(wait_ms))
}

/// A grant report after which the client holds nothing of the grant: every
/// permit it claimed is released. Its result cannot change what the client
/// runs (nothing runs under the grant any more), so the request carrying it
/// may wait for a later round; its release takes effect with the next entry
/// all the same ("Early reports"). A claim, by contrast, is answered by the
/// first round: the client admits work only once its claim is confirmed.
fn gives_back_all_it_claims(report: &GrantReport) -> bool {
    report.claimed > 0 && report.released >= report.claimed
}

/// Whether a rehearsed round would serve nobody and change nothing: every
/// answer empty-handed (so each request would be held again) and the key as
/// it was. Such a round need not run: its requests may be held without it.
pub(crate) fn serves_nobody(rehearsal: &Rehearsal) -> bool {
    !rehearsal.changes_key && rehearsal.answers.iter().all(empty_handed)
}

/// A round's answer that tells the client nothing new: no grant, no lease,
/// and only demand held back by the key's room or a group cap (which a later
/// round may serve). A group that is not permitted, or cannot be resolved,
/// is answered at once.
pub(crate) fn empty_handed(answer: &PermitGrant) -> bool {
    answer.grants.is_empty()
        && answer.leases.as_ref().is_none_or(Vec::is_empty)
        && answer.blocked.iter().all(|blocked| {
            matches!(
                blocked.reason,
                BlockedReason::Limit | BlockedReason::GroupLimit
            )
        })
}

/// An applied event that returns permits to a key (or, a deleted key, may
/// give it a higher limit: the defaults').
pub(crate) fn returns_permits_of(event: &Event) -> bool {
    matches!(
        event,
        Event::GrantReclaimed { .. }
            | Event::LeaseReclaimed { .. }
            | Event::ClientReleased { .. }
            | Event::KeyDeleted { .. }
    )
}

/// A sync that returns permits (a grant released, or any lease report, which
/// may release, retire or settle): it may serve the key's held requests.
pub(crate) fn returns_permits(sync: &PermitSync) -> bool {
    sync.grants.iter().any(|grant| grant.released > 0)
        || sync
            .leases
            .as_ref()
            .is_some_and(|leases| !leases.is_empty())
}

#[cfg(test)]
mod tests {
    use permitd_core::contract::protocol::{Blocked, Demand, LeaseReport, V1};
    use serde_json::json;
    use tokio::sync::oneshot::{self, error::TryRecvError};

    use super::*;

    type Answer = oneshot::Receiver<Result<PermitGrant, RoundError>>;

    const GRANT_ID: &str = "6f1c2b9e-4a5d-4e8f-9b0a-1c2d3e4f5a6b";

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A pure demand request for `count` permits of group `a`.
    fn demand(client: &str, count: u64, wait_ms: Option<u64>) -> PermitRequest {
        PermitRequest {
            v: V1,
            client_id: client.into(),
            request_id: None,
            demand: vec![Demand {
                group: "a".into(),
                count,
                oldest_at_ms: 1,
            }],
            grants: vec![],
            leases: None,
            wait_ms,
        }
    }

    fn waiting(request: PermitRequest, now: Instant) -> (WaitingRequest, Answer) {
        let (reply, answer) = oneshot::channel();
        (WaitingRequest::new(request, reply, 100, now), answer)
    }

    fn sync(
        key: &str,
        released: u64,
    ) -> (
        WaitingSync,
        oneshot::Receiver<Result<PermitSyncResult, RoundError>>,
    ) {
        let (reply, answer) = oneshot::channel();
        let sync = PermitSync {
            v: V1,
            client_id: "c".into(),
            grants: vec![GrantReport {
                grant_id: "g1".into(),
                claimed: 1,
                released,
            }],
            leases: None,
        };
        let waiting = WaitingSync {
            key: key.into(),
            sync,
            reply,
        };
        (waiting, answer)
    }

    /// An answer granting `permits` (none: empty), blocked for `reasons`.
    fn answer(permits: u64, reasons: &[BlockedReason]) -> PermitGrant {
        let grants = if permits > 0 {
            json!([{ "grantId": "6f1c2b9e-4a5d-4e8f-9b0a-1c2d3e4f5a6b", "group": "a", "permits": permits, "fence": 1 }])
        } else {
            json!([])
        };
        let mut answer: PermitGrant = serde_json::from_value(json!({
            "v": 1, "grants": grants, "blocked": [], "grantResults": [], "nextRequestAt": 0
        }))
        .expect("a valid answer");
        answer.blocked = reasons
            .iter()
            .map(|reason| Blocked {
                group: "a".into(),
                reason: *reason,
            })
            .collect();
        answer
    }

    fn synced() -> PermitSyncResult {
        PermitSyncResult {
            v: V1,
            grant_results: vec![],
            leases: None,
            contended: false,
        }
    }

    fn sent<T: std::fmt::Debug>(
        answer: &mut oneshot::Receiver<Result<T, RoundError>>,
    ) -> Result<T, RoundError> {
        answer.try_recv().expect("answered")
    }

    #[test]
    fn a_request_may_be_held_only_if_its_client_awaits_nothing_but_the_round() {
        assert_eq!(holdable(&demand("c", 1, Some(500))), Some(ms(500)));
        assert_eq!(holdable(&demand("c", 1, None)), None, "no waitMs");
        assert_eq!(holdable(&demand("c", 1, Some(0))), None, "waitMs 0");
        let mut reports = demand("c", 1, Some(500));
        reports.grants.push(GrantReport {
            grant_id: "g1".into(),
            claimed: 1,
            released: 0,
        });
        assert_eq!(holdable(&reports), None, "a claim is answered at once");
        reports.grants[0].released = 1;
        assert_eq!(
            holdable(&reports),
            Some(ms(500)),
            "a release of all it claimed awaits nothing"
        );
        reports.grants.push(GrantReport {
            grant_id: "g2".into(),
            claimed: 3,
            released: 1,
        });
        assert_eq!(holdable(&reports), None, "g2 still runs two permits");
        reports.grants[1] = GrantReport {
            grant_id: "g2".into(),
            claimed: 0,
            released: 0,
        };
        assert_eq!(holdable(&reports), None, "an empty report asks something");
        let mut leases = demand("c", 1, Some(500));
        leases.leases = Some(vec![LeaseReport {
            lease_id: "l1".into(),
            drawn: 1,
            released: 0,
            retired: false,
        }]);
        assert_eq!(holdable(&leases), None, "lease reports wait for nobody");
        let mut no_leases = demand("c", 1, Some(500));
        no_leases.leases = Some(vec![]);
        assert_eq!(
            holdable(&no_leases),
            Some(ms(500)),
            "an empty lease list reports nothing"
        );
        let mut no_demand = demand("c", 1, Some(500));
        no_demand.demand.clear();
        assert_eq!(holdable(&no_demand), None, "nothing to wait for");
        assert_eq!(
            holdable(&demand("c", 1, Some(u64::MAX))),
            Some(ms(MAX_REQUEST_WAIT_MS)),
            "capped"
        );
    }

    /// A request of `c` with demand, a grant report and a lease report.
    fn reporting(wait_ms: Option<u64>) -> PermitRequest {
        let mut request = demand("c", 1, wait_ms);
        request.grants.push(GrantReport {
            grant_id: GRANT_ID.into(),
            claimed: 1,
            released: 1,
        });
        request.leases = Some(vec![LeaseReport {
            lease_id: "l1".into(),
            drawn: 1,
            released: 0,
            retired: false,
        }]);
        request
    }

    #[test]
    fn grant_reports_go_ahead_as_a_sync_and_the_rest_parks() {
        let now = Instant::now();
        let (arrived, _) = waiting(reporting(Some(500)), now);
        let (parked, early) = split_early_reports(arrived);
        let early = early.expect("a grant report goes ahead");
        assert_eq!(early.sync.client_id, "c");
        assert_eq!(early.sync.grants, reporting(None).grants);
        assert_eq!(early.sync.leases, None, "lease reports stay for the round");
        assert!(parked.request.grants.is_empty());
        assert_eq!(parked.request.leases, reporting(None).leases);
        assert_eq!(parked.request.demand, reporting(None).demand);
        assert_eq!(early.bytes + parked.bytes, 100, "the bytes are shared out");
        assert_eq!(early.bytes, GRANT_ID.len() + GRANT_REPORT_BYTES);
        assert_eq!(
            parked.answer_by, None,
            "it came with reports: the first round answers it"
        );
    }

    #[test]
    fn a_request_without_grant_reports_parks_whole() {
        let now = Instant::now();
        let mut lease_only = reporting(None);
        lease_only.grants.clear();
        let (arrived, _) = waiting(lease_only.clone(), now);
        let (parked, early) = split_early_reports(arrived);
        assert_eq!(early, None);
        assert_eq!((parked.request, parked.bytes), (lease_only, 100));
    }

    #[test]
    fn a_split_off_report_never_weighs_more_than_its_request() {
        let (reply, _) = oneshot::channel();
        let arrived = WaitingRequest::new(reporting(None), reply, 10, Instant::now());
        let (parked, early) = split_early_reports(arrived);
        assert_eq!((parked.bytes, early.expect("split").bytes), (0, 10));
    }

    #[test]
    fn the_answer_carries_the_early_syncs_grant_results() {
        let mut round = answer(1, &[]);
        round.grant_results = serde_json::from_value(json!([
            {"grantId": GRANT_ID, "claimed": 9, "status": "ok"}
        ]))
        .expect("results");
        let mut early = synced();
        early.grant_results = serde_json::from_value(json!([
            {"grantId": GRANT_ID, "claimed": 1, "status": "ok"}
        ]))
        .expect("results");
        let merged = with_early_results(round.clone(), early.clone());
        assert_eq!(
            merged.grant_results, early.grant_results,
            "a remembered answer's results are replaced by the fresh ones"
        );
        assert_eq!(
            (merged.grants, merged.blocked),
            (round.grants, round.blocked)
        );
    }

    #[test]
    fn a_waiting_request_must_be_answered_by_its_arrival_plus_its_wait() {
        let now = Instant::now();
        let (held, _held_answer) = waiting(demand("c", 1, Some(300)), now);
        assert_eq!(held.answer_by, Some(now + ms(300)));
        let (plain, _plain_answer) = waiting(demand("c", 1, None), now);
        assert_eq!(plain.answer_by, None);
    }

    #[test]
    fn only_an_answer_blocked_by_room_or_a_group_cap_is_empty_handed() {
        assert!(empty_handed(&answer(0, &[])));
        assert!(empty_handed(&answer(0, &[BlockedReason::Limit])));
        assert!(empty_handed(&answer(0, &[BlockedReason::GroupLimit])));
        assert!(!empty_handed(&answer(1, &[])), "a grant");
        assert!(!empty_handed(&answer(0, &[BlockedReason::NotPermitted])));
        assert!(!empty_handed(&answer(
            0,
            &[BlockedReason::LimitResolutionError]
        )));
        let mut lease = answer(0, &[]);
        lease.leases = Some(vec![]);
        assert!(empty_handed(&lease), "an empty lease list grants nothing");
    }

    #[test]
    fn releases_lease_reports_reclaims_and_force_releases_return_permits() {
        assert!(returns_permits(&sync("k", 1).0.sync));
        assert!(
            !returns_permits(&sync("k", 0).0.sync),
            "a claim frees nothing"
        );
        let mut lease = sync("k", 0).0.sync;
        lease.leases = Some(vec![LeaseReport {
            lease_id: "l1".into(),
            drawn: 1,
            released: 0,
            retired: false,
        }]);
        assert!(returns_permits(&lease), "any lease report may settle");
        let reclaimed = Event::GrantReclaimed {
            timestamp_ms: 1,
            grant_id: permitd_core::GrantId::parse(GRANT_ID).expect("a grant id"),
            client_id: "c".into(),
            group: "a".into(),
            permits: 1,
        };
        let released = Event::ClientReleased {
            timestamp_ms: 1,
            client_id: "c".into(),
            grants: 1,
            leases: 0,
            permits: 1,
        };
        let blocked = Event::Blocked {
            timestamp_ms: 1,
            group: "a".into(),
            reason: BlockedReason::Limit,
            count: 1,
        };
        assert!(returns_permits_of(&reclaimed));
        assert!(returns_permits_of(&released));
        assert!(!returns_permits_of(&blocked));
    }

    #[test]
    fn an_entry_carries_syncs_then_each_keys_requests_in_arrival_order_at_the_given_clock() {
        let now = Instant::now();
        let (first, _first_answer) = waiting(demand("c1", 1, None), now);
        let (second, _second_answer) = waiting(demand("c2", 2, Some(100)), now);
        let (other, _other_answer) = waiting(demand("c3", 3, None), now);
        let (s1, _) = sync("k", 1);
        let rounds = vec![
            ("k".to_owned(), vec![first, second]),
            ("j".to_owned(), vec![other]),
        ];
        let (command, replies) = into_command(vec![s1], rounds, 42);
        let Command::Round {
            now_ms,
            syncs,
            keys,
        } = command
        else {
            panic!("a round entry");
        };
        assert_eq!(now_ms, 42);
        assert_eq!(syncs.len(), 1);
        assert_eq!(syncs[0].key, "k");
        let clients: Vec<(&str, Vec<&str>)> = keys
            .iter()
            .map(|round| {
                let clients = round
                    .requests
                    .iter()
                    .map(|r| r.client_id.as_str())
                    .collect();
                (round.key.as_str(), clients)
            })
            .collect();
        assert_eq!(clients, vec![("k", vec!["c1", "c2"]), ("j", vec!["c3"])]);
        assert_eq!(replies.syncs.len(), 1);
        let kinds: Vec<(&str, Vec<bool>)> = replies
            .rounds
            .iter()
            .map(|(key, replies)| {
                let holdable = replies
                    .iter()
                    .map(|reply| matches!(reply, RoundReply::Holdable(_)))
                    .collect();
                (key.as_str(), holdable)
            })
            .collect();
        assert_eq!(
            kinds,
            vec![("k", vec![false, true]), ("j", vec![false])],
            "a request with a wait is kept to be held"
        );
    }

    #[test]
    fn requests_whose_caller_went_away_are_left_out_and_their_key_with_them() {
        let now = Instant::now();
        let (kept, _kept_answer) = waiting(demand("c1", 1, None), now);
        let (gone, gone_answer) = waiting(demand("c2", 1, Some(100)), now);
        let (alone, alone_answer) = waiting(demand("c3", 1, None), now);
        drop((gone_answer, alone_answer));
        let rounds = vec![
            ("k".to_owned(), vec![kept, gone]),
            ("j".to_owned(), vec![alone]),
        ];
        let (command, replies) = into_command(vec![], rounds, 7);
        let Command::Round { keys, .. } = command else {
            panic!("a round entry");
        };
        assert_eq!(keys.len(), 1, "j had only a departed caller");
        assert_eq!(keys[0].requests.len(), 1);
        assert_eq!(keys[0].requests[0].client_id, "c1");
        assert_eq!(replies.rounds.len(), 1);
        assert_eq!(replies.abandoned, 2);
        assert!(!replies.is_empty());

        let (gone, gone_answer) = waiting(demand("c4", 1, None), now);
        drop(gone_answer);
        let (_, replies) = into_command(vec![], vec![("k".to_owned(), vec![gone])], 8);
        assert!(replies.is_empty(), "nothing left to propose");
    }

    fn one_key_entry(requests: Vec<WaitingRequest>) -> Replies {
        into_command(vec![], vec![("k".to_owned(), requests)], 1).1
    }

    #[test]
    fn answers_go_to_their_requests_in_order() {
        let now = Instant::now();
        let (first, mut first_answer) = waiting(demand("c1", 1, None), now);
        let (second, mut second_answer) = waiting(demand("c2", 1, None), now);
        let (s1, mut sync_answer) = sync("k", 1);
        let (_, replies) = into_command(vec![s1], vec![("k".to_owned(), vec![first, second])], 1);
        let matched = match_answers(
            replies,
            vec![vec![answer(1, &[]), answer(2, &[])]],
            vec![synced()],
        )
        .expect("counts match");
        for (reply, result) in matched.syncs {
            let _ = reply.send(Ok(result));
        }
        for (_, paired) in matched.rounds {
            for (reply, answer) in paired.expect("this key's counts match") {
                reply.send(Ok(answer));
            }
        }
        assert_eq!(sent(&mut sync_answer), Ok(synced()));
        assert_eq!(sent(&mut first_answer), Ok(answer(1, &[])));
        assert_eq!(sent(&mut second_answer), Ok(answer(2, &[])));
    }

    #[test]
    fn a_result_with_other_counts_of_rounds_or_syncs_gives_every_reply_back() {
        let now = Instant::now();
        let (request, _request_answer) = waiting(demand("c1", 1, None), now);
        let replies = one_key_entry(vec![request]);
        let back = match_answers(replies, vec![], vec![]).expect_err("no round answered");
        assert_eq!(back.rounds.len(), 1);
        let (request, _request_answer) = waiting(demand("c1", 1, None), now);
        let replies = one_key_entry(vec![request]);
        let back = match_answers(replies, vec![vec![answer(1, &[])]], vec![synced()])
            .expect_err("a sync nobody sent");
        assert_eq!(back.rounds.len(), 1);
    }

    #[test]
    fn a_key_with_another_count_of_answers_is_marked_alone() {
        let now = Instant::now();
        let (k1, _k1_answer) = waiting(demand("c1", 1, None), now);
        let (j1, _j1_answer) = waiting(demand("c2", 1, None), now);
        let (_, replies) = into_command(
            vec![],
            vec![("k".to_owned(), vec![k1]), ("j".to_owned(), vec![j1])],
            1,
        );
        let answers = vec![vec![answer(1, &[]), answer(1, &[])], vec![answer(1, &[])]];
        let matched = match_answers(replies, answers, vec![]).expect("round counts match");
        assert!(
            matched.rounds[0].1.is_err(),
            "k: two answers for one request"
        );
        assert!(matched.rounds[1].1.is_ok(), "j is answered");
    }

    /// Holds with a schedule that takes everything (or nothing), recording what.
    fn hold_with(
        rounds: Vec<KeyAnswers>,
        now: Instant,
        accept: bool,
    ) -> (usize, Vec<KeyAnswers>, Vec<(String, String, Instant)>) {
        let mut asked = Vec::new();
        let (held, rest) = hold_empty_handed(rounds, now, |key, waiting, answer_by| {
            asked.push((key.to_owned(), waiting.request.client_id.clone(), answer_by));
            if accept {
                Ok(())
            } else {
                Err(waiting)
            }
        });
        (held, rest, asked)
    }

    fn matched_one_key(
        requests: Vec<WaitingRequest>,
        answers: Vec<PermitGrant>,
    ) -> Vec<KeyAnswers> {
        match_answers(one_key_entry(requests), vec![answers], vec![])
            .expect("counts match")
            .rounds
    }

    fn clients(rounds: &[KeyAnswers]) -> Vec<(String, Vec<String>)> {
        rounds
            .iter()
            .map(|(key, paired)| {
                let clients = match paired {
                    Ok(paired) => paired
                        .iter()
                        .map(|(_, answer)| answer.grants.len().to_string())
                        .collect(),
                    Err(replies) => vec![format!("mismatch {}", replies.len())],
                };
                (key.clone(), clients)
            })
            .collect()
    }

    #[test]
    fn an_empty_handed_holdable_request_is_held_until_its_deadline() {
        let now = Instant::now();
        let (waits, _waits_answer) = waiting(demand("c1", 1, Some(250)), now);
        let (plain, _plain_answer) = waiting(demand("c2", 1, None), now);
        let rounds = matched_one_key(
            vec![waits, plain],
            vec![answer(0, &[BlockedReason::Limit]), answer(0, &[])],
        );
        let (held, rest, asked) = hold_with(rounds, now + ms(10), true);
        assert_eq!(held, 1);
        assert_eq!(
            asked,
            vec![("k".to_owned(), "c1".to_owned(), now + ms(250))]
        );
        assert_eq!(
            clients(&rest),
            vec![("k".to_owned(), vec!["0".to_owned()])],
            "c2 is answered"
        );
    }

    #[test]
    fn a_holdable_request_that_got_something_or_was_refused_for_good_is_answered() {
        let now = Instant::now();
        let (granted_one, _granted_one_answer) = waiting(demand("c1", 1, Some(250)), now);
        let (not_permitted, _not_permitted_answer) = waiting(demand("c2", 1, Some(250)), now);
        let rounds = matched_one_key(
            vec![granted_one, not_permitted],
            vec![answer(1, &[]), answer(0, &[BlockedReason::NotPermitted])],
        );
        let (held, rest, asked) = hold_with(rounds, now, true);
        assert_eq!((held, asked.len()), (0, 0));
        assert_eq!(
            clients(&rest),
            vec![("k".to_owned(), vec!["1".to_owned(), "0".to_owned()])]
        );
    }

    /// One holdable request that its round left empty-handed, offered to a
    /// schedule that takes it (`accept`) or not.
    fn one_empty_handed_waiter(
        accept: bool,
    ) -> (usize, Vec<KeyAnswers>, Vec<(String, String, Instant)>) {
        let now = Instant::now();
        let (waits, _waits_answer) = waiting(demand("c1", 1, Some(250)), now);
        let rounds = matched_one_key(vec![waits], vec![answer(0, &[])]);
        hold_with(rounds, now, accept)
    }

    #[test]
    fn a_request_the_schedule_will_not_hold_is_answered_now() {
        let (held, rest, asked) = one_empty_handed_waiter(false);
        assert_eq!((held, asked.len()), (0, 1));
        assert_eq!(clients(&rest), vec![("k".to_owned(), vec!["0".to_owned()])]);
        assert!(matches!(&rest[0].1, Ok(paired) if matches!(paired[0].0, RoundReply::Holdable(_))));
    }

    #[test]
    fn a_key_whose_every_request_was_held_is_not_answered() {
        let (held, rest, _) = one_empty_handed_waiter(true);
        assert_eq!(held, 1);
        assert!(rest.is_empty(), "no round line and no answer for k");
    }

    #[test]
    fn a_holdable_request_without_a_deadline_is_held_until_now() {
        let now = Instant::now();
        let (mut waits, _waits_answer) = waiting(demand("c1", 1, Some(250)), now);
        waits.answer_by = None;
        let rounds = vec![(
            "k".to_owned(),
            Ok(vec![(
                RoundReply::Holdable(Box::new(waits)),
                answer(0, &[]),
            )]),
        )];
        let (_, _, asked) = hold_with(rounds, now + ms(5), true);
        assert_eq!(asked[0].2, now + ms(5));
    }

    #[test]
    fn a_key_whose_answers_did_not_match_is_passed_on_untouched() {
        let now = Instant::now();
        let (waits, mut answer_rx) = waiting(demand("c1", 1, Some(250)), now);
        let replies = one_key_entry(vec![waits]);
        let rounds = match_answers(replies, vec![vec![]], vec![])
            .expect("round count matches")
            .rounds;
        let (held, rest, asked) = hold_with(rounds, now, true);
        assert_eq!((held, asked.len()), (0, 0));
        assert_eq!(
            clients(&rest),
            vec![("k".to_owned(), vec!["mismatch 1".to_owned()])]
        );
        assert_eq!(
            answer_rx.try_recv(),
            Err(TryRecvError::Empty),
            "not answered yet"
        );
    }

    #[test]
    fn granted_sums_the_permits_of_a_rounds_answers() {
        let now = Instant::now();
        let (a, _a_answer) = waiting(demand("c1", 1, None), now);
        let (b, _b_answer) = waiting(demand("c2", 1, None), now);
        let rounds = matched_one_key(vec![a, b], vec![answer(2, &[]), answer(3, &[])]);
        let Ok(paired) = &rounds[0].1 else {
            panic!("matched");
        };
        assert_eq!(granted(paired), 5);
    }
}
