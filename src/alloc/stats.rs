//! Allocator statistics: per size class and totals, computed from the page table and the
//! arena's counters without taking a lock. Figures are a racy snapshot while threads run
//! (each field is read atomically; blocks freed by other threads count as allocated until
//! their page's owner collects them) and exact at quiescence.

use super::class::{CLASSES, class_size};
use super::page::{LARGE, LARGE_FREE, SMALL};
use super::pool::PoolInner;
use crate::arena::ArenaStats;
use std::sync::atomic::Ordering::Relaxed;

/// One size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassStats {
    /// Bytes in a block of the class.
    pub block_size: u64,
    /// Blocks handed out (and not yet collected back by their page's owner).
    pub allocated: u64,
    /// Blocks carved and free in the class's pages, ready for reuse.
    pub cached: u64,
    /// Pages of the class.
    pub pages: u64,
    /// Of `cached`, blocks in threads' caches (each thread holds at most 32 of a class, and
    /// no more than 32 KiB of it, at least one block).
    pub thread_cached: u64,
}

/// A snapshot of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Per size class, smallest first.
    pub classes: [ClassStats; CLASSES],
    /// Bytes of small blocks handed out.
    pub small_allocated_bytes: u64,
    /// Bytes of large blocks (slab runs) in use.
    pub large_allocated_bytes: u64,
    /// Bytes of freed large runs kept for reuse.
    pub large_cached_bytes: u64,
    /// Empty pages kept for reuse.
    pub empty_pages: u64,
    /// Bytes of purged slabs that any later page or large run takes before fresh address
    /// space (what freed memory was cut into before does not matter).
    pub spare_bytes: u64,
    /// Bytes of free pages inside slabs still in use given back to the system (ODP arenas
    /// without rails, slabs of 4 KiB pages: a few live blocks keep their own pages, not the
    /// slab of pages freed around them), and, when a thread leaves its heap, of its empty
    /// pages and the insides of its free blocks of 64 KiB and more (the next thread faults in
    /// what it touches, not what every earlier occupant touched). Counted each time; a page is
    /// given back once per use.
    pub discarded_bytes: u64,
    /// Bytes of the thread caches of heaps whose threads left advised away by the purge (the
    /// whole OS pages of their emptied rows, once per heap between two claims; counted each
    /// time; at most that much was resident): the caches of threads that came and went do not
    /// stay resident.
    pub heap_cache_discarded_bytes: u64,
    /// Allocations refused because the arena could not grow (reservation, memlock, NIC).
    pub failed_allocations: u64,
    /// Heaps ever created: at most the number of threads that used the pool at one time (a
    /// heap given back by an exiting thread is reused by the next one), plus the pool's own —
    /// its provisioning heap and its shared heaps (two per CPU, 4 to 16), which serve a
    /// thread's first blocks.
    pub heaps_created: u64,
    /// Heaps claimed by threads (a thread's first allocation, or a claim after its thread
    /// cache evicted the pool).
    pub heap_claims: u64,
    /// `RDMA_POOL_*` environment variables set to a value the pool did not know (ignored).
    pub env_ignored: u64,
    /// Purge passes over this pool (due purges, `purge()`, and looks at heaps of exited
    /// threads), by any thread.
    pub purge_passes: u64,
    /// Whether this pool's due purges run on the process's purge clock
    /// ([`ArenaConfig::purge_thread`](crate::arena::ArenaConfig::purge_thread) and a purge
    /// delay).
    pub purge_clock: bool,
    /// Whether the purge clock thread runs in this process now (it starts with the first
    /// pending purge of a pool on the clock).
    pub purge_clock_running: bool,
    /// Passes the purge clock thread ran in this process, over all pools.
    pub purge_clock_passes: u64,
    /// Trims asked of live threads: every other thread's at a `purge()`, a quiet thread's
    /// (no free for the purge delay) at a due purge. A thread runs its trim — its cached
    /// blocks back to their pages, its empty pages back to the pool — at its next free or
    /// allocation slow path.
    pub trims_requested: u64,
    /// Trims the threads ran.
    pub trims: u64,
    /// The arena below.
    pub arena: ArenaStats,
}

impl PoolInner {
    /// Blocks sitting in the heaps' thread caches, per class.
    pub(crate) fn cached_in_heaps(&self, c: usize) -> u64 {
        self.heaps
            .iter()
            .filter(|h| h.initialised.load(std::sync::atomic::Ordering::Acquire))
            .map(|h| h.cached(c) as u64)
            .sum()
    }

    /// Blocks sitting in the heaps' thread caches, per class of the page each lies in (a
    /// cache may hold blocks of larger classes: a sparse class's blocks on its leader's page,
    /// `heap/sparse.rs`, or a block `realloc` kept in place).
    fn cached_by_page_class(&self) -> [u64; CLASSES] {
        let mut t = [0u64; CLASSES];
        for h in self
            .heaps
            .iter()
            .filter(|h| h.initialised.load(std::sync::atomic::Ordering::Acquire))
        {
            for c in 0..super::tcache::CACHED_CLASSES {
                h.for_each_cached(c, |p| {
                    if let Some(page) = self.table.page_of(p) {
                        t[(page.class.load(Relaxed) as usize).min(CLASSES - 1)] += 1;
                    }
                });
            }
        }
        t
    }

    pub(crate) fn stats(&self) -> PoolStats {
        self.collect_shared();
        let mut classes = [ClassStats::default(); CLASSES];
        for (c, s) in classes.iter_mut().enumerate() {
            s.block_size = class_size(c) as u64;
        }
        let mut empty_pages = 0;
        let mut small = 0;
        self.for_each_head(|d| match d.kind.load(Relaxed) {
            SMALL if d.heap.load(Relaxed).is_null() => empty_pages += 1,
            SMALL => {
                let s = &mut classes[(d.class.load(Relaxed) as usize).min(CLASSES - 1)];
                let used = d.used.load(Relaxed) as u64;
                s.pages += 1;
                s.allocated += used;
                s.cached += (d.capacity.load(Relaxed) as u64).saturating_sub(used);
                small += used * s.block_size;
            }
            LARGE | LARGE_FREE => {}
            _ => {}
        });
        let in_caches = self.cached_by_page_class();
        for (c, s) in classes.iter_mut().enumerate() {
            let cached = in_caches[c].min(s.allocated);
            s.allocated -= cached;
            s.cached += cached;
            s.thread_cached = cached;
            small -= cached * s.block_size;
        }
        PoolStats {
            classes,
            small_allocated_bytes: small,
            large_allocated_bytes: self.large_live.load(Relaxed) as u64,
            large_cached_bytes: self.large_cached.load(Relaxed) as u64,
            empty_pages,
            spare_bytes: (self.spare.count() * crate::arena::SLAB) as u64,
            discarded_bytes: self
                .idle
                .discarded
                .load(std::sync::atomic::Ordering::Relaxed),
            heap_cache_discarded_bytes: self
                .idle
                .heap_discarded
                .load(std::sync::atomic::Ordering::Relaxed),
            failed_allocations: self.failed.load(Relaxed),
            heaps_created: self.heaps.top() as u64,
            heap_claims: self.heaps.claims(),
            env_ignored: u64::from(self.env_ignored),
            purge_passes: self.idle.passes.load(Relaxed),
            purge_clock: self.idle.on_clock(),
            purge_clock_running: super::purger::running(),
            purge_clock_passes: super::purger::passes(),
            trims_requested: self.idle.trims_requested.load(Relaxed),
            trims: self.idle.trims.load(Relaxed),
            arena: self.arena.stats(),
        }
    }
}
