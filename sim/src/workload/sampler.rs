//! The usage sampler: every 50–150 simulated ms, a linearizable usage read of
//! a drawn key, recorded with when it was sent and answered, until the
//! runners are done ([`crate::checker::usage`] judges them).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{client, now, Shared};
use crate::history::UsageRead;

pub async fn sample(seed: u64, shared: Shared) -> turmoil::Result {
    let client = client(&shared.spec.endpoints, seed)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x7361_6d70);
    let keys: Vec<_> = shared.spec.keys.iter().chain(&shared.spec.own).collect();
    shared.until_configured().await;
    while !shared.runners_done() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..150))).await;
        let key = &keys[rng.random_range(0..keys.len())].name;
        let sent = now();
        let Ok(usage) = client.usage(key).await else {
            continue;
        };
        let answered = now();
        shared.trace.event(
            answered,
            "sampler",
            format_args!(
                "usage {key}: {} granted, {} leased",
                usage.granted, usage.leased
            ),
        );
        shared.history.lock().usage_reads.push(UsageRead {
            key: key.clone(),
            sent,
            answered,
            granted: usage.granted,
            leased: usage.leased,
        });
    }
    Ok(())
}
