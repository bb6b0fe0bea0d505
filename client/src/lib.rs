//! The library job runners embed: `SemaphoreClient` and `SemaphoreQueue`.
//!
//! Not built yet: the issue "client: SemaphoreClient, SemaphoreQueue and permitctl"
//! fills this crate in.
