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
