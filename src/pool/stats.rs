//! [`Stats`]: everything a [`Pool`] counts, in one tree read by one call.

use super::Pool;
use crate::alloc::{MemcheckStats, PoolStats};
use crate::arena::{ForkStats, RailStats};
use crate::grant::GrantStats;
use crate::prefetch::PrefetchStats;
use crate::queue_mem::QueueStats;

/// A snapshot of a [`Pool`]: the allocator core (with the arena under it), then each feature.
///
/// ```text
/// Stats
/// ├── alloc: PoolStats        blocks, pages, classes, heaps, failures
/// │   └── arena: ArenaStats   reservation, slabs, registrations, purges, NUMA
/// ├── prefetch: PrefetchStats advice given, refused, the refill reserve
/// ├── rails: Vec<RailStats>   one per attached device
/// ├── grants: GrantStats      issued, open, parked, windows
/// ├── queue: QueueStats       UMEMs and carves
/// ├── fork: ForkStats         the fork gate (process-wide)
/// └── memcheck: MemcheckStats the memory checker (process-wide; zero without the feature)
/// ```
///
/// The core's branch is read without a lock (it is also what
/// [`GlobalStats::pool`](crate::GlobalStats::pool) holds); the features' take their locks
/// briefly.
///
/// # Examples
/// ```
/// let pool = rdma_pool::Pool::new(&rdma_pool::Nic::soft().alloc_pd()?)?;
/// let v = allocator_api2::vec![in &pool; 0u8; 4096];
/// let s = pool.stats();
/// assert!(s.alloc.small_allocated_bytes >= 4096);
/// assert!(s.alloc.arena.committed_bytes > 0);
/// assert_eq!((s.grants.open, s.queue.carves, s.rails.len()), (0, 0, 0));
/// # drop(v);
/// # Ok::<(), rdma_pool::PoolError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// The allocator core and its arena.
    pub alloc: PoolStats,
    /// Prefetch and the refill reserve ([`Core::prefetch`](crate::alloc::Core::prefetch)).
    pub prefetch: PrefetchStats,
    /// The devices attached as rails ([`Core::attach`](crate::alloc::Core::attach)), by index.
    pub rails: Vec<RailStats>,
    /// Grants ([`Pool::grant`]).
    pub grants: GrantStats,
    /// DEVX queue memory ([`Pool::queue_memory`]).
    pub queue: QueueStats,
    /// The fork gate, for the whole process ([`arena::fork_stats`](crate::arena::fork_stats)).
    pub fork: ForkStats,
    /// The memory checker, for the whole process
    /// ([`alloc::memcheck_stats`](crate::alloc::memcheck_stats)).
    pub memcheck: MemcheckStats,
}

impl Pool {
    /// Everything the pool counts (see [`Stats`]).
    ///
    /// # Examples
    /// ```
    /// let pool = rdma_pool::Pool::new(&rdma_pool::Nic::soft().alloc_pd()?)?;
    /// assert_eq!(pool.stats().alloc.failed_allocations, 0);
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let arena = self.core.arena();
        Stats {
            alloc: self.core.stats(),
            prefetch: arena.prefetch_stats(),
            rails: arena.rail_stats(),
            grants: self.features.grants.stats(),
            queue: self.features.queue.stats(),
            fork: crate::arena::fork_stats(),
            memcheck: crate::alloc::memcheck_stats(),
        }
    }
}
