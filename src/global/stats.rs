//! What a [`GlobalPool`](super::GlobalPool) did that the pool's own statistics do not show:
//! its state, and every allocation it served from somewhere other than the pool.
//!
//! Contract: counters are relaxed atomics bumped on the cold paths only; a snapshot
//! ([`GlobalStats`]) is read without a lock and without allocating.
//!
//! Why a pool degraded is counted per reason ([`DegradedBy`]); the first reason is kept, and
//! reported once with `tracing` outside the allocation path ([`Counters::report`]): on the
//! next call of a `GlobalPool` method that is not an allocation, or at process exit — never
//! from inside `alloc`, where the subscriber may not exist yet and logging would allocate.
//!
//! Invariants (at quiescence): `reentrant_allocations == provisioning_heap_blocks +
//! bootstrap_blocks + bootstrap_overflow` — every allocation made while the pool provisions is
//! served by the pool's provisioning heap (a pool that is `malloc`), else by the bootstrap
//! region or, once that is full, by the fallback; `degraded_allocations + failed_allocations ==
//! degraded_by.init_failed + degraded_by.init_pending + degraded_by.pool_refused` (every such
//! allocation went through the degraded path, with its reason).

use super::bootstrap;
use crate::alloc::PoolStats;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};

/// Why an allocation was served by the system allocator (or refused under `Fail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DegradeReason {
    /// Initialisation failed ([`GlobalPool::init_error`](super::GlobalPool::init_error)).
    InitFailed,
    /// Another thread was still initialising the pool after
    /// [`INIT_WAIT`](super::INIT_WAIT).
    InitPending,
    /// The ready pool could not serve it: the arena could not grow (reservation or memlock
    /// exhausted, a registration refused), or the request is beyond what it serves.
    PoolRefused,
}

impl DegradeReason {
    fn from_code(c: u8) -> Option<DegradeReason> {
        match c {
            1 => Some(DegradeReason::InitFailed),
            2 => Some(DegradeReason::InitPending),
            3 => Some(DegradeReason::PoolRefused),
            _ => None,
        }
    }

    fn code(self) -> u8 {
        match self {
            DegradeReason::InitFailed => 1,
            DegradeReason::InitPending => 2,
            DegradeReason::PoolRefused => 3,
        }
    }
}

/// Degraded or refused allocations by [`DegradeReason`] (their sum is
/// `degraded_allocations + failed_allocations`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DegradedBy {
    /// ... because initialisation failed.
    pub init_failed: u64,
    /// ... because initialisation was still running elsewhere.
    pub init_pending: u64,
    /// ... because the ready pool could not serve them.
    pub pool_refused: u64,
}

/// Where the global pool is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GlobalState {
    /// Nothing was allocated through it yet.
    Uninitialised,
    /// Its first allocation is opening the NIC and the arena.
    Initialising,
    /// Serving NIC-registered memory.
    Ready,
    /// Initialisation failed ([`GlobalPool::init_error`](super::GlobalPool::init_error) says
    /// why): every allocation is degraded (or fails, per
    /// [`OnFailure`](super::OnFailure)).
    Failed,
}

/// A snapshot of a [`GlobalPool`](super::GlobalPool)'s statistics.
#[derive(Debug, Clone)]
pub struct GlobalStats {
    /// Where the pool is in its life.
    pub state: GlobalState,
    /// The pool's allocator statistics, once it is ready: the `alloc` branch of its
    /// [`Stats`](crate::Stats), read without a lock and without allocating (the features'
    /// branches: `GLOBAL.pool()?.stats()`).
    pub pool: Option<PoolStats>,
    /// Allocations served by the system allocator because the pool could not serve them
    /// (initialisation failed, the arena could not grow, every heap was taken, the thread was
    /// exiting, or it raced with initialisation): unregistered memory.
    pub degraded_allocations: u64,
    /// Bytes of those allocations.
    pub degraded_bytes: u64,
    /// Allocations refused (null): under [`OnFailure::Fail`](super::OnFailure::Fail), or when
    /// the system allocator refused them too (a request larger than memory, say).
    pub failed_allocations: u64,
    /// Allocations made while the pool was calling into the NIC (re-entrant: the NIC layer's
    /// bookkeeping, which lives as long as what it registers): served by the bootstrap region,
    /// then `malloc` — never by the registering thread's heap, whose pages such a record would
    /// keep after the thread exited — or, where the fallback is [`Fallback::Mmap`] (a pool that
    /// is the process's `malloc`), small ones by the pool's provisioning heap first.
    ///
    /// [`Fallback::Mmap`]: super::Fallback::Mmap
    pub reentrant_allocations: u64,
    /// Of those, blocks served by the pool's provisioning heap (pool memory shared by every
    /// thread's records; only under [`Fallback::Mmap`](super::Fallback::Mmap)).
    pub provisioning_heap_blocks: u64,
    /// Of those, blocks served by the bootstrap region.
    pub bootstrap_blocks: u64,
    /// Of those, allocations that found the bootstrap region full and went to `malloc`.
    pub bootstrap_overflow: u64,
    /// Bytes of live bootstrap blocks.
    pub bootstrap_live_bytes: usize,
    /// Bytes of the bootstrap region in use (its bump pointer), out of
    /// [`BOOTSTRAP_BYTES`](super::BOOTSTRAP_BYTES).
    pub bootstrap_used_bytes: usize,
    /// Blocks moved out of the system allocator into the pool by `realloc`.
    pub healed_reallocations: u64,
    /// Environment overrides set to a value that was not understood (and ignored).
    pub env_ignored: u64,
    /// Size-less frees ([`GlobalPool::free_unsized`](super::GlobalPool::free_unsized), C's
    /// `free`) of pointers this pool did not hand out — memory of the allocator that ran
    /// before it became the process's `malloc` (ld.so's start-up allocator): ignored.
    pub foreign_frees: u64,
    /// Degraded or refused allocations, by reason.
    pub degraded_by: DegradedBy,
    /// Why the first one was.
    pub first_degradation: Option<DegradeReason>,
}

/// The counters behind [`GlobalStats`].
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) degraded: AtomicU64,
    pub(crate) degraded_bytes: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) reentrant: AtomicU64,
    pub(crate) provisioning: AtomicU64,
    pub(crate) overflow: AtomicU64,
    pub(crate) healed: AtomicU64,
    pub(crate) env_ignored: AtomicU64,
    pub(crate) foreign: AtomicU64,
    by: [AtomicU64; 3],
    first: AtomicU8,
    reported: AtomicBool,
}

impl Counters {
    pub(crate) const fn new() -> Counters {
        Counters {
            degraded: AtomicU64::new(0),
            degraded_bytes: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            reentrant: AtomicU64::new(0),
            provisioning: AtomicU64::new(0),
            overflow: AtomicU64::new(0),
            healed: AtomicU64::new(0),
            env_ignored: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            by: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
            first: AtomicU8::new(0),
            reported: AtomicBool::new(false),
        }
    }

    /// Count an allocation that was degraded (or refused) for `why`: no lock, no allocation.
    pub(crate) fn degraded_for(&self, why: DegradeReason) {
        self.by[why.code() as usize - 1].fetch_add(1, Relaxed);
        let _ = self.first.compare_exchange(0, why.code(), Relaxed, Relaxed);
    }

    /// Log the first degradation, once, with `tracing` (call outside the allocation path).
    pub(crate) fn report(&self, init_error: Option<&dyn std::fmt::Display>) {
        let Some(why) = DegradeReason::from_code(self.first.load(Relaxed)) else {
            return;
        };
        if self.reported.swap(true, Relaxed) {
            return;
        }
        let n = self.degraded.load(Relaxed) + self.failed.load(Relaxed);
        match init_error {
            Some(e) => tracing::warn!(reason = ?why, allocations = n, error = %e,
                "rdma_pool: the global pool degraded: these allocations are not NIC-registered"),
            None => tracing::warn!(reason = ?why, allocations = n,
                "rdma_pool: the global pool degraded: these allocations are not NIC-registered"),
        }
    }

    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self, state: GlobalState, pool: Option<PoolStats>) -> GlobalStats {
        let (blocks, live, used) = bootstrap::usage();
        GlobalStats {
            state,
            pool,
            degraded_allocations: self.degraded.load(Relaxed),
            degraded_bytes: self.degraded_bytes.load(Relaxed),
            failed_allocations: self.failed.load(Relaxed),
            reentrant_allocations: self.reentrant.load(Relaxed),
            provisioning_heap_blocks: self.provisioning.load(Relaxed),
            bootstrap_blocks: blocks,
            bootstrap_overflow: self.overflow.load(Relaxed),
            bootstrap_live_bytes: live,
            bootstrap_used_bytes: used,
            healed_reallocations: self.healed.load(Relaxed),
            env_ignored: self.env_ignored.load(Relaxed),
            foreign_frees: self.foreign.load(Relaxed),
            degraded_by: DegradedBy {
                init_failed: self.by[0].load(Relaxed),
                init_pending: self.by[1].load(Relaxed),
                pool_refused: self.by[2].load(Relaxed),
            },
            first_degradation: DegradeReason::from_code(self.first.load(Relaxed)),
        }
    }
}
