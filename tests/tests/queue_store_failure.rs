//! A `SemaphoreQueue` whose store fails a write fails closed, against a real
//! cluster and a store that really fails: the queue's dir is on a small tmpfs
//! with room for its first large record but not for the next, so the step that
//! would claim the grant fails with ENOSPC (a full disk). The tmpfs needs root
//! (CAP_SYS_ADMIN); without it the test says so and passes.
//!
//! The queue then admits nothing and sends nothing more: the grant it was
//! answered is never claimed, so the holder reclaims it at its claim deadline
//! and the key's usage returns to zero; every later call fails with
//! `QueueError::StoreFailed`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use permitd_client::{
    Admission, AdmittedItem, ClientConfig, QueueConfig, QueueError, QueueItem, SemaphoreClient,
    SemaphoreQueue,
};
use permitd_core::{GroupConfig, KeyConfigUpdate};
use permitd_tests::{Cluster, Settings, ADMIN_TOKEN};

/// The body of the queued item: each write of its record takes this much,
/// more than the zeros the journal keeps ahead of its records (1 MiB).
const LARGE_BODY_BYTES: usize = 1536 * 1024;
/// The tmpfs: the enqueue's record and the zeros written after it fit (small
/// steps go into those zeros), a second record of the item (its claim) does
/// not.
const DISK_BYTES: usize = LARGE_BODY_BYTES + (1 << 20) + 512 * 1024;
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

/// A tmpfs of [`DISK_BYTES`], unmounted (lazily) on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// Mounts it on `dir`, or `None` (after saying why) without the right to.
    fn mount(dir: &Path) -> Option<Self> {
        let options = format!("size={DISK_BYTES}");
        let mounted = nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        );
        match mounted {
            Ok(()) => Some(Self(dir.to_path_buf())),
            Err(error) => {
                eprintln!("SKIPPED: cannot mount a tmpfs ({error}): this test needs root");
                None
            }
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
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
    let Some(_disk) = SmallDisk::mount(dir.path()) else {
        return;
    };
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
        failure.to_string().contains("No space left"),
        "the store's own error is surfaced: {failure}"
    );
    // The grant was never claimed: the holder takes it back at the claim deadline.
    let deadline = Instant::now() + WAIT_FOR;
    let mut saw_the_grant = false;
    loop {
        let usage = client.usage(key).await.unwrap();
        saw_the_grant |= usage.granted > 0;
        if usage.granted == 0 && usage.leased == 0 {
            break;
        }
        still_waiting("the unclaimed grant is reclaimed", deadline).await;
    }
    assert!(
        saw_the_grant,
        "the step that failed was the grant's claim: the grant was issued"
    );
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
}
