//! Acknowledged writes are never lost, and a repeated `requestId` is
//! answered with the remembered answer.
//!
//! - **Writes**: the operator's writes of one key's configuration, or of one
//!   group's cap, are sequential: each is sent once the one before was
//!   answered or failed. The setting read back from the healed cluster at the
//!   end must be the last acknowledged write's, or that of a write that
//!   failed (a failed write may still have been applied, even late). A key
//!   whose delete was acknowledged must be gone.
//! - **Replays**: a request sent again with its `requestId` while its grants
//!   are unclaimed and inside their claim window gets the same answer byte for
//!   byte (docs/protocol.md, "Fences, retries and the clock"). The window is
//!   sure only if the repeat was answered within the claim window of the
//!   first send, less, under faults, the 4 s two leaders' clocks may differ.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Turbulence, Violation};
use crate::history::{ReadBack, Replay, Write, Written};

/// How far two leaders' clocks may differ: each is off by up to 2 s.
const CLOCKS_APART: Duration = Duration::from_secs(4);

/// One setting as written or read back: a key's configuration (`None`: the
/// key is gone), or a group's cap.
#[derive(Debug, Clone, PartialEq)]
enum Setting {
    Key(Option<permitd_core::KeyConfig>),
    Group(Option<permitd_core::GroupConfig>),
}

/// A key (`None`) or one of its groups.
type Scope = (String, Option<String>);

/// Every acknowledged write is what the end's read shows, unless a failed
/// write may have replaced it.
pub fn check_writes(
    writes: &[Write],
    read_back: Option<&BTreeMap<String, ReadBack>>,
) -> Vec<Violation> {
    let Some(read_back) = read_back else {
        if writes.is_empty() {
            return vec![];
        }
        return vec![Violation {
            kind: "no_read_back",
            detail: "the settings could not be read back from the healed cluster".into(),
        }];
    };
    let mut scopes: BTreeMap<Scope, Vec<(Setting, bool)>> = BTreeMap::new();
    for write in writes {
        let (group, setting) = match &write.what {
            Written::Key(config) => (None, Setting::Key(Some(config.clone()))),
            Written::Deleted => (None, Setting::Key(None)),
            Written::Group(group, config) => {
                (Some(group.clone()), Setting::Group(Some(config.clone())))
            }
        };
        scopes
            .entry((write.key.clone(), group))
            .or_default()
            .push((setting, write.acked.is_some()));
    }
    let deletes: Vec<String> = writes
        .iter()
        .filter(|write| write.what == Written::Deleted)
        .map(|write| write.key.clone())
        .collect();
    let mut violations = Vec::new();
    for ((key, group), written) in scopes {
        let found = read_back.get(&key);
        let now = match &group {
            None => Setting::Key(found.and_then(|read| read.config.clone())),
            Some(group) => Setting::Group(found.and_then(|read| read.groups.get(group).cloned())),
        };
        let last_acked = written.iter().rposition(|(_, acked)| *acked);
        let allowed = |(at, (setting, acked)): (usize, &(Setting, bool))| {
            *setting == now && (!acked || Some(at) == last_acked)
        };
        // A key's delete takes its groups with it.
        let deleted = group.is_some() && now == Setting::Group(None) && deletes.contains(&key);
        if !written.iter().enumerate().any(allowed) && !deleted {
            let scope = group.map_or(key.clone(), |group| format!("{key}/{group}"));
            let expected = last_acked.map(|at| &written[at].0);
            violations.push(Violation {
                kind: "acknowledged_write_lost",
                detail: format!("{scope}: read back {now:?}, last acknowledged {expected:?}"),
            });
        }
    }
    violations
}

/// A repeated `requestId` inside its claim window got the same bytes.
pub fn check_replays(
    replays: &[Replay],
    grant_timeouts: &BTreeMap<String, Duration>,
    turbulence: Option<Turbulence>,
) -> Vec<Violation> {
    replays
        .iter()
        .filter(|replay| replay.first != replay.again)
        .filter(|replay| {
            let timeout = grant_timeouts.get(&replay.key).copied().unwrap_or_default();
            let window = if Turbulence::touches(turbulence, replay.sent, replay.answered) {
                timeout.saturating_sub(CLOCKS_APART)
            } else {
                timeout
            };
            replay.answered < replay.sent + window
        })
        .take(1)
        .map(|replay| Violation {
            kind: "replay_answered_differently",
            detail: format!(
                "{} of {} (sent {:?}, repeated until {:?}): {} then {}",
                replay.key,
                replay.client_id,
                replay.sent,
                replay.answered,
                String::from_utf8_lossy(&replay.first),
                String::from_utf8_lossy(&replay.again)
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use permitd_core::{GroupConfig, KeyConfig};

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn limit(limit: u64, sent: u64, acked: bool) -> Write {
        Write {
            key: "k".into(),
            what: Written::Key(KeyConfig {
                limit,
                ..KeyConfig::default()
            }),
            sent: ms(sent),
            acked: acked.then(|| ms(sent + 1)),
        }
    }

    fn read_back(limit: Option<u64>, cap: Option<u64>) -> BTreeMap<String, ReadBack> {
        let config = limit.map(|limit| KeyConfig {
            limit,
            ..KeyConfig::default()
        });
        let groups = cap
            .map(|cap| {
                let config = GroupConfig {
                    limit: Some(cap),
                    permitted: true,
                };
                ("g".to_owned(), config)
            })
            .into_iter()
            .collect();
        BTreeMap::from([("k".to_owned(), ReadBack { config, groups })])
    }

    #[test]
    fn the_last_acknowledged_write_or_a_failed_one_must_show() {
        let writes = [limit(3, 0, true), limit(4, 10, true), limit(5, 20, false)];
        for shown in [4, 5] {
            assert!(check_writes(&writes, Some(&read_back(Some(shown), None))).is_empty());
        }
        let lost = check_writes(&writes, Some(&read_back(Some(3), None)));
        assert_eq!(lost[0].kind, "acknowledged_write_lost");
        assert_eq!(check_writes(&writes, None)[0].kind, "no_read_back");
    }

    #[test]
    fn a_lost_group_cap_and_a_key_back_from_its_delete_are_caught() {
        let cap = Write {
            key: "k".into(),
            what: Written::Group(
                "g".into(),
                GroupConfig {
                    limit: Some(1),
                    permitted: true,
                },
            ),
            sent: ms(5),
            acked: Some(ms(6)),
        };
        let writes = [limit(3, 0, true), cap];
        assert!(check_writes(&writes, Some(&read_back(Some(3), Some(1)))).is_empty());
        let lost = check_writes(&writes, Some(&read_back(Some(3), None)));
        assert!(lost[0].detail.starts_with("k/g"), "{lost:?}");
        let deleted = [
            limit(3, 0, true),
            Write {
                key: "k".into(),
                what: Written::Deleted,
                sent: ms(10),
                acked: Some(ms(11)),
            },
        ];
        assert!(check_writes(&deleted, Some(&BTreeMap::new())).is_empty());
        let back = check_writes(&deleted, Some(&read_back(Some(3), None)));
        assert_eq!(back[0].kind, "acknowledged_write_lost");
    }

    #[test]
    fn a_replay_answered_differently_inside_the_window_is_caught() {
        let timeouts = BTreeMap::from([("k".to_owned(), ms(1_000))]);
        let replay = |answered: u64, again: &str| Replay {
            key: "k".into(),
            client_id: "c".into(),
            sent: ms(0),
            answered: ms(answered),
            first: br#"{"grants":[1]}"#.to_vec(),
            again: again.as_bytes().to_vec(),
        };
        assert!(check_replays(&[replay(100, r#"{"grants":[1]}"#)], &timeouts, None).is_empty());
        let differs = check_replays(&[replay(100, r#"{"grants":[2]}"#)], &timeouts, None);
        assert_eq!(differs[0].kind, "replay_answered_differently");
        // After the claim window the id may be forgotten: a new answer is fine.
        assert!(check_replays(&[replay(1_500, r#"{"grants":[2]}"#)], &timeouts, None).is_empty());
    }
}
