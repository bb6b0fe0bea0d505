//! Making sled's writes durable.
//!
//! sled's `flush_async` hands the flush to sled's own IO thread pool, whose
//! queue wakes *every* idle pool thread (seven) for each task, and the flush
//! itself hands the sealed write buffer to that pool again: fourteen thread
//! wake-ups per flush, most of them finding nothing to do. Profiled on the
//! bench's contended run, sled's IO threads took 39 % of the leader's CPU
//! samples, nearly all of it context switches. A flush on tokio's blocking
//! pool wakes one thread, and leaves sled only the buffer write.

use crate::StorageError;

/// Writes everything `db` buffers to disk; returns once it is durable. The
/// flush blocks a thread of tokio's blocking pool, never the async runtime.
pub(crate) async fn flush(db: &sled::Db) -> Result<(), StorageError> {
    let db = db.clone();
    match tokio::task::spawn_blocking(move || db.flush()).await {
        Ok(flushed) => flushed.map(drop).map_err(StorageError::from),
        Err(error) => Err(StorageError::Flush(error.to_string())),
    }
}
