//! Replicated configuration of keys and groups.
//!
//! A key's limit, timings and lease policy are a [`KeyConfig`], a group's cap and
//! permission a [`GroupConfig`], changed through log entries
//! so that every replica applies the same values and they survive any node's loss.
//! Keys without their own configuration take the cluster-wide defaults.

use serde::{Deserialize, Deserializer, Serialize};

use crate::contract::protocol::BlockedReason;

/// How one key allocates: its limit, round timings, claim window and lease policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyConfig {
    /// Permits that may be outstanding at once. Lowering it never evicts running work.
    pub limit: u64,
    /// How long a request waits so concurrent requests share a round.
    pub round_wait_ms: u64,
    /// Minimum time between two rounds of the key; also sets `nextRequestAt`.
    pub round_period_ms: u64,
    /// Granted permits a client never claims are reclaimed after this.
    pub grant_timeout_ms: u64,
    /// `None` disables leases: clients then admit only through grants.
    pub leases: Option<LeasePolicy>,
}

impl KeyConfig {
    /// How this key's limit splits between grants and leases.
    pub fn budgets(&self) -> Budgets {
        let provisioning = self.leases.as_ref().map(|policy| &policy.provisioning);
        Budgets::new(provisioning, self.limit)
    }
}

impl Default for KeyConfig {
    /// The defaults of keys nobody configured (docs/protocol.md, "Key configuration").
    fn default() -> Self {
        Self {
            limit: 100,
            // A lone acquire on an idle key is answered within a few ms; a
            // longer window buys fairness among waiters and fewer entries
            // (docs/operations.md, "Round timings").
            round_wait_ms: 5,
            round_period_ms: 20,
            grant_timeout_ms: 10_000,
            leases: None,
        }
    }
}

/// How leases are provisioned and shared out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeasePolicy {
    pub provisioning: Provisioning,
    /// Most permits one lease holds.
    #[serde(default = "defaults::permits_per_lease")]
    pub permits_per_lease: u64,
    /// A lease not reported for this long is retired.
    #[serde(default = "defaults::ttl_ms")]
    pub ttl_ms: u64,
    /// Groups that may receive new leases in one round, oldest demand first.
    #[serde(default = "defaults::max_groups")]
    pub max_groups: u64,
    /// Clients per group that may receive new leases in one round.
    #[serde(default = "defaults::max_clients_per_group")]
    pub max_clients_per_group: u64,
    #[serde(default)]
    pub limited_groups: LimitedGroups,
}

impl LeasePolicy {
    /// The default lease policy for a provisioning mode.
    pub fn with_provisioning(provisioning: Provisioning) -> Self {
        Self {
            provisioning,
            permits_per_lease: defaults::permits_per_lease(),
            ttl_ms: defaults::ttl_ms(),
            max_groups: defaults::max_groups(),
            max_clients_per_group: defaults::max_clients_per_group(),
            limited_groups: LimitedGroups::default(),
        }
    }

    /// Whether a group may hold leases under this policy.
    pub fn admits(&self, group: &GroupPolicy) -> bool {
        group.blocked.is_none()
            && (group.limit.is_none() || self.limited_groups == LimitedGroups::WithinGroupLimit)
    }
}

mod defaults {
    pub fn permits_per_lease() -> u64 {
        64
    }
    pub fn ttl_ms() -> u64 {
        30 * 60_000
    }
    pub fn max_groups() -> u64 {
        100
    }
    pub fn max_clients_per_group() -> u64 {
        100
    }
}

/// Where lease capacity comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum Provisioning {
    /// Grants and live lease footprint share the limit, grants first.
    Strict,
    /// A reserve inside the limit is kept for leases; grants always keep one permit.
    Under { reserve: Amount },
    /// Leases draw from a separate budget above the limit: the ceiling is limit + extra.
    Over { extra: Amount },
}

/// A number of permits, or a share of the limit rounded down.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Amount {
    Permits(u64),
    Ratio { ratio: f64 },
}

impl Amount {
    /// The amount for a given limit.
    pub fn of(&self, limit: u64) -> u64 {
        match self {
            Self::Permits(permits) => *permits,
            // Validated finite and in [0, MAX_PROVISIONING_RATIO]: the cast is exact
            // enough and cannot wrap.
            Self::Ratio { ratio } => (limit as f64 * ratio).floor() as u64,
        }
    }
}

/// Whether groups with their own cap may hold leases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum LimitedGroups {
    /// Capped groups get no leases: their caps hold exactly.
    #[default]
    Exclude,
    /// Capped groups are leased within what their cap leaves.
    WithinGroupLimit,
}

/// Permits grants may use and leases may hold under one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    pub grants: u64,
    pub leases: u64,
    /// The most grants plus lease footprint may ever reach: the limit, or
    /// limit + extra with `over`.
    pub ceiling: u64,
    /// Grants and lease footprint come from one pool (strict, or leases off).
    pub shared: bool,
}

impl Budgets {
    /// Splits `limit` according to `provisioning`; `None` means leases are off.
    pub fn new(provisioning: Option<&Provisioning>, limit: u64) -> Self {
        match provisioning {
            None => Self {
                grants: limit,
                leases: 0,
                ceiling: limit,
                shared: true,
            },
            Some(Provisioning::Strict) => Self {
                grants: limit,
                leases: limit,
                ceiling: limit,
                shared: true,
            },
            Some(Provisioning::Over { extra }) => {
                let extra = extra.of(limit);
                Self {
                    grants: limit,
                    leases: extra,
                    ceiling: limit + extra,
                    shared: false,
                }
            }
            Some(Provisioning::Under { reserve }) => {
                // The reserve never takes the last permit, or clients without lease
                // support and groups excluded from leases could never be admitted.
                let reserve = reserve.of(limit).min(limit.saturating_sub(1));
                Self {
                    grants: limit - reserve,
                    leases: reserve,
                    ceiling: limit,
                    shared: false,
                }
            }
        }
    }

    /// Permits grants may still receive. Besides their own budget, grants stay
    /// under the ceiling together with the lease footprint: after a limit change
    /// shrinks one budget, what the other kind holds beyond its budget is charged
    /// here (checking each budget alone would let `under`/`over` pass the
    /// ceiling). May be negative when usage is above a lowered limit.
    pub fn grant_room(&self, granted: u64, leased: u64) -> i64 {
        let own = self.grants as i64 - granted as i64;
        let shared = self.ceiling as i64 - granted as i64 - leased as i64;
        own.min(shared)
    }

    /// Gross lease capacity (the lease pass nets out live footprint itself): the
    /// lease budget, but never more than grants leave under the ceiling.
    pub fn lease_budget(&self, granted: u64) -> u64 {
        self.leases.min(self.ceiling.saturating_sub(granted))
    }
}

/// Settings of one group within a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupConfig {
    /// The group's own cap under the key's limit; `None` shares the key's limit only.
    #[serde(default)]
    pub limit: Option<u64>,
    /// `false` blocks the group with `not_permitted`.
    #[serde(default = "permitted_by_default")]
    pub permitted: bool,
}

fn permitted_by_default() -> bool {
    true
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            limit: None,
            permitted: true,
        }
    }
}

/// What a round needs to know of a group: its cap, or why it is blocked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupPolicy {
    pub limit: Option<u64>,
    pub blocked: Option<BlockedReason>,
}

impl GroupPolicy {
    /// Resolves a stored group configuration. A stored cap outside the limits (only
    /// possible in state written by another version) fails closed.
    pub fn resolve(config: Option<&GroupConfig>) -> Self {
        let Some(config) = config else {
            return Self::default();
        };
        if !config.permitted {
            return Self {
                limit: None,
                blocked: Some(BlockedReason::NotPermitted),
            };
        }
        match config.limit {
            Some(limit) if limit > crate::limits::MAX_LIMIT => Self {
                limit: None,
                blocked: Some(BlockedReason::LimitResolutionError),
            },
            limit => Self {
                limit,
                blocked: None,
            },
        }
    }
}

/// `PUT .../config`: fields omitted take the cluster defaults; `"leases": null`
/// disables leases while an omitted `leases` takes the default policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyConfigUpdate {
    #[serde(default)]
    pub limit: Option<u64>,
    #[serde(default)]
    pub round_wait_ms: Option<u64>,
    #[serde(default)]
    pub round_period_ms: Option<u64>,
    #[serde(default)]
    pub grant_timeout_ms: Option<u64>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub leases: Option<Option<LeasePolicy>>,
}

/// Distinguishes an explicit `null` (Some(None)) from an omitted field (None).
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

impl KeyConfigUpdate {
    /// The full configuration this update names, over `defaults`.
    pub fn resolve(&self, defaults: &KeyConfig) -> KeyConfig {
        KeyConfig {
            limit: self.limit.unwrap_or(defaults.limit),
            round_wait_ms: self.round_wait_ms.unwrap_or(defaults.round_wait_ms),
            round_period_ms: self.round_period_ms.unwrap_or(defaults.round_period_ms),
            grant_timeout_ms: self.grant_timeout_ms.unwrap_or(defaults.grant_timeout_ms),
            leases: self
                .leases
                .clone()
                .unwrap_or_else(|| defaults.leases.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parses_the_documented_example_with_default_lease_settings() {
        let text = r#"{"limit": 100, "roundWaitMs": 1000, "roundPeriodMs": 2000,
            "grantTimeoutMs": 10000, "leases": {"provisioning": {"mode": "strict"}}}"#;
        let config: KeyConfig = serde_json::from_str(text).unwrap();
        let leases = config.leases.unwrap();
        assert_eq!(leases.provisioning, Provisioning::Strict);
        assert_eq!(
            (leases.permits_per_lease, leases.ttl_ms, leases.max_groups),
            (64, 1_800_000, 100)
        );
        assert_eq!(leases.limited_groups, LimitedGroups::Exclude);
    }

    #[test]
    fn provisioning_amounts_parse_as_permits_or_ratio() {
        let under: Provisioning = serde_json::from_str(r#"{"mode":"under","reserve":20}"#).unwrap();
        assert_eq!(
            under,
            Provisioning::Under {
                reserve: Amount::Permits(20)
            }
        );
        let over: Provisioning =
            serde_json::from_str(r#"{"mode":"over","extra":{"ratio":0.5}}"#).unwrap();
        assert_eq!(
            Budgets::new(Some(&over), 100),
            Budgets {
                grants: 100,
                leases: 50,
                ceiling: 150,
                shared: false
            }
        );
    }

    #[test]
    fn under_reserve_never_takes_the_last_permit() {
        let under = Provisioning::Under {
            reserve: Amount::Permits(500),
        };
        assert_eq!(
            Budgets::new(Some(&under), 10),
            Budgets {
                grants: 1,
                leases: 9,
                ceiling: 10,
                shared: false
            }
        );
        assert_eq!(
            Budgets::new(Some(&under), 0),
            Budgets {
                grants: 0,
                leases: 0,
                ceiling: 0,
                shared: false
            }
        );
    }

    #[test]
    fn update_null_leases_disables_and_omitted_takes_default() {
        let defaults = KeyConfig {
            leases: Some(LeasePolicy::with_provisioning(Provisioning::Strict)),
            ..KeyConfig::default()
        };
        let omitted: KeyConfigUpdate = serde_json::from_str(r#"{"limit": 5}"#).unwrap();
        assert_eq!(omitted.resolve(&defaults).leases, defaults.leases);
        assert_eq!(omitted.resolve(&defaults).limit, 5);
        let null: KeyConfigUpdate = serde_json::from_str(r#"{"leases": null}"#).unwrap();
        assert_eq!(null.resolve(&defaults).leases, None);
    }

    #[test]
    fn group_policy_resolution() {
        assert_eq!(GroupPolicy::resolve(None), GroupPolicy::default());
        let closed = GroupConfig {
            limit: Some(3),
            permitted: false,
        };
        assert_eq!(
            GroupPolicy::resolve(Some(&closed)).blocked,
            Some(BlockedReason::NotPermitted)
        );
        let broken = GroupConfig {
            limit: Some(u64::MAX),
            permitted: true,
        };
        assert_eq!(
            GroupPolicy::resolve(Some(&broken)).blocked,
            Some(BlockedReason::LimitResolutionError)
        );
    }
}
