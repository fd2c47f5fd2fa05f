//! A heap its thread left: whether it still holds pages, and what it gives back beyond them —
//! the memory of its thread caches.
//!
//! Contract: only the purge calls [`Heap::discard_cache`], while it holds the heap (its owner
//! is the purge's token) after [`Heap::release`] emptied every cache; a thread that claims the
//! heap afterwards ([`Heap::cache_claimed`], under its own token) finds the rows zero — empty,
//! as in a new heap. So a pool's heaps cost their threads' caches only while threads hold them:
//! 600 threads that came and went leave ~20 KiB of rows each no longer resident.

use super::*;

impl Heap {
    /// Whether the heap holds any page (queued, kept full, or waiting on its notify stack).
    pub(crate) fn holds_pages(&self) -> bool {
        !self.notify.load(Ordering::Acquire).is_null()
            || (0..CLASSES).any(|c| !self.queue[c].load(R).is_null() || self.full[c].load(R) > 0)
    }

    /// Give the memory of this heap's emptied thread caches back to the system, once between
    /// two claims (module contract). The bytes given back.
    pub(crate) fn discard_cache(&self) -> usize {
        self.tcache.discard_rows()
    }

    /// The heap was just claimed: its caches are in use again.
    pub(crate) fn cache_claimed(&self) {
        self.tcache.claimed();
    }
}
