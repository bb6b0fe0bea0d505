//! The operator: configures every key (and the capped groups) before the
//! runners start, then, every 200–700 ms while they work, does one of:
//!
//! - sets a key's limit anew, between [`MIN_LIMIT`] and [`MAX_LIMIT`] (raised
//!   or lowered under running work);
//! - sets a key's group cap anew, under the key's limit;
//! - force-releases a client it sees holding a grant (`holders`);
//! - once, deletes the spare key, which nobody uses.
//!
//! Every write goes into the history with its outcome. Once the runners are
//! done (and the faults healed), it reads every key's settings back from the
//! cluster, for [`crate::checker::writes`].

use std::collections::BTreeMap;
use std::time::Duration;

use permitd_client::SemaphoreClient;
use permitd_core::GroupConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{
    client, failure, now, KeySpec, Shared, CAPPED_GROUP, MAX_LIMIT, MIN_LIMIT, REPLAY_SUFFIX,
};
use crate::history::{ForceRelease, ReadBack, Write, Written};

/// The pause between two failed attempts at the first configuration.
const CONFIGURE_RETRY: Duration = Duration::from_millis(50);
/// Attempts at reading the settings back at the end.
const READ_BACK_TRIES: usize = 20;

struct Operator {
    client: SemaphoreClient,
    rng: StdRng,
    shared: Shared,
    /// Each key's limit as last written.
    limits: BTreeMap<String, u64>,
    spare_deleted: bool,
}

/// The operator host.
pub async fn operate(seed: u64, shared: Shared) -> turmoil::Result {
    let mut operator = Operator {
        client: client(&shared.spec.endpoints, seed)?,
        rng: StdRng::seed_from_u64(seed ^ 0x006f_7065_7261_746f),
        shared: shared.clone(),
        limits: BTreeMap::new(),
        spare_deleted: false,
    };
    let keys: Vec<KeySpec> = shared.spec.every_key().cloned().collect();
    for key in &keys {
        operator.configure(key).await;
    }
    shared
        .configured
        .store(true, std::sync::atomic::Ordering::Relaxed);
    while !shared.runners_done() {
        let pause = Duration::from_millis(operator.rng.random_range(200..700));
        tokio::time::sleep(pause).await;
        operator.act().await;
    }
    operator.read_back().await;
    Ok(())
}

impl Operator {
    fn event(&self, what: impl std::fmt::Display) {
        self.shared.trace.event(now(), "operator", what);
    }

    /// The first configuration of `key`, retried until answered.
    async fn configure(&mut self, key: &KeySpec) {
        while !self.set_limit(key, key.limit).await {
            tokio::time::sleep(CONFIGURE_RETRY).await;
        }
        if let Some(cap) = key.group_cap {
            while !self.set_cap(key, cap).await {
                tokio::time::sleep(CONFIGURE_RETRY).await;
            }
        }
    }

    async fn act(&mut self) {
        let keys = &self.shared.spec.keys;
        let key = keys[self.rng.random_range(0..keys.len())].clone();
        match self.rng.random_range(0..10) {
            0..4 => {
                let limit = self.rng.random_range(MIN_LIMIT..=MAX_LIMIT);
                self.set_limit(&key, limit).await;
            }
            4..6 if key.group_cap.is_some() => {
                let limit = self.limits[&key.name];
                let cap = self.rng.random_range(1..limit);
                self.set_cap(&key, cap).await;
            }
            6..9 => self.force_release_someone(&key.name).await,
            9 if !self.spare_deleted => self.delete_spare().await,
            _ => {}
        }
    }

    /// Writes `key`'s whole configuration with `limit`; answers whether the
    /// write was acknowledged.
    async fn set_limit(&mut self, key: &KeySpec, limit: u64) -> bool {
        let sent = now();
        let result = self
            .client
            .set_key_config(&key.name, &key.update(limit))
            .await;
        let what = Written::Key(key.config(limit));
        let acked = self.record(&key.name, what, format!("limit {limit}"), sent, &result);
        if acked {
            self.limits.insert(key.name.clone(), limit);
        }
        acked
    }

    /// Caps `key`'s capped group at `cap`; answers whether it was acknowledged.
    async fn set_cap(&mut self, key: &KeySpec, cap: u64) -> bool {
        let config = GroupConfig {
            limit: Some(cap),
            permitted: true,
        };
        let sent = now();
        let result = self
            .client
            .set_group(&key.name, CAPPED_GROUP, &config)
            .await;
        let what = Written::Group(CAPPED_GROUP.to_owned(), config);
        self.record(&key.name, what, format!("group cap {cap}"), sent, &result)
    }

    /// Traces a configuration write of `key` (`setting` names it) sent at
    /// `sent`, and puts it in the history; answers whether it was
    /// acknowledged.
    fn record<T>(
        &self,
        key: &str,
        what: Written,
        setting: String,
        sent: Duration,
        result: &Result<T, permitd_client::ClientError>,
    ) -> bool {
        let acked = result.as_ref().ok().map(|_| now());
        match result {
            Ok(_) => self.event(format_args!("set {key} {setting}")),
            Err(error) => self.event(format_args!(
                "setting {key} {setting} failed: {}",
                failure(error)
            )),
        }
        self.shared.history.lock().writes.push(Write {
            key: key.to_owned(),
            what,
            sent,
            acked,
        });
        acked.is_some()
    }

    /// Force-releases the first client (in id order) that `holders` shows
    /// holding a grant of `key`, but for replays (a force release forgets the
    /// answers they repeat).
    async fn force_release_someone(&mut self, key: &str) {
        let Ok(holders) = self.client.holders(key).await else {
            return;
        };
        let holder = holders
            .clients
            .iter()
            .find(|(id, holding)| !holding.grants.is_empty() && !id.ends_with(REPLAY_SUFFIX))
            .map(|(id, _)| id.clone());
        let Some(client_id) = holder else {
            return;
        };
        let sent = now();
        let result = self.client.force_release(key, &client_id).await;
        let acked = result.as_ref().ok().map(|_| now());
        match &result {
            Ok(released) => self.event(format_args!(
                "force-released {client_id} on {key}: {} permits",
                released.permits
            )),
            Err(error) => self.event(format_args!(
                "force release of {client_id} on {key} failed: {}",
                failure(error)
            )),
        }
        self.shared
            .history
            .lock()
            .force_releases
            .push(ForceRelease {
                key: key.to_owned(),
                client_id,
                sent,
                acked,
            });
    }

    /// Deletes the spare key (nobody uses it, so no `force`).
    async fn delete_spare(&mut self) {
        self.spare_deleted = true;
        let key = self.shared.spec.spare.name.clone();
        let sent = now();
        let result = self.client.delete_key(&key, false).await;
        let acked = result.as_ref().ok().map(|_| now());
        match &result {
            Ok(_) => self.event(format_args!("deleted {key}")),
            Err(error) => self.event(format_args!("deleting {key} failed: {}", failure(error))),
        }
        self.shared.history.lock().writes.push(Write {
            key,
            what: Written::Deleted,
            sent,
            acked,
        });
    }

    /// Reads every key's settings back (one backup: a linearizable read of
    /// the whole state).
    async fn read_back(&mut self) {
        for _ in 0..READ_BACK_TRIES {
            match self.client.save_backup().await {
                Ok(backup) => {
                    let keys = backup
                        .state
                        .keys
                        .into_iter()
                        .map(|(key, image)| {
                            let read = ReadBack {
                                config: image.meta.config.map(|config| *config),
                                groups: image.meta.groups,
                            };
                            (key, read)
                        })
                        .collect();
                    self.event("read the settings back");
                    self.shared.history.lock().read_back = Some(keys);
                    return;
                }
                Err(error) => {
                    self.event(format_args!("reading back failed: {}", failure(&error)));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}
