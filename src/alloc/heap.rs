//! Heaps: one per thread and pool, owning pages of each size class. The allocation and
//! same-thread free fast paths are a few plain loads and stores, no atomic read-modify-write;
//! everything else is `#[cold]`.
//!
//! Contract: only the thread that claimed a heap (see `tls.rs`) calls its methods, except
//! `push_notify`, which any thread may call for a page of this heap. A page is in its class
//! queue (`queue[c]`, doubly linked, `current[c]` first) unless it is full. The first
//! [`RETAIN`] full pages of a class stay with the heap (`in_full`) and return to the queue when
//! the owner frees into them or pops them from `notify` (a remote thread freed into them).
//! Further full pages are **abandoned** (their owner becomes [`ABANDONED`]): the owner no
//! longer touches them until it frees into one itself, which takes it back (one CAS on the
//! page's owner). Other threads never adopt such a page (a thread that only frees would then
//! own pages it never collects): their frees count themselves (`remote_frees`), and the one
//! that completes the page claims it just long enough to collect it and retire it. So blocks
//! other threads free into the pages of a thread that stopped allocating (a parked producer)
//! come back without it, as mimalloc v3 reclaims abandoned pages on free into their own
//! thread only.
//!
//! Invariant: `current[c]` is `&EMPTY` or the head of `queue[c]` (or, for a sparse class, a
//! page of its leader's queue: `heap/sparse.rs`); every page in `queue[c]` has
//! class `c`, belongs to this heap and is not `in_full`; `full[c]` counts this heap's `in_full`
//! pages of class `c` (at most [`RETAIN`]); an abandoned page is in no queue and not `in_full`.
//!
//! Ownership hand-over (Dekker, all `SeqCst`): the abandoning owner stores `ABANDONED` and then
//! loads `thread_free`; a remote free pushes onto `thread_free` and then loads the owner. One
//! of them sees the other, so a block freed while the page changed hands is never left on an
//! abandoned page that nobody will look at.
//!
//! The remote path (frees from other threads, notification, reclaiming abandoned pages) is in
//! `heap/remote.rs`.

use super::class::CLASSES;
use super::page::{Block, Page};
use super::pool::PoolInner;
use super::tcache::{CACHED_CLASSES, LIMIT, SLOTS, TCaches};
use crossbeam::utils::CachePadded;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering};

mod provisioning;
mod remote;
mod shared;
mod sparse;
mod trim;
mod unowned;

pub(crate) use provisioning::PROVISIONING;
pub(crate) use shared::{MAX_SHARED, SHARED};

const R: Ordering = Ordering::Relaxed;

static EMPTY: Page = Page::empty();

fn empty() -> *mut Page {
    &EMPTY as *const Page as *mut Page
}

/// Fresh blocks carved at a time.
const EXTEND_BYTES: usize = 4096;

/// Frees between two looks at the pool's purge clock (see [`Heap::tick`]).
const TICK: u32 = 1 << 12;

/// Full pages per class a heap keeps (`in_full`); it abandons the others.
pub(crate) const RETAIN: u32 = 2;

/// The owner of an abandoned page (never a heap's address: nothing is read through it).
pub(crate) const ABANDONED: *mut Heap = std::ptr::without_provenance_mut(1);

/// The owner of an abandoned page while a thread without a heap in the pool collects it.
const CLAIMED: *mut Heap = std::ptr::without_provenance_mut(2);

/// Whether `h` is a heap (not null, [`ABANDONED`] or a claim in progress).
pub(crate) fn is_heap(h: *mut Heap) -> bool {
    h as usize > CLAIMED as usize
}

/// A thread's heap in one pool. Laid out in this order and aligned to 128 bytes (the
/// prefetch pair of lines): what only the owner writes on every allocation and free comes
/// first, the stack other threads push to has lines of its own, and no two heaps of the array
/// share a line — else every free of two threads' fast paths would bounce one line between
/// their cores (`collections`: 2× slower).
#[repr(C, align(128))]
pub(crate) struct Heap {
    /// Frees left until the next [`Heap::tick`] looks whether a purge is due (owner-only).
    tick: AtomicU32,
    tcache: TCaches,
    current: [AtomicPtr<Page>; CLASSES],
    queue: [AtomicPtr<Page>; CLASSES],
    /// `in_full` pages of each class (owner-only).
    full: [AtomicU32; CLASSES],
    /// Pages of each class taken and not retired by this heap (owner-only, saturating; an
    /// abandoned page stays counted): what the next page of the class is sized to.
    held: [AtomicU8; CLASSES],
    /// Slow-path turns each class was served from its leader's page (`heap/sparse.rs`;
    /// owner-only).
    aliased: [AtomicU8; CLASSES],
    /// Full pages that received remote frees (a lock-free stack through `notify_next`).
    notify: CachePadded<AtomicPtr<Page>>,
    /// Token of the owning thread; 0 when unclaimed.
    pub(crate) owner: AtomicU64,
    /// `1 +` index of the next heap on the pool's free stack (`heaps.rs`).
    pub(crate) next_free: AtomicU32,
    /// The fork generation of the process when the heap was claimed (`sys/atfork.rs`).
    pub(crate) generation: AtomicU64,
    pub(crate) initialised: AtomicBool,
    pub(crate) pool: AtomicPtr<PoolInner>,
    /// Set by other threads ([`Heap::request_trim`]): the owner gives back what it keeps for
    /// itself at its next free or slow path.
    trim: AtomicBool,
    /// The purge's last look at this heap: `tick << 32 | ms` (`purge.rs`, quiet heaps).
    pub(crate) seen: AtomicU64,
    /// Bytes this heap's thread was served from the pool's shared heaps (`heap/shared.rs`;
    /// owner-only; `u32::MAX` for a heap no thread owns).
    young: AtomicU32,
}

// No two heaps share a line, and the stack other threads push to shares none with the owner's.
const _: () = assert!(
    align_of::<Heap>() >= 128
        && size_of::<Heap>() % 128 == 0
        && std::mem::offset_of!(Heap, notify) % 128 == 0
        && std::mem::offset_of!(Heap, full) + size_of::<[AtomicU32; CLASSES]>()
            <= std::mem::offset_of!(Heap, notify)
);

impl Heap {
    /// Whether this heap belongs to a thread of a parent process: in a child of `fork`, a
    /// heap owned by a thread other than the forking one (whose pages that thread may have
    /// left half-updated on a lock-free fast path). The child never uses, collects nor checks
    /// such a heap's pages; frees into them are pushed to their remote lists and stay there.
    pub(crate) fn orphaned(&self) -> bool {
        let owner = self.owner.load(R);
        owner != 0
            && self.generation.load(R) != crate::sys::atfork::generation()
            && owner != super::tls::token()
    }

    /// Point every class at the empty page (a zeroed heap is set up once, when first claimed);
    /// a heap claimed again first hands back the pages its last owner kept that emptied since.
    pub(crate) fn init(&self, pool: *const PoolInner) {
        self.generation.store(crate::sys::atfork::generation(), R);
        if self.initialised.load(Ordering::Acquire) {
            self.sweep();
            return;
        }
        for c in 0..CLASSES {
            self.current[c].store(empty(), R);
            self.queue[c].store(null_mut(), R);
        }
        self.pool.store(pool as *mut PoolInner, R);
        self.initialised.store(true, Ordering::Release);
    }

    fn pool(&self) -> &PoolInner {
        // SAFETY: a heap lives inside its pool and is used only while the pool lives.
        unsafe { &*self.pool.load(R) }
    }

    fn me(&self) -> *mut Heap {
        self as *const Heap as *mut Heap
    }

    /// Allocate a block of class `c`: the fast path (the thread cache, then the page), then
    /// the slow path.
    #[inline(always)]
    pub(crate) fn alloc(&self, c: usize) -> *mut u8 {
        let p = self.alloc_fast(c);
        if !p.is_null() {
            return p;
        }
        self.alloc_slow(c)
    }

    /// The fast path alone: a block of class `c` from the thread cache, else from the current
    /// page's free list; null when both are empty. It calls nothing, so a caller that takes
    /// its slow path as a tail call saves no register.
    #[inline(always)]
    pub(crate) fn alloc_fast(&self, c: usize) -> *mut u8 {
        if c < CACHED_CLASSES {
            // SAFETY: `c < CACHED_CLASSES`.
            if let Some(p) = unsafe { self.tcache.pop(c) } {
                return p;
            }
        }
        self.pop_page(c)
    }

    /// [`Heap::alloc_fast`] of a class known to be cached: no test of the class.
    ///
    /// # Safety
    /// `c < CACHED_CLASSES`.
    #[inline(always)]
    pub(crate) unsafe fn alloc_cached(&self, c: usize) -> *mut u8 {
        debug_assert!(c < CACHED_CLASSES);
        // SAFETY: `c < CACHED_CLASSES` (the caller's contract).
        if let Some(p) = unsafe { self.tcache.pop(c) } {
            return p;
        }
        self.pop_page(c)
    }

    /// A block of class `c` from its current page's free list; null when it is empty.
    #[inline(always)]
    fn pop_page(&self, c: usize) -> *mut u8 {
        // SAFETY: `c < CLASSES` (callers compute it with `class_of`/`class_for`), and
        // `current[c]` always points at a live page or at `EMPTY`.
        let page = unsafe { &*self.current.get_unchecked(c).load(R) };
        let b = page.free.load(R);
        if b.is_null() {
            return null_mut();
        }
        // SAFETY: `b` is on this page's free list, which only this thread touches.
        page.free.store(unsafe { (*b).next.load(R) }, R);
        page.used.store(page.used.load(R) + 1, R);
        b.cast()
    }

    /// Allocate a block of class `c` from its current page (the slow path when it is empty).
    #[inline(always)]
    fn alloc_page(&self, c: usize) -> *mut u8 {
        let b = self.pop_page(c);
        if !b.is_null() {
            return b;
        }
        self.alloc_slow(c)
    }

    /// Like [`Heap::alloc`], the block zeroed (touching fresh memory only for its link word).
    pub(crate) fn alloc_zeroed(&self, c: usize, len: usize) -> *mut u8 {
        // Not from the thread cache: its blocks are dirty, a fresh page's are not.
        let p = self.alloc_page(c);
        if p.is_null() {
            return p;
        }
        // SAFETY: `current[c]` is the page the block came from (alloc leaves it current).
        let page = unsafe { &*self.current[c].load(R) };
        // SAFETY: the block is ours and `len <= class_size(c)` bytes long.
        unsafe {
            if page.fresh.load(R) {
                p.cast::<usize>().write(0);
            } else {
                super::memcheck::unpoison(p, len);
                std::ptr::write_bytes(p, 0, len);
            }
        }
        p
    }

    /// Count a free; every [`TICK`] frees, purge what has been idle for the pool's delay. So
    /// memory freed before a stretch of fast-path-only churn still goes back on time.
    #[inline(always)]
    pub(crate) fn tick(&self) {
        // Decrement, then test the sign: the decrement's flags are the test, and a heap whose
        // counter starts at 0 (a fresh one) looks at once.
        let t = self.tick.load(R).wrapping_sub(1);
        self.tick.store(t, R);
        if (t as i32) <= 0 {
            self.tick_slow();
        }
    }

    #[cold]
    #[inline(never)]
    fn tick_slow(&self) {
        self.tick.store(TICK, R);
        if self.trim.load(Ordering::Acquire) {
            self.trim_now();
        } else {
            self.retire_empty();
        }
        self.pool().maybe_purge();
    }

    /// Frees counted since the last tick, as the owner last stored them (any thread, racy:
    /// the purge compares two looks to tell a quiet heap).
    pub(crate) fn ticks(&self) -> u32 {
        self.tick.load(R)
    }

    /// Free a block of a page this heap owns: the fast path (into the thread cache).
    #[inline(always)]
    pub(crate) fn free_local(&self, page: &Page, p: *mut u8) {
        self.tick();
        let c = page.class.load(R) as usize;
        if c < CACHED_CLASSES {
            // SAFETY: `c < CACHED_CLASSES`, and its limit.
            if unsafe { self.tcache.push(c, p, LIMIT[c]) } {
                return;
            }
            // The cache is full: the block's page is known here (unlike a sized free's), so
            // the block goes straight back to it — no flush, no page lookups (a batch of
            // frees larger than the cache, C's `free` pattern, costs one page write each).
        }
        self.free_to_page(page, p);
    }

    /// Return half of class `c`'s cache to their pages.
    #[cold]
    #[inline(never)]
    pub(crate) fn flush_half(&self, c: usize) {
        self.flush(c, SLOTS / 2);
    }

    /// Return `n` cached blocks of class `c` to their pages (all of this heap: only blocks of
    /// its own pages are cached).
    fn flush(&self, c: usize, n: usize) {
        if c >= CACHED_CLASSES {
            return;
        }
        let table = self.pool().table;
        for _ in 0..n {
            // SAFETY: checked above.
            let Some(q) = (unsafe { self.tcache.pop(c) }) else {
                return;
            };
            if let Some(page) = table.page_of(q) {
                if std::ptr::eq(page.heap.load(R), self) {
                    self.free_to_page(page, q);
                } else {
                    Heap::free_remote(self.pool(), page, q, self.me());
                }
            }
        }
    }

    /// Cache a block of class `c` of one of this heap's pages, freed with its size: the
    /// sized-free fast path. False when the cache holds `limit` (`LIMIT[c]`) blocks.
    #[inline(always)]
    pub(crate) fn cache_sized(&self, c: usize, p: *mut u8, limit: u32) -> bool {
        // SAFETY: callers pass `c < CACHED_CLASSES` and its limit.
        if !unsafe { self.tcache.push(c, p, limit) } {
            return false;
        }
        // Counted after the push: the tick's rare call is then the function's last.
        self.tick();
        true
    }

    /// Whether block `p` of class `c` sits in this heap's cache (exact on the owning thread;
    /// racy, but memory-safe, on another: the slots are atomics).
    pub(crate) fn caches(&self, c: usize, p: *mut u8) -> bool {
        // A block of a class-`c` page may sit in the cache of any class up to `c`: freed with
        // a smaller size (a sparse class's block on its leader's page, `heap/sparse.rs`; a
        // block `realloc` kept in place).
        (0..=c).any(|k| self.tcache.holds(k, p))
    }

    /// Call `f` with every block in this heap's cache of class `c` (racy on another thread:
    /// statistics).
    pub(crate) fn for_each_cached(&self, c: usize, f: impl FnMut(*mut u8)) {
        self.tcache.for_each(c, f);
    }

    /// Blocks of class `c` in this heap's cache (racy; statistics).
    pub(crate) fn cached(&self, c: usize) -> u32 {
        self.tcache.len(c)
    }

    /// Put a block back on its page's free list.
    #[inline(always)]
    fn free_to_page(&self, page: &Page, p: *mut u8) {
        let b = p.cast::<Block>();
        // SAFETY: the block belongs to `page`, owned by this heap.
        unsafe { (*b).next.store(page.free.load(R), R) };
        page.free.store(b, R);
        let used = page.used.load(R) - 1;
        page.used.store(used, R);
        page.fresh.store(false, R);
        page.swept.store(false, R);
        if used == 0 || page.in_full.load(R) {
            // An emptied current page stays (the alloc/free pair case): decide that inline.
            let c = page.class.load(R) as usize;
            // SAFETY: a page's class is below CLASSES.
            let current = unsafe { self.current.get_unchecked(c) }.load(R);
            if page.in_full.load(R) || !std::ptr::eq(current, page) {
                self.free_slow(page);
            }
        }
    }

    /// A page became empty, or a full page got a block back.
    #[cold]
    fn free_slow(&self, page: &Page) {
        let c = page.class.load(R) as usize;
        let pp = page as *const Page as *mut Page;
        if page.in_full.load(R) {
            if page.notified.load(Ordering::Acquire) {
                // It is (or is about to be) on the notify stack: that pop requeues it.
                return;
            }
            page.in_full.store(false, R);
            self.full[c].fetch_sub(1, R);
            self.enqueue(c, pp);
        }
        if page.used.load(R) == 0
            && self.current[c].load(R) != pp
            && !page.notified.load(Ordering::Acquire)
        {
            self.dequeue(c, pp);
            self.retire(c, page);
            self.pool().maybe_purge();
        }
    }

    /// Put `p` at the head of `queue[c]`, making it current. The page it replaces as current
    /// is retired when it is empty: an emptied page stays only while it is current (the
    /// alloc/free pair case), never in the queue behind another.
    fn enqueue(&self, c: usize, p: *mut Page) {
        // An alias of the leader's page is not the class's own current page.
        self.unalias(c);
        let old = self.current[c].load(R);
        self.push_front(c, p);
        if old != empty() && old != p {
            // SAFETY: the old current page is a page of this heap's queue.
            self.retire_if_empty(c, unsafe { &*old });
        }
    }

    /// Dequeue and retire page `page` of `queue[c]` if nothing of it is handed out; true when
    /// it was.
    fn retire_if_empty(&self, c: usize, page: &Page) -> bool {
        page.collect();
        let empty = page.used.load(R) == 0
            && !page.in_full.load(R)
            && !page.notified.load(Ordering::Acquire);
        if empty {
            self.dequeue(c, page as *const Page as *mut Page);
            self.retire(c, page);
        }
        empty
    }

    /// Hand an empty page of class `c` of this heap back to the pool.
    fn retire(&self, c: usize, page: &Page) {
        let held = self.held[c].load(R);
        self.held[c].store(held.saturating_sub(1), R);
        self.pool().retire_page(page);
    }

    fn push_front(&self, c: usize, p: *mut Page) {
        // SAFETY: `p` is a page of this heap; links are owner-only.
        let page = unsafe { &*p };
        let head = self.queue[c].load(R);
        page.prev.store(null_mut(), R);
        page.next.store(head, R);
        if !head.is_null() {
            // SAFETY: as above.
            unsafe { (*head).prev.store(p, R) };
        }
        self.queue[c].store(p, R);
        self.current[c].store(p, R);
    }

    fn dequeue(&self, c: usize, p: *mut Page) {
        // SAFETY: `p` is in `queue[c]` of this heap.
        let page = unsafe { &*p };
        debug_assert_eq!(
            usize::from(page.class.load(R)),
            c,
            "a page out of another queue"
        );
        let (prev, next) = (page.prev.load(R), page.next.load(R));
        if prev.is_null() {
            self.queue[c].store(next, R);
        } else {
            // SAFETY: a page of the same queue.
            unsafe { (*prev).next.store(next, R) };
        }
        if !next.is_null() {
            // SAFETY: as above.
            unsafe { (*next).prev.store(prev, R) };
        }
        if self.current[c].load(R) == p {
            let head = self.queue[c].load(R);
            self.current[c].store(if head.is_null() { empty() } else { head }, R);
        }
        self.drop_aliases(c, p);
    }

    /// Mark a page full, unless a remote free raced in (then the caller retries it).
    fn mark_full(&self, page: &Page) -> bool {
        page.in_full.store(true, Ordering::SeqCst);
        if page.thread_free.load(Ordering::SeqCst).is_null() {
            return true;
        }
        page.in_full.store(false, R);
        false
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, c: usize) -> *mut u8 {
        if self.trim.load(Ordering::Acquire) {
            self.trim_now();
        }
        self.pool().maybe_purge();
        self.drain_notify();
        self.unalias(c);
        if self.current[c].load(R) == empty() {
            if let Some(b) = self.alloc_shared(c) {
                return b;
            }
            if let Some(b) = self.alloc_sparse(c) {
                return b;
            }
        }
        loop {
            let p = self.current[c].load(R);
            if p == empty() {
                break;
            }
            // SAFETY: a page in this heap's queue.
            let page = unsafe { &*p };
            page.collect();
            if page.free.load(R).is_null() {
                page.extend(EXTEND_BYTES);
            }
            if !page.free.load(R).is_null() {
                return self.alloc_page(c);
            }
            if self.full[c].load(R) < RETAIN {
                if self.mark_full(page) {
                    self.dequeue(c, p);
                    self.full[c].fetch_add(1, R);
                }
            } else if self.tcache.len(c) > 0 {
                // Cached blocks of the class (an `alloc_zeroed` skips the cache) go back to
                // their pages first: an abandoned page's blocks are in no cache.
                self.flush(c, SLOTS);
            } else {
                self.dequeue(c, p);
                if !self.abandon(page) {
                    self.enqueue(c, p);
                }
            }
        }
        let held = self.held[c].load(R);
        let Some(page) = self.pool().take_page(c, self.me(), u32::from(held)) else {
            return null_mut();
        };
        self.held[c].store(held.saturating_add(1), R);
        self.enqueue(c, page as *const Page as *mut Page);
        page.extend(EXTEND_BYTES);
        self.alloc_page(c)
    }

    /// Hand every page back: empty ones to the pool, the others stay with the heap for its next
    /// owner (called when the owning thread leaves, under the pool registry lock).
    pub(crate) fn release(&self) {
        self.trim.store(false, Ordering::Release);
        for c in 0..CACHED_CLASSES {
            self.flush(c, SLOTS);
        }
        self.sweep();
    }

    /// Collect every page's remote frees and hand the pages then empty back to the pool; the
    /// others stay (called by the heap's owner: a thread leaving it, or one claiming it). The
    /// memory of medium pages and free medium blocks goes back meanwhile (`trim.rs`:
    /// [`DISCARD_BLOCK_MIN`](trim::DISCARD_BLOCK_MIN)).
    fn sweep(&self) {
        let mut budget = trim::SWEEP_DISCARDS;
        self.drain_notify();
        for c in 0..CLASSES {
            let mut p = self.queue[c].load(R);
            let mut kept = self.full[c].load(R);
            while !p.is_null() {
                // SAFETY: a page of this heap.
                let page = unsafe { &*p };
                let next = page.next.load(R);
                page.collect();
                if page.used.load(R) == 0 && !page.notified.load(Ordering::Acquire) {
                    self.dequeue(c, p);
                    self.discard_empty(page, &mut budget);
                    self.retire(c, page);
                } else {
                    self.discard_free_blocks(page, &mut budget);
                    kept += 1;
                }
                p = next;
            }
            // The next thread to claim the heap sizes its pages by the ones that stay.
            self.held[c].store(kept.min(u32::from(u8::MAX)) as u8, R);
            self.aliased[c].store(0, R);
        }
    }
}
