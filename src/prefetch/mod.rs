//! Prefetch for applications: [`Pool::prefetch`](crate::alloc::Core::prefetch) of hot ranges,
//! [`Pool::start_refill`](crate::alloc::Core::start_refill) of the refill reserve (`hot.rs`).
//!
//! The machinery is the arena's (`arena/prefetch/`): the arena prefetches every run it commits
//! in ODP mode, with the retry and error rules written there, and keeps the reserve a refill
//! thread fills. This module adds the calls an application makes, and names the types they use.

mod hot;

pub use crate::arena::prefetch::{
    AUTO_PREFETCH_MAX, COUNTED_ERRNOS, PrefetchError, PrefetchStats, RESERVE_MAX, RETRIES,
};
