//! `SemaphoreClient::acquire`, `with_permit` and the `Permit` guard against a
//! real three-node cluster.
//!
//! The checks:
//! - many concurrent holders of one key never exceed its limit (counted by the
//!   tasks themselves), and usage returns to zero once every guard dropped;
//! - a count larger than one round grants is gathered from several grants;
//! - fences grow from one permit to the next;
//! - a timed-out or dropped acquisition leaves nothing claimed behind;
//! - an acquisition survives the leader's death (SIGKILL) by retrying.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use permitd_client::{AcquireError, AcquireOptions, ClientConfig, SemaphoreClient};
use permitd_core::{GroupConfig, KeyConfigUpdate};
use permitd_tests::{eventually, Cluster, Settings};

const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

fn client(cluster: &Cluster) -> SemaphoreClient {
    let urls: Vec<String> = cluster.nodes.iter().map(|node| node.url()).collect();
    let mut config = ClientConfig::new(urls);
    config.token = Some(permitd_tests::ADMIN_TOKEN.to_owned());
    SemaphoreClient::new(config).expect("client")
}

async fn set_limit(client: &SemaphoreClient, key: &str, limit: u64) {
    let update = KeyConfigUpdate {
        limit: Some(limit),
        ..KeyConfigUpdate::default()
    };
    client.set_key_config(key, &update).await.expect("config");
}

/// Waits until the key holds nothing granted or leased.
async fn drained(cluster: &Cluster, key: &str) -> bool {
    eventually(DRAIN_TIMEOUT, || async {
        let usage = cluster.usage(1, key).await;
        usage["granted"] == 0 && usage["leased"] == 0
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_stay_under_the_limit_and_release_on_drop() {
    let cluster = Cluster::start(Settings::default()).await;
    let client = client(&cluster);
    set_limit(&client, "acct-1", 3).await;
    let running = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for worker in 0..12 {
        let (client, running, most) = (client.clone(), running.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let permit = client.acquire("acct-1", "wf", 1).await.expect("permit");
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // The work done under the permit (a duration, not a wait).
            tokio::time::sleep(Duration::from_millis(20 + worker * 5)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            // Odd workers release explicitly, even ones by dropping the guard.
            if worker % 2 == 1 {
                permit.release().await.expect("release");
            } else {
                drop(permit);
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=3).contains(&most), "at most 3 at once, saw {most}");
    assert!(drained(&cluster, "acct-1").await, "usage returns to zero");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_gather_grants_and_fences_grow() {
    let cluster = Cluster::start(Settings::default()).await;
    let client = client(&cluster);
    set_limit(&client, "acct-2", 4).await;
    // Another holder has 2 of the 4: a request for 4 is granted 2, then 2 more.
    let first = client.acquire("acct-2", "wf", 2).await.expect("first");
    let key = "acct-2".to_string();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.acquire(&key, "wf", 4).await })
    };
    // The waiter's round has run: it was granted the 2 that were free.
    let gathered = eventually(Duration::from_secs(10), || async {
        cluster.usage(1, "acct-2").await["granted"] == 4
    })
    .await;
    assert!(!waiting.is_finished(), "4 cannot be had while 2 are held");
    assert!(gathered, "the waiter holds the 2 that were free");
    let first_fence = first.fence();
    first.release().await.expect("release");
    let second = waiting.await.expect("task").expect("second");
    assert_eq!(second.count(), 4);
    assert!(second.grants().len() >= 2, "gathered from several grants");
    assert!(second.fence() > first_fence, "fences grow");
    drop(second);
    // with_permit hands over the fence and releases when the work ends.
    let fence = client
        .with_permit("acct-2", "wf", 4, |fence| async move { fence })
        .await
        .expect("with_permit");
    assert!(fence > first_fence);
    assert!(drained(&cluster, "acct-2").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_dropped_acquisitions_leave_nothing_claimed() {
    let cluster = Cluster::start(Settings::default()).await;
    let client = client(&cluster);
    // A request in flight when an acquisition is given up may still be granted
    // by its round; nobody claims that grant, and it returns at its claim
    // deadline: keep that short here.
    let update = KeyConfigUpdate {
        limit: Some(2),
        grant_timeout_ms: Some(1_000),
        ..KeyConfigUpdate::default()
    };
    client
        .set_key_config("acct-3", &update)
        .await
        .expect("config");
    let held = client.acquire("acct-3", "wf", 1).await.expect("held");
    // Asks for 2 with 1 free: gets 1, waits for the other, times out, returns 1.
    let options = AcquireOptions {
        timeout: Some(Duration::from_millis(500)),
        ..AcquireOptions::default()
    };
    let timed_out = client.acquire_with("acct-3", "wf", 2, options).await;
    assert!(matches!(timed_out, Err(AcquireError::Timeout { .. })));
    let back_to_one = eventually(DRAIN_TIMEOUT, || async {
        cluster.usage(1, "acct-3").await["granted"] == 1
    })
    .await;
    assert!(back_to_one, "the timed-out acquisition's grant came back");
    // A dropped acquisition releases what it was granted, from a spawned task.
    let dropped = tokio::time::timeout(
        Duration::from_millis(500),
        client.acquire("acct-3", "wf", 2),
    )
    .await;
    assert!(dropped.is_err(), "cannot be granted while 1 is held");
    let back_to_one = eventually(DRAIN_TIMEOUT, || async {
        cluster.usage(1, "acct-3").await["granted"] == 1
    })
    .await;
    assert!(back_to_one, "the dropped acquisition's grant came back");
    // A group that is not permitted fails at once instead of waiting forever.
    let forbidden = GroupConfig {
        limit: None,
        permitted: false,
    };
    client
        .set_group("acct-3", "closed", &forbidden)
        .await
        .unwrap();
    let refused = client.acquire("acct-3", "closed", 1).await;
    assert!(matches!(refused, Err(AcquireError::NotPermitted { .. })));
    assert!(matches!(
        client.acquire("acct-3", "wf", 0).await,
        Err(AcquireError::ZeroCount)
    ));
    held.release().await.expect("release");
    assert!(drained(&cluster, "acct-3").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_survives_a_leader_kill() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let client = client(&cluster);
    set_limit(&client, "acct-4", 1).await;
    let before = client.acquire("acct-4", "wf", 1).await.expect("before");
    let leader = cluster.wait_for_leader().await;
    cluster.kill(leader);
    // The release and the next acquisition go through the new leader.
    before.release().await.expect("release after the kill");
    let after = client.acquire("acct-4", "wf", 1).await.expect("after");
    let survivor = cluster.follower_of(leader);
    let usage = cluster.usage(survivor, "acct-4").await;
    assert_eq!(usage["granted"], 1, "exactly the new permit");
    after.release().await.expect("release");
    let empty = eventually(DRAIN_TIMEOUT, || async {
        cluster.usage(survivor, "acct-4").await["granted"] == 0
    })
    .await;
    assert!(empty);
}
