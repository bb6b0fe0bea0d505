//! A `SemaphoreQueue` whose sled file fails a write fails closed, against a
//! real cluster and a store that really fails: the queue's directory is
//! removed under it, so sled cannot create the file a large record goes to.
//!
//! The queue then admits nothing and sends nothing more: the grant it was
//! answered is never claimed, so the holder reclaims it at its claim deadline
//! and the key's usage returns to zero; every later call fails with
//! `QueueError::StoreFailed`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use permitd_client::{
    Admission, AdmittedItem, ClientConfig, QueueConfig, QueueError, QueueItem, SemaphoreClient,
    SemaphoreQueue,
};
use permitd_core::{GroupConfig, KeyConfigUpdate};
use permitd_tests::{Cluster, Settings, ADMIN_TOKEN};

/// Larger than sled's inline values: written as a file of its own.
const LARGE_BODY_BYTES: usize = 1 << 20;
/// The holder's claim deadline: an unclaimed grant comes back after this.
const GRANT_TIMEOUT_MS: u64 = 1_000;
const WAIT_FOR: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Default)]
struct CountAdmits(Arc<AtomicU64>);

impl Admission<String> for CountAdmits {
    async fn admit(&self, items: Vec<AdmittedItem<String>>) {
        self.0.fetch_add(items.len() as u64, Ordering::SeqCst);
    }

    async fn finished(&self, _ids: Vec<String>) -> Vec<String> {
        Vec::new()
    }
}

/// Waits a little; panics once `deadline` passed, naming `what` was awaited.
async fn still_waiting(what: &str, deadline: Instant) {
    assert!(Instant::now() < deadline, "{what} within {WAIT_FOR:?}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_whose_store_fails_stops_admitting_and_says_why() {
    let cluster = Cluster::start(Settings::default()).await;
    let mut config = ClientConfig::new(cluster.nodes.iter().map(|node| node.url()));
    config.token = Some(ADMIN_TOKEN.to_string());
    let client = SemaphoreClient::new(config).unwrap();
    let key = "acct-store-fails";
    let update = KeyConfigUpdate {
        limit: Some(2),
        round_wait_ms: Some(5),
        round_period_ms: Some(20),
        grant_timeout_ms: Some(GRANT_TIMEOUT_MS),
        leases: Some(None),
    };
    client.set_key_config(key, &update).await.unwrap();
    // Nothing is granted until the store is broken.
    let blocked = GroupConfig {
        limit: None,
        permitted: false,
    };
    client.set_group(key, "wf", &blocked).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue");
    let admits = CountAdmits::default();
    let queue_config = QueueConfig::new("runner-store-fails").with_path(&path);
    let queue = SemaphoreQueue::start(client.clone(), queue_config, admits.clone()).unwrap();
    let item = QueueItem {
        id: "job-1".to_string(),
        key: key.to_string(),
        group: "wf".to_string(),
        body: "x".repeat(LARGE_BODY_BYTES),
    };
    queue.enqueue(vec![item]).await.unwrap();
    std::fs::remove_dir_all(&path).unwrap();
    let permitted = GroupConfig {
        limit: None,
        permitted: true,
    };
    client.set_group(key, "wf", &permitted).await.unwrap();

    let deadline = Instant::now() + WAIT_FOR;
    while queue.failure().is_none() {
        still_waiting("the queue stops on the failed write", deadline).await;
    }
    let failure = queue.failure().unwrap();
    assert!(matches!(failure, QueueError::StoreFailed(_)), "{failure}");
    assert!(
        failure.to_string().contains("No such file"),
        "the store's own error is surfaced: {failure}"
    );
    // The grant was never claimed: the holder takes it back at the claim deadline.
    let deadline = Instant::now() + WAIT_FOR;
    loop {
        let usage = client.usage(key).await.unwrap();
        if usage.granted == 0 && usage.leased == 0 {
            break;
        }
        still_waiting("the unclaimed grant is reclaimed", deadline).await;
    }
    assert_eq!(admits.0.load(Ordering::SeqCst), 0, "nothing was admitted");
    let again = QueueItem {
        id: "job-2".to_string(),
        key: key.to_string(),
        group: "wf".to_string(),
        body: String::new(),
    };
    assert!(matches!(
        queue.enqueue(vec![again]).await,
        Err(QueueError::StoreFailed(_))
    ));
    assert!(matches!(
        queue.release("job-1"),
        Err(QueueError::StoreFailed(_))
    ));
    assert!(matches!(
        queue.shutdown().await,
        Err(QueueError::StoreFailed(_))
    ));
    assert_eq!(admits.0.load(Ordering::SeqCst), 0, "nothing was admitted");
    // sled flushes when dropped, and a flush after its failed write never
    // returns: the handle is leaked rather than dropped.
    std::mem::forget(queue);
}
