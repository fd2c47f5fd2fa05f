//! A heap its thread left: whether it still holds pages, and what it gives back beyond them —
//! the memory of its thread caches.
//!
//! Contract: only the purge calls [`Heap::discard_cache`], while it holds the heap (its owner
//! is the purge's token) after [`Heap::release`] emptied every cache; a thread that claims the
//! heap afterwards ([`Heap::cache_claimed`], under its own token) finds every count 0 — empty
//! caches — and writes a slot before it reads it. So the rows of threads that came and went do
//! not stay resident: the whole OS pages inside them (16 KiB of a heap's 20 KiB with 4 KiB pages)
//! go at the first purge pass after their heap is given back (a pass is asked for when the
//! heap still holds pages; otherwise at the next pass anything else makes due).

use super::*;

impl Heap {
    /// Whether the heap holds any page (queued, kept full, or waiting on its notify stack).
    pub(crate) fn holds_pages(&self) -> bool {
        !self.notify.load(Ordering::Acquire).is_null()
            || (0..CLASSES).any(|c| !self.queue[c].load(R).is_null() || self.full[c].load(R) > 0)
    }

    /// Advise the memory of this heap's emptied thread caches away, once between two claims
    /// (module contract). The bytes advised away.
    pub(crate) fn discard_cache(&self) -> usize {
        self.tcache.discard_rows()
    }

    /// The heap was just claimed: its caches are in use again.
    pub(crate) fn cache_claimed(&self) {
        self.tcache.claimed();
    }
}
