//! Pages: a run of 4 KiB granules cut into blocks of one size class, with a free list for its
//! owning heap and a lock-free list for frees from other threads.
//!
//! Contract: one descriptor per granule of the arena, in a table indexed by
//! `(addr - base) >> GRANULE_SHIFT`; a page's first granule holds its state, the others are
//! `TAIL` and point back to it. The owning heap alone touches `free`, `used`, `capacity` and
//! the queue links (as relaxed loads and stores: plain moves, no atomics in effect); other
//! threads only push onto `thread_free` and raise `notified` (the one free that raised it lowers
//! it again when the page had no owning heap to push it to by then).
//!
//! Invariant (at quiescence, for a page in use):
//! `used + |free| == capacity <= reserved`, and every block is in exactly one of: handed out,
//! `free`, `thread_free` (counted in `used` until the owner collects it), or the uncarved
//! tail `[capacity, reserved)`; live blocks are `used - |thread_free|`.
//! `notified` ⇔ the page is on one heap's `notify` stack, or about to be pushed by the free that
//! raised it; the pop that takes it off lowers it (whoever owns the page by then), so a page is
//! never on two stacks and never keeps the flag once off them.
//! `fresh` ⇒ no block was ever freed into the page, so every byte of a block in `free` is zero
//! except its first word (the link).

use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicUsize, Ordering};

const R: Ordering = Ordering::Relaxed;

/// A free block: its first word links to the next.
#[repr(C)]
pub(crate) struct Block {
    /// The link: atomic (relaxed, a plain move on x86) so that a liveness check from another
    /// thread may walk a page's lists racily without a data race on the links themselves.
    pub(crate) next: AtomicPtr<Block>,
}

/// Granule kinds.
pub(crate) const UNUSED: u8 = 0;
/// Head of a page of small blocks (or an empty page waiting in the pool).
pub(crate) const SMALL: u8 = 1;
/// A granule inside a page; `back` granules after its head.
pub(crate) const TAIL: u8 = 2;
/// Head of a large block (a slab run handed out whole).
pub(crate) const LARGE: u8 = 3;
/// Head of a freed large run kept for reuse.
pub(crate) const LARGE_FREE: u8 = 4;

/// One granule's descriptor (see the module contract). Two cache lines: the first holds what
/// other threads read or write when they free into the page (owner, remote free list, kind,
/// geometry), the second what only the owning thread changes on every allocation and local
/// free (free list, counts, queue links), so a remote free does not contend with the owner's
/// stores.
#[repr(C, align(64))]
pub(crate) struct Page {
    // Line 1: read (and `thread_free`, `notified` written) by any thread.
    pub(crate) heap: AtomicPtr<super::heap::Heap>,
    pub(crate) thread_free: AtomicPtr<Block>,
    /// Link in the owning heap's stack of full pages that got remote frees.
    pub(crate) notify_next: AtomicPtr<Page>,
    /// First byte of the page (or large run).
    pub(crate) start: AtomicUsize,
    /// Bytes of a large run.
    pub(crate) large_len: AtomicUsize,
    pub(crate) block_size: AtomicU32,
    pub(crate) back: AtomicU32,
    /// Live or revoking grants whose block starts in this granule (`grant/`): a free of a
    /// block here takes the quarantine check. Any thread, under the pool's grant ledger.
    pub(crate) granted: AtomicU32,
    pub(crate) class: AtomicU8,
    pub(crate) kind: AtomicU8,
    pub(crate) shift: AtomicU8,
    pub(crate) in_full: AtomicBool,
    pub(crate) notified: AtomicBool,
    /// On a pool list (set by a push, cleared by a take; checked in debug builds).
    pub(crate) listed: AtomicBool,
    _pad: [u8; 2],
    /// Frees counted into an abandoned page by threads without a heap in the pool since it
    /// was (last) abandoned: a hint that may run ahead (`heap.rs`), never behind.
    pub(crate) remote_frees: AtomicU32,
    // Line 2: the owner's.
    pub(crate) free: AtomicPtr<Block>,
    /// Queue links (the heap's class queue, or the pool's free-page list).
    pub(crate) next: AtomicPtr<Page>,
    pub(crate) prev: AtomicPtr<Page>,
    pub(crate) used: AtomicU32,
    pub(crate) capacity: AtomicU32,
    pub(crate) reserved: AtomicU32,
    pub(crate) fresh: AtomicBool,
    /// The insides of the blocks on `free` were given back since a block last joined it
    /// (`heap/trim.rs`): a sweep walks the list of a page only once per batch of frees.
    pub(crate) swept: AtomicBool,
    /// The heap that last abandoned the page (`heap.rs`): only it takes the page back on a
    /// free; checked frees look in its cache. Written by that heap before it abandons.
    pub(crate) former: AtomicPtr<super::heap::Heap>,
}

const _: () = assert!(std::mem::offset_of!(Page, free) == 64 && size_of::<Page>() == 128);

impl Page {
    /// The empty page every heap's class slot starts at: it has no free block, so the fast
    /// path needs no null check and falls into the slow path.
    pub(crate) const fn empty() -> Page {
        Page {
            free: AtomicPtr::new(null_mut()),
            thread_free: AtomicPtr::new(null_mut()),
            heap: AtomicPtr::new(null_mut()),
            next: AtomicPtr::new(null_mut()),
            prev: AtomicPtr::new(null_mut()),
            notify_next: AtomicPtr::new(null_mut()),
            start: AtomicUsize::new(0),
            large_len: AtomicUsize::new(0),
            used: AtomicU32::new(0),
            capacity: AtomicU32::new(0),
            reserved: AtomicU32::new(0),
            block_size: AtomicU32::new(0),
            back: AtomicU32::new(0),
            granted: AtomicU32::new(0),
            class: AtomicU8::new(0),
            kind: AtomicU8::new(UNUSED),
            shift: AtomicU8::new(0),
            in_full: AtomicBool::new(false),
            notified: AtomicBool::new(false),
            listed: AtomicBool::new(false),
            _pad: [0; 2],
            remote_frees: AtomicU32::new(0),
            fresh: AtomicBool::new(false),
            swept: AtomicBool::new(false),
            former: AtomicPtr::new(null_mut()),
        }
    }

    /// Set up an empty page for blocks of `class` owned by `heap`.
    pub(crate) fn init(&self, class: usize, heap: *mut super::heap::Heap) {
        let bs = super::class::class_size(class);
        let bytes = 1usize << self.shift.load(R);
        self.block_size.store(bs as u32, R);
        self.reserved.store((bytes / bs) as u32, R);
        self.capacity.store(0, R);
        self.used.store(0, R);
        self.free.store(null_mut(), R);
        self.swept.store(false, R);
        self.class.store(class as u8, R);
        self.in_full.store(false, R);
        self.next.store(null_mut(), R);
        self.prev.store(null_mut(), R);
        self.heap.store(heap, Ordering::Release);
    }

    /// Carve up to `max_bytes` of fresh blocks (at least one) onto the free list. Returns
    /// false when the page has none left.
    pub(crate) fn extend(&self, max_bytes: usize) -> bool {
        let cap = self.capacity.load(R);
        let reserved = self.reserved.load(R);
        if cap >= reserved {
            return false;
        }
        let bs = self.block_size.load(R) as usize;
        let n = ((max_bytes / bs).max(1) as u32).min(reserved - cap);
        let start = self.start.load(R) + cap as usize * bs;
        let mut next = self.free.load(R);
        for i in (0..n as usize).rev() {
            let b = (start + i * bs) as *mut Block;
            // SAFETY: `b` is an uncarved block of this page: committed arena memory that only
            // the owner touches.
            unsafe { (*b).next.store(next, R) };
            next = b;
        }
        self.free.store(next, R);
        self.swept.store(false, R);
        self.capacity.store(cap + n, R);
        true
    }

    /// Move the blocks other threads freed onto the free list. Returns how many.
    pub(crate) fn collect(&self) -> u32 {
        if self.thread_free.load(R).is_null() {
            return 0;
        }
        let mut list = self.thread_free.swap(null_mut(), Ordering::Acquire);
        let mut n = 0;
        while !list.is_null() {
            // SAFETY: blocks on `thread_free` were pushed whole (link written before the
            // Release CAS that published them) and now belong to the owner.
            let next = unsafe { (*list).next.load(R) };
            unsafe { (*list).next.store(self.free.load(R), R) };
            self.free.store(list, R);
            list = next;
            n += 1;
        }
        self.used.store(self.used.load(R) - n, R);
        self.fresh.store(false, R);
        self.swept.store(false, R);
        n
    }

    /// Push `b` onto `thread_free` (any thread). Returns true when the page was marked full
    /// and nobody had notified its heap yet: the caller must push it on the heap's stack.
    pub(crate) fn push_thread_free(&self, b: *mut Block) -> bool {
        let mut head = self.thread_free.load(R);
        loop {
            // SAFETY: `b` is a block of this page the caller owns until the CAS publishes it.
            unsafe { (*b).next.store(head, R) };
            match self.thread_free.compare_exchange_weak(
                head,
                b,
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        // Pairs with `Heap::mark_full`: either it sees this block, or this sees `in_full`.
        // `notified` is read before the CAS: once a full page was notified, every further free
        // into it would otherwise pay a failing locked RMW on a contended line.
        self.in_full.load(Ordering::SeqCst)
            && !self.notified.load(Ordering::Acquire)
            && self
                .notified
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Blocks on `thread_free` (a racy count, for statistics and teardown).
    pub(crate) fn thread_free_len(&self) -> u32 {
        let mut n = 0;
        let mut b = self.thread_free.load(Ordering::Acquire);
        while !b.is_null() && n < self.reserved.load(R) {
            n += 1;
            // SAFETY: read-only walk used at quiescence (teardown) or for approximate stats.
            b = unsafe { (*b).next.load(R) };
        }
        n
    }

    /// Debug check of the page invariant (owner or quiescent callers).
    pub(crate) fn validate(&self) -> bool {
        let mut free = 0u32;
        let mut b = self.free.load(R);
        while !b.is_null() {
            free += 1;
            if free > self.reserved.load(R) {
                return false;
            }
            // SAFETY: walking the owner's list.
            b = unsafe { (*b).next.load(R) };
        }
        let cap = self.capacity.load(R);
        self.used.load(R) + free == cap && cap <= self.reserved.load(R)
    }
}
