//! Shared heaps: a thread's first blocks come from a few heaps that belong to no thread, so
//! that a thread holding a few blocks costs those blocks, not pages of its own.
//!
//! Why: a page is the least a class costs a heap (one 4 KiB granule, more for larger
//! classes), so each of 700 `spawn_blocking` threads holding 32 small blocks and one 4–64 KiB
//! buffer held about eight pages of its own (`tokio-blocking`: 61 MiB where glibc, whose
//! threads share arenas, needs 28). jemalloc's threads share a few arenas and own only a
//! bounded cache; ours own their pages (no lock and no atomic read-modify-write on the fast
//! paths), so a thread shares only until it has been served `ArenaConfig::shared_bytes`
//! (default 128 KiB, 0: off).
//!
//! Contract:
//! - the pool reserves up to [`MAX_SHARED`] heaps (two per CPU the process may run on, at
//!   least four) that no thread owns (`heaps.rs`: never on the free stack, reserved on first
//!   use);
//! - while a heap's thread has been served fewer than `shared_bytes` from them (`Heap::young`,
//!   reset when a thread claims the heap), has no current page of the class, and the block is at
//!   most [`SHARED_BLOCK_MAX`] bytes, its slow path serves the block from a shared heap,
//!   rounded up to a class of whole cache lines (so two threads' blocks never share a line:
//!   a thread's first blocks are often the state it writes most);
//! - to do so, inside the fork gate (a child never finds one held), it swaps the shared
//!   heap's owner from 0 to [`SHARED`] — starting at the one its heap's address picks, trying
//!   each in turn — allocates through that heap's ordinary paths and puts the owner back to 0.
//!   When every shared heap is held it yields and tries again, for at most [`WAIT_NS`] (a
//!   holder taking a page may register it); then the block comes from the thread's own pages;
//! - `current[c]` of the thread's heap stays `&EMPTY`, so its next allocation of the class
//!   takes the slow path again: no new instruction on the fast paths;
//! - every free of such a block is a remote free (no thread's heap owns the page: the
//!   lock-free push onto the page's `thread_free`). The holder of a shared heap collects them
//!   as it allocates; statistics collect every shared heap not held before they count; a purge
//!   pass collects a shared heap's empty pages as it collects the heaps of exited threads
//!   (`purge.rs`), so a page emptied by such frees goes back one pass after it emptied (a
//!   thread's own pages go back as they empty);
//! - shared and provisioning heaps never take from shared heaps themselves (their `young` is
//!   [`NOT_YOUNG`]); nothing is shared in memory-checker mode (its reuse and poisoning checks
//!   follow a block's own heap).
//!
//! Cost: the first `shared_bytes` a thread allocates take the slow path and one CAS each, their
//! frees the remote path, and blocks below 64 bytes take a line;
//! a thread that allocates more is on its own pages after at most that many bytes. Threads
//! starting together at 16 CPUs meet 16 shared heaps: a held one is skipped, not waited for.
//! Heaps: two per CPU so that a holder preempted mid-allocation (on 2 cores, 200 threads
//! starting at once) leaves others free; each keeps partly used pages of its own.
//!
//! Invariant: a shared heap's owner is [`SHARED`] only inside [`Heap::alloc_shared`] and
//! [`PoolInner::collect_shared`], else 0 or the purge's token; its `young` is [`NOT_YOUNG`].

use super::*;
use crate::alloc::class::{class_for, class_size};

/// The owner token of a shared heap while an allocation holds it (no thread's token: those are
/// addresses; the purge's is `u64::MAX`, the provisioning heap's `u64::MAX - 1`).
pub(crate) const SHARED: u64 = u64::MAX - 2;

/// The largest block served from the shared heaps.
pub(crate) const SHARED_BLOCK_MAX: usize = 64 << 10;

/// Blocks served from the shared heaps are multiples of a cache line (and aligned to one).
const LINE: usize = 64;

/// How long a young thread tries the shared heaps, all held, before its block comes from a
/// page of its own (which then serves the class: the thread shares no more of it). A hold is
/// one allocation, but one that takes a page in a pinned pool registers its step: 200 threads
/// starting at once on 2 cores found every heap held for four yields, and a quarter of their
/// blocks went to pages of their own.
const WAIT_NS: u64 = 2_000_000;

/// Most shared heaps a pool reserves.
pub(crate) const MAX_SHARED: usize = 16;

/// `young` of a heap that never takes from the shared heaps (a shared or provisioning heap).
pub(crate) const NOT_YOUNG: u32 = u32::MAX;

impl Heap {
    /// A block of class `c` from a shared heap while this heap is young (module contract);
    /// `None` when it is not, the block is too large, every shared heap is held, or the one
    /// taken had no memory.
    #[cold]
    pub(super) fn alloc_shared(&self, c: usize) -> Option<*mut u8> {
        let young = self.young.load(R);
        // Whole cache lines: two threads' blocks never share one (a thread's first blocks are
        // often the state it writes most).
        let c = class_for(class_size(c), LINE)?;
        let size = class_size(c);
        if cfg!(feature = "memcheck") || size > SHARED_BLOCK_MAX || young == NOT_YOUNG {
            return None;
        }
        let pool = self.pool();
        let young = next_young(young, size, pool.arena.shared_bytes())?;
        let heaps = &pool.heaps;
        let n = heaps.shared_count();
        let start = (self as *const Heap as usize / size_of::<Heap>()) % n;
        // A fork waits until the shared heap is put back: a child never finds it held.
        let _inside = crate::sys::atfork::inside();
        let mut since: Option<std::time::Instant> = None;
        loop {
            if let Some(t) = since {
                if t.elapsed().as_nanos() > u128::from(WAIT_NS) {
                    return None;
                }
                // Every one held: their holders were likely preempted (a hold is one
                // allocation). Let them run rather than take pages of this thread's own.
                std::thread::yield_now();
            } else {
                since = Some(std::time::Instant::now());
            }
            let mut any = false;
            for k in 0..n {
                let Some(h) = heaps.shared((start + k) % n) else {
                    continue;
                };
                any = true;
                if h.owner
                    .compare_exchange(0, SHARED, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
                h.generation
                    .store(crate::sys::atfork::generation(), Ordering::Relaxed);
                if !h.initialised.load(Ordering::Acquire) {
                    h.init(pool);
                }
                let p = h.alloc(c);
                h.owner.store(0, Ordering::Release);
                if p.is_null() {
                    return None;
                }
                self.young.store(young, R);
                return Some(p);
            }
            if !any {
                // No heap left to reserve one from.
                return None;
            }
        }
    }

    /// Collect the frees other threads made into this heap's pages (its owner's work: the
    /// caller holds it), so that statistics count them free.
    fn collect_pages(&self) {
        self.drain_notify();
        for c in 0..CLASSES {
            let mut p = self.queue[c].load(R);
            while !p.is_null() {
                // SAFETY: a page of this heap's queue.
                let page = unsafe { &*p };
                page.collect();
                p = page.next.load(R);
            }
        }
    }

    /// This heap was just claimed by a thread: its next blocks come from the shared heaps.
    pub(crate) fn claimed_young(&self) {
        self.young.store(0, R);
    }

    /// This heap belongs to no thread (a shared or the provisioning heap): it never takes
    /// from the shared heaps.
    pub(crate) fn never_young(&self) {
        self.young.store(NOT_YOUNG, R);
    }
}

/// What `young` becomes when a heap that was served `young` bytes takes a block of `size`
/// from the shared heaps; `None` when that would pass `limit` (or overflow).
fn next_young(young: u32, size: usize, limit: u32) -> Option<u32> {
    let next = young.checked_add(u32::try_from(size).ok()?)?;
    (next <= limit).then_some(next)
}

impl PoolInner {
    /// Collect the remote frees into every shared heap not held now (statistics: a block a
    /// thread freed into a shared heap's page then counts free, as one freed into its own).
    pub(crate) fn collect_shared(&self) {
        let _inside = crate::sys::atfork::inside();
        for i in 0..self.heaps.shared_count() {
            let Some(h) = self.heaps.shared_if_reserved(i) else {
                continue;
            };
            if h.owner
                .compare_exchange(0, SHARED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                if h.initialised.load(Ordering::Acquire) {
                    h.collect_pages();
                }
                h.owner.store(0, Ordering::Release);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::next_young;

    #[test]
    fn a_thread_is_served_up_to_the_limit_and_never_wraps() {
        assert_eq!(next_young(0, 64, 128 << 10), Some(64));
        assert_eq!(next_young((128 << 10) - 64, 64, 128 << 10), Some(128 << 10));
        assert_eq!(next_young((128 << 10) - 63, 64, 128 << 10), None);
        assert_eq!(next_young(0, 64, 0), None);
        // The largest limit: served up to it, never past it (a wrap made the thread young
        // again; with overflow checks the add panicked inside `GlobalAlloc`).
        assert_eq!(next_young(u32::MAX - 64, 64, u32::MAX), Some(u32::MAX));
        assert_eq!(next_young(u32::MAX - 63, 64, u32::MAX), None);
        assert_eq!(next_young(u32::MAX, 64, u32::MAX), None);
        assert_eq!(next_young(0, usize::MAX, u32::MAX), None);
    }
}
