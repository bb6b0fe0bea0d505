//! The physical floor: how long one durable 4 KiB append takes on the disk that
//! holds the nodes' data, made durable by the call the Raft log's group commit
//! uses (`fdatasync`, `storage/src/wal/`). No round can be acknowledged faster
//! than the leader's sync and then a follower's, so latencies are shown beside it.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use super::stats::{ms, quantile};

/// Bytes per write.
const WRITE_BYTES: usize = 4 * 1024;

/// What the fsync probe measured.
#[derive(Debug, Clone, Default)]
pub struct FloorResult {
    pub fsync_ms_p50: f64,
    pub fsync_ms_p99: f64,
    pub samples: usize,
}

/// `samples` appends of 4 KiB to a file in `dir`, each followed by `fdatasync`
/// (the file grows, so each sync also persists its new size, as a log's does).
pub fn measure(dir: &Path, samples: usize) -> FloorResult {
    let path = dir.join("fsync-probe");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("probe file");
    let block = vec![0xa5u8; WRITE_BYTES];
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        file.write_all(&block).expect("probe write");
        file.sync_data().expect("probe fdatasync");
        times.push(ms(started.elapsed()));
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    FloorResult {
        fsync_ms_p50: quantile(&mut times, 0.5),
        fsync_ms_p99: quantile(&mut times, 0.99),
        samples,
    }
}
