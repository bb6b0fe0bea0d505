//! permitd's replicated state machine and Raft log over sled.
//!
//! Not built yet: the issue "storage: sled-backed Raft log and replicated state
//! machine" fills this crate in. It will apply `permitd_core` rounds atomically.
