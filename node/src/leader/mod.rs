//! The leader's machinery: what turns waiting requests into log entries and
//! log results back into answers, and the leader-only tasks beside it.
//!
//! - [`rounds`]: the driver task that parks requests, proposes entries and
//!   answers each waiting request; its rules are pure and unit-tested:
//!   [`schedule`] (what leaves in the next entry) and `round_plan` (what goes
//!   into an entry, how answers map back to waiting requests, which
//!   empty-handed requests are held); [`round_error`]: why a message got no
//!   answer;
//! - [`timer`]: what the driver sleeps on, precise to well under a millisecond:
//!   a timerfd that the API runtime's own epoll watches (no thread of its own),
//!   with tokio's 1 ms timer standing in where no timerfd can be made or used;
//! - [`reclaim`]: one timer per key at the earliest claim deadline;
//! - [`applied_feed`]: the applied-entry notices those leader-only tasks
//!   take, subscribed only while the node leads;
//! - [`deadlines`]: per-key due times in order, the one timer structure of the
//!   schedule and the reclaim timers;
//! - [`seed_defaults`]: writes the file's `[defaults]` on a leader whose cluster
//!   never had any written;
//! - [`propose`] and [`leadership`]: proposing an entry, and failing at once
//!   when leadership is lost;
//! - [`handover`]: a shard's leader steps down for the shard's preferred
//!   leader once that node has every entry, so leaders spread over the voters;
//! - [`snapshots`] (when to build one) and [`fatal`] (a Raft core that stopped).

pub mod applied_feed;
pub mod deadlines;
pub mod fatal;
pub mod handover;
pub mod leadership;
pub mod propose;
pub mod reclaim;
pub mod round_error;
mod round_plan;
pub mod rounds;
pub mod schedule;
pub mod seed_defaults;
pub mod snapshots;
pub mod timer;
