//! Thread caches of freed blocks: a short stack per small size class in each heap, so a
//! same-thread free and the next allocation of that class are a push and a pop — no page
//! lookup on the allocation, no list walk.
//!
//! Contract: only the heap's owner touches its stacks (relaxed loads and stores: plain moves);
//! a cached block stays counted in its page's `used` until it is flushed back to the page, so
//! the page invariant holds with the stacks as part of "handed out". Only blocks of the heap's
//! own pages are cached, by unsized and sized frees alike (a sized free finds the page's owner
//! with one load: every granule of a page records it). A block of another thread's page goes
//! back to that page: caching it would hand it to this thread, and two threads would write one
//! cache line (passive false sharing, mimalloc-bench's `cache-scratch`).
//!
//! Invariant: `n <= SLOTS`, and `slots[..n]` are distinct free blocks of this heap's pages,
//! at least `class_size(c)` bytes long and 8-byte aligned (a block kept in place by `realloc`
//! may sit in the cache of a smaller class).

use super::class::{MAX_SMALL, class_of};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

const R: Ordering = Ordering::Relaxed;

/// Classes with a cache: blocks up to 32 KiB.
pub(crate) const CACHED_CLASSES: usize = class_of(32 << 10) + 1;

/// Blocks per cache.
pub(crate) const SLOTS: usize = 32;

const _: () = assert!(32 << 10 <= MAX_SMALL);

/// One class's stack.
#[repr(C)]
pub(crate) struct TCache {
    n: AtomicU32,
    slots: [AtomicPtr<u8>; SLOTS],
}

impl TCache {
    /// The most recently freed block, or null.
    #[inline(always)]
    pub(crate) fn pop(&self) -> *mut u8 {
        let n = self.n.load(R);
        if n == 0 {
            return null_mut();
        }
        self.n.store(n - 1, R);
        // SAFETY: `n - 1 < SLOTS`.
        unsafe { self.slots.get_unchecked(n as usize - 1) }.load(R)
    }

    /// Keep `p`; false when the stack is full.
    #[inline(always)]
    pub(crate) fn push(&self, p: *mut u8) -> bool {
        let n = self.n.load(R);
        if n as usize == SLOTS {
            return false;
        }
        // SAFETY: `n < SLOTS`.
        unsafe { self.slots.get_unchecked(n as usize) }.store(p, R);
        self.n.store(n + 1, R);
        true
    }

    /// Whether `p` is cached here (a linear scan of at most [`SLOTS`] entries; exact on the
    /// owning thread, racy on another).
    pub(crate) fn holds(&self, p: *mut u8) -> bool {
        let n = (self.n.load(R) as usize).min(SLOTS);
        self.slots[..n].iter().any(|s| s.load(R) == p)
    }

    /// Blocks cached (any thread may read it, racily, for statistics).
    pub(crate) fn len(&self) -> u32 {
        self.n.load(R)
    }
}
