//! Thread caches of freed blocks: a short stack per small size class in each heap, so a
//! same-thread free and the next allocation of that class are a push and a pop — no page
//! lookup on the allocation, no list walk.
//!
//! Contract: only the heap's owner touches its stacks (relaxed loads and stores: plain moves;
//! the purge, holding a heap no thread owns, advises its emptied rows away: `heap/unowned.rs`);
//! a cached block stays counted in its page's `used` until it is flushed back to the page, so
//! the page invariant holds with the stacks as part of "handed out". Only blocks of the heap's
//! own pages are cached, by unsized and sized frees alike (a sized free finds the page's owner
//! with one load: every granule of a page records it). A block of another thread's page goes
//! back to that page: caching it would hand it to this thread, and two threads would write one
//! cache line (passive false sharing, mimalloc-bench's `cache-scratch`).
//!
//! Each class's stack holds at most [`LIMIT`]`[c]` blocks: 32, and no more than 32 KiB of
//! blocks (at least one), so a thread's caches hold at most 32 KiB per class, about 1.2 MiB in
//! all (jemalloc's `tcache_max`), whatever it frees.
//!
//! Invariant: `n[c] <= LIMIT[c] <= SLOTS`, and `slots[c][..n[c]]` are distinct free blocks of this heap's pages,
//! at least `class_size(c)` bytes long and 8-byte aligned (a block kept in place by `realloc`
//! may sit in the cache of a smaller class).

use super::class::{MAX_SMALL, TABLE_MAX, class_of_computed, class_size};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

const R: Ordering = Ordering::Relaxed;

/// Classes with a cache: blocks up to 32 KiB.
pub(crate) const CACHED_CLASSES: usize = class_of_computed(32 << 10) + 1;

/// Blocks per cache.
pub(crate) const SLOTS: usize = 32;

const _: () = assert!(32 << 10 <= MAX_SMALL);

/// Bytes a class's cache holds at most.
const CACHE_BYTES: usize = 32 << 10;

/// Blocks each class's cache holds at most: `min(SLOTS, max(1, CACHE_BYTES / size))`.
pub(crate) const LIMIT: [u32; CACHED_CLASSES] = {
    let mut t = [0u32; CACHED_CLASSES];
    let mut c = 0;
    while c < CACHED_CLASSES {
        let n = CACHE_BYTES / class_size(c);
        t[c] = if n >= SLOTS {
            SLOTS as u32
        } else if n == 0 {
            1
        } else {
            n as u32
        };
        c += 1;
    }
    t
};

// Every class the sized fast path's table classes (up to `TABLE_MAX` bytes) caches `SLOTS`
// blocks: that path compares with the constant.
const _: () = assert!(LIMIT[class_of_computed(TABLE_MAX)] as usize == SLOTS);

/// Every cached class's stack: the counts side by side (one line for the hot classes), the
/// slots in rows of 256 bytes, so a class's row is one shift away. All zero is empty (heaps
/// live in zeroed memory).
#[repr(C)]
pub(crate) struct TCaches {
    n: [AtomicU32; CACHED_CLASSES],
    slots: [[AtomicPtr<u8>; SLOTS]; CACHED_CLASSES],
    /// The rows were advised away (or tried) since the heap was last claimed
    /// ([`Self::discard_rows`]).
    discarded: AtomicBool,
}

const _: () = assert!(size_of::<[AtomicPtr<u8>; SLOTS]>() == 256);

impl TCaches {
    /// Advise the memory of the slot rows away (the whole OS pages inside them; the counts
    /// stay), once between two claims of the heap: for a heap no thread owns, whose caches
    /// are all empty (checked: with a block cached nothing goes), so no slot is read before an
    /// owner writes it again — a cache is as empty as its count says. The bytes advised away
    /// (at most that much was resident).
    pub(crate) fn discard_rows(&self) -> usize {
        if self.n.iter().any(|n| n.load(R) != 0) || self.discarded.swap(true, R) {
            return 0;
        }
        // SAFETY: the rows of this heap, in the pool's private anonymous heap array (never
        // registered); every count is 0, so nobody reads a slot before writing it.
        unsafe {
            crate::sys::os::discard_inside(self.slots.as_ptr() as usize, size_of_val(&self.slots))
        }
    }

    /// A thread claimed the heap: its rows are in use again.
    pub(crate) fn claimed(&self) {
        if self.discarded.load(R) {
            self.discarded.store(false, R);
        }
    }
}

impl TCaches {
    /// The most recently freed block of class `c`, if any (never null: `None` is the only
    /// empty answer, so the fast path tests the count alone).
    ///
    /// # Safety
    /// `c < CACHED_CLASSES`.
    #[inline(always)]
    pub(crate) unsafe fn pop(&self, c: usize) -> Option<*mut u8> {
        // SAFETY: `c < CACHED_CLASSES` (the caller's contract).
        let n = unsafe { self.n.get_unchecked(c) };
        let k = n.load(R);
        if k == 0 {
            return None;
        }
        n.store(k - 1, R);
        // SAFETY: as above, and `k - 1 < SLOTS` (the invariant).
        Some(unsafe { self.slots.get_unchecked(c).get_unchecked(k as usize - 1) }.load(R))
    }

    /// Keep `p` in class `c`'s stack; false when it holds `limit` blocks.
    ///
    /// # Safety
    /// `c < CACHED_CLASSES` and `limit == LIMIT[c]` (a constant where the caller knows it).
    #[inline(always)]
    pub(crate) unsafe fn push(&self, c: usize, p: *mut u8, limit: u32) -> bool {
        debug_assert!(c < CACHED_CLASSES && limit == LIMIT[c]);
        // SAFETY: `c < CACHED_CLASSES` (the caller's contract).
        let n = unsafe { self.n.get_unchecked(c) };
        let k = n.load(R);
        if k >= limit {
            return false;
        }
        // SAFETY: as above, and `k < SLOTS`.
        unsafe { self.slots.get_unchecked(c).get_unchecked(k as usize) }.store(p, R);
        n.store(k + 1, R);
        true
    }

    /// Whether `p` is cached in class `c` (a linear scan of at most [`SLOTS`] entries; exact
    /// on the owning thread, racy on another). False for a class without a cache.
    pub(crate) fn holds(&self, c: usize, p: *mut u8) -> bool {
        let (Some(n), Some(row)) = (self.n.get(c), self.slots.get(c)) else {
            return false;
        };
        let n = (n.load(R) as usize).min(SLOTS);
        row[..n].iter().any(|s| s.load(R) == p)
    }

    /// Call `f` with every block cached in class `c` (racy on another thread: statistics);
    /// nothing for a class without a cache.
    pub(crate) fn for_each(&self, c: usize, mut f: impl FnMut(*mut u8)) {
        let (Some(n), Some(row)) = (self.n.get(c), self.slots.get(c)) else {
            return;
        };
        let n = (n.load(R) as usize).min(SLOTS);
        row[..n].iter().for_each(|s| f(s.load(R)));
    }

    /// Blocks cached in class `c` (any thread may read it, racily, for statistics); 0 for a
    /// class without a cache.
    pub(crate) fn len(&self, c: usize) -> u32 {
        self.n.get(c).map_or(0, |n| n.load(R))
    }
}
