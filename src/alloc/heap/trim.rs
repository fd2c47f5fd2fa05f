//! Trims: another thread asks a heap's owner to give back what it keeps for itself (its
//! cached blocks and empty pages), and the owner does so at its next free or slow path; the
//! owner's own tick retires its empty current pages. See the module contract (`heap.rs`).

use super::*;

impl Heap {
    /// Ask the owner (from any thread) to give back its cached blocks and its empty pages at
    /// its next free or allocation slow path, whichever comes first: the flag, and the tick
    /// counter set to fire at the next free. The counter is the owner's: a store lost to the
    /// owner's own decrement only puts the trim off to the next tick ([`TICK`] frees) or slow
    /// path. False when a trim was already pending. A thread that never calls the pool again
    /// keeps its cache and the pages of its live blocks (nobody else may touch them: its fast
    /// paths take no lock).
    pub(crate) fn request_trim(&self) -> bool {
        if self.trim.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.tick.store(0, R);
        true
    }

    /// Whether a trim was asked and the owner has not run it yet.
    pub(crate) fn trim_pending(&self) -> bool {
        self.trim.load(Ordering::Acquire)
    }

    /// A requested trim, on the owning thread: every cached block back to its page, the empty
    /// pages back to the pool.
    #[cold]
    #[inline(never)]
    pub(super) fn trim_now(&self) {
        self.trim.store(false, Ordering::Release);
        self.pool().count_trim();
        self.flush_all();
    }

    /// Retire the current pages that are empty: the last page of a class a program stopped
    /// using leaves the heap at the next tick instead of staying with the thread.
    pub(crate) fn retire_empty(&self) {
        self.drain_notify();
        for c in 0..CLASSES {
            loop {
                let p = self.current[c].load(R);
                // SAFETY: the current page of a class is a page of this heap's queue (its
                // leader's page, for an alias: skipped, the leader's turn looks at it).
                if p == empty() || self.is_alias(c) || !self.retire_if_empty(c, unsafe { &*p }) {
                    break;
                }
            }
        }
    }

    /// Before an explicit purge on the owning thread: return every cached block to its page
    /// and retire the pages that are then empty.
    pub(crate) fn flush_all(&self) {
        for c in 0..CACHED_CLASSES {
            self.flush(c, SLOTS);
        }
        self.retire_empty();
    }
}

/// Free blocks at least this large have their interior given back when the heap is swept (its
/// thread left, or another claims it): a block's occupants touch pages of their own (a buffer
/// of 64–256 KiB written where its message ends), so a block reused by thread after thread
/// ends up resident whole though each occupant touched a few pages (`threads`: ~140 KiB more
/// per thread).
pub(super) const DISCARD_BLOCK_MIN: usize = 64 << 10;

/// The most `madvise` calls one sweep makes (~3 µs each with the NIC's invalidation): a
/// thread leaving thousands of free medium blocks does not hold up the thread exits and
/// claims behind it (the registry lock) for tens of ms; the pages it did not get to wait,
/// not `swept`, for the next sweep of the heap (a thread claiming it, or the purge's); an
/// empty page met with the budget spent goes back to the pool as it is (the purge's).
pub(super) const SWEEP_DISCARDS: u32 = 256;

impl Heap {
    /// Give back the whole OS pages inside the free blocks of `page` (blocks of at least
    /// [`DISCARD_BLOCK_MIN`]; the first page of each, which holds its link, stays), where the
    /// arena may drop memory under its live pages (an ODP arena without rails); not with the
    /// memory checker, whose fill of freed blocks is checked when they are handed out again.
    /// A page is walked once per batch of frees (`swept`): a heap of thousands of free medium
    /// blocks is not walked again at every claim and release; and only when the sweep's
    /// `budget` of calls ([`SWEEP_DISCARDS`]) covers the whole page. The owner only (it walks
    /// the page's local free list).
    pub(super) fn discard_free_blocks(&self, page: &Page, budget: &mut u32) {
        let bs = page.block_size.load(R) as usize;
        if cfg!(feature = "memcheck")
            || bs < DISCARD_BLOCK_MIN
            || page.fresh.load(R)
            || page.swept.load(R)
            || *budget == 0
        {
            return;
        }
        let pool = self.pool();
        if !pool.arena.may_discard_in(page.start.load(R)) {
            return;
        }
        // A page is walked whole or not at all (walked in part, its next sweep would advise
        // and count its first blocks again): its free blocks are all on `free` (the sweep
        // flushed the caches and collected the remote frees first).
        let on_list = page.capacity.load(R).saturating_sub(page.used.load(R));
        if on_list > *budget {
            *budget = 0;
            return;
        }
        let mut b = page.free.load(R);
        let mut bytes = 0;
        while !b.is_null() {
            let addr = b as usize;
            let (from, to) = ((addr + 1).next_multiple_of(4096), (addr + bs) & !4095);
            if from < to {
                *budget = budget.saturating_sub(1);
                if pool.arena.discard_free(from, to - from) {
                    bytes += to - from;
                }
            }
            // SAFETY: a block of this page's free list (the owner's).
            b = unsafe { (*b).next.load(R) };
        }
        // Swept until a block joins the list again.
        page.swept.store(true, R);
        if bytes > 0 {
            pool.idle.discarded.fetch_add(bytes as u64, R);
        }
    }
}

impl Heap {
    /// Give back the memory of an empty page of blocks of at least [`DISCARD_BLOCK_MIN`]
    /// before the sweep retires it (its thread left): the page goes to the pool `fresh` (zero),
    /// so the next heap to take it faults in only what its blocks' occupants touch. Same
    /// conditions and budget as [`Heap::discard_free_blocks`]; a page that is fresh already
    /// stays as is.
    pub(super) fn discard_empty(&self, page: &Page, budget: &mut u32) {
        if cfg!(feature = "memcheck")
            || (page.block_size.load(R) as usize) < DISCARD_BLOCK_MIN
            || page.fresh.load(R)
            || *budget == 0
        {
            return;
        }
        *budget -= 1;
        let pool = self.pool();
        let (start, len) = (page.start.load(R), 1usize << page.shift.load(R));
        if pool.arena.may_discard_in(start) && pool.arena.discard_free(start, len) {
            page.fresh.store(true, R);
            pool.idle.discarded.fetch_add(len as u64, R);
        }
    }
}
