//! Freeing a block: the sized fast path (a block of this thread's page goes to its cache after
//! one size test, one table load and one descriptor read), the unsized path that finds the
//! block's page, blocks under an open grant (parked until the key is dead), and the exact
//! block-start check that turns a pointer into a block away.
//!
//! Contract: a sized free trusts its layout's class only for a block of this thread's heap
//! with no grant open in its granule; anything else takes [`Core::free`], which reads the
//! page. See the module contract (`mod.rs`).

use super::tcache::{LIMIT, SLOTS};
use super::*;

impl Core {
    /// Free a block of this pool. A pointer the pool did not hand out is ignored.
    ///
    /// # Safety
    /// `p` came from this pool's `alloc`/`alloc_zeroed`/`realloc` and is freed once.
    #[inline]
    pub unsafe fn free(&self, p: *mut u8) {
        // SAFETY: forwarded from the caller.
        unsafe { self.free_found(p) };
    }

    /// [`Core::free`], telling whether `p` was a block of the pool (false: ignored — not in
    /// the reservation, not a live page or run, or not the first byte of a block).
    ///
    /// # Safety
    /// As [`Core::free`].
    #[inline]
    pub(crate) unsafe fn free_found(&self, p: *mut u8) -> bool {
        // SAFETY: checked first.
        if self.table.contains(p) && unsafe { self.table.granted(p) } {
            if self.block_start(p).is_none() {
                return false;
            }
            // SAFETY: forwarded from the caller.
            unsafe { self.free_granted(p) };
            return true;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.free_plain(p) }
    }

    /// The page of the small block or large run that starts at `p`; `None` when `p` is not
    /// the first byte of a carved block of a live page or of a live run.
    #[inline(always)]
    pub(super) fn block_start(&self, p: *const u8) -> Option<&Page> {
        let page = self.table.page_of(p)?;
        let ok = match page.kind.load(Relaxed) {
            SMALL => {
                let off = (p as usize).wrapping_sub(page.start.load(Relaxed));
                let c = page.class.load(Relaxed) as usize;
                class::is_block_offset(off, c)
                    && off < page.capacity.load(Relaxed) as usize * class_size(c)
                    && !page.heap.load(Relaxed).is_null()
            }
            LARGE => page.start.load(Relaxed) == p as usize,
            _ => false,
        };
        ok.then_some(page)
    }

    /// A free of a block in a granule where a grant is open: parked by the pool's quarantine
    /// (`quarantine.rs`) when a grant on the block itself is open, else freed as usual.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn free_granted(&self, p: *mut u8) {
        let q = self.inner().quarantine.get();
        // SAFETY: an installed quarantine is valid and callable from any thread (its
        // installer's contract); `p` is a block being freed.
        if !q.is_some_and(|q| unsafe { (q.park)(q.ctx, p as usize) }) {
            // SAFETY: forwarded from the caller.
            unsafe { self.free_plain(p) };
        }
    }

    /// [`Core::free`] without the quarantine check (for blocks leaving quarantine).
    ///
    /// # Safety
    /// As [`Core::free`].
    #[inline]
    pub(crate) unsafe fn free_plain(&self, p: *mut u8) -> bool {
        // A pointer that starts no block (a stranger's, or inside a block) is ignored.
        let Some(page) = self.block_start(p) else {
            return false;
        };
        if cfg!(feature = "memcheck") {
            // SAFETY: forwarded from the caller.
            unsafe { self.memcheck_in(page, p) };
        }
        if page.kind.load(Relaxed) == SMALL {
            let heap = tls::heap_of(self.id);
            if page.heap.load(Relaxed) == heap {
                // SAFETY: `heap` is this thread's heap and owns the page.
                unsafe { (*heap).free_local(page, p) };
            } else {
                Heap::free_remote(self.inner(), page, p, heap);
            }
        } else {
            // LARGE, starting at `p` (`block_start`).
            self.inner().free_large(page);
        }
        true
    }

    /// Free a block of this pool, given the layout it was allocated (or last reallocated)
    /// with: a small block goes to this thread's cache without a page lookup.
    ///
    /// # Safety
    /// As [`Core::free`], and `layout` is the block's layout.
    ///
    /// # Examples
    /// ```
    /// use std::alloc::Layout;
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd().unwrap();
    /// # let pool = rdma_pool::Pool::new(&pd).unwrap();
    /// let l = Layout::new::<[u64; 4]>();
    /// let p = pool.alloc(l);
    /// // SAFETY: `p` came from this pool with `l`.
    /// unsafe { pool.free_sized(p, l) };
    /// assert_eq!(pool.live_blocks(), 0);
    /// ```
    #[inline]
    pub unsafe fn free_sized(&self, p: *mut u8, layout: Layout) {
        if self.table.contains(p) {
            // SAFETY: forwarded from the caller; `p` is in the reservation.
            unsafe { self.free_sized_in(p, layout) }
        }
    }

    /// [`Core::free_sized`] of a pointer known to be in the pool's reservation (see
    /// [`Core::contains`]): the front end's check is not repeated.
    ///
    /// # Safety
    /// As [`Core::free_sized`], and `self.contains(p)`.
    #[inline(always)]
    pub(crate) unsafe fn free_sized_in(&self, p: *mut u8, layout: Layout) {
        let off = (p as usize).wrapping_sub(self.table.base);
        // SAFETY: forwarded from the caller; `off` is `p`'s offset in the reservation.
        unsafe { self.free_sized_at(p, off, layout) }
    }

    /// [`Core::free_sized_in`] given `p`'s offset in the reservation (a front end that has
    /// computed it for its own range check passes it on). Up to [`TABLE_MAX`] bytes the fast
    /// path takes one size test and one table load; larger cached sizes go out of line.
    ///
    /// # Safety
    /// As [`Core::free_sized`], `self.contains(p)` and `off == p - base` (the reservation's
    /// first address, [`Core::span`]).
    #[inline(always)]
    pub(crate) unsafe fn free_sized_at(&self, p: *mut u8, off: usize, layout: Layout) {
        let size = layout.size();
        if layout.align() <= 8 && size <= TABLE_MAX {
            // SAFETY: forwarded from the caller; `size <= TABLE_MAX`, whose classes cache
            // `SLOTS` blocks (`tcache.rs`).
            return unsafe { self.free_cached(p, off, small_class(size), SLOTS as u32) };
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.free_sized_mid(p, off, layout) }
    }

    /// A sized free the table does not class: cached sizes above [`TABLE_MAX`] take the
    /// cached path with a computed class, the rest [`Core::free`].
    #[inline(never)]
    pub(super) unsafe fn free_sized_mid(&self, p: *mut u8, off: usize, layout: Layout) {
        let size = layout.size();
        if layout.align() <= 8 && size <= CACHED_MAX {
            let c = class_of(size);
            // SAFETY: forwarded from the caller; `c < CACHED_CLASSES`, and its limit.
            return unsafe { self.free_cached(p, off, c, LIMIT[c]) };
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.free(p) }
    }

    /// Free block `p` of a cached class `c` (the class of its layout's size): into this
    /// thread's cache when this thread's heap owns its page and no grant is open in its
    /// granule, else through [`Core::free`].
    ///
    /// # Safety
    /// As [`Core::free_sized_at`], `c < CACHED_CLASSES` is the class of the block's size and
    /// `limit == LIMIT[c]`.
    #[inline(always)]
    pub(super) unsafe fn free_cached(&self, p: *mut u8, off: usize, c: usize, limit: u32) {
        // SAFETY: `off` is in the reservation (the caller's contract).
        let d = unsafe { self.table.desc_at(off) };
        if d.granted.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            // SAFETY: forwarded from the caller.
            return unsafe { self.free_granted(p) };
        }
        let owner = d.heap.load(std::sync::atomic::Ordering::Relaxed);
        if let Some(heap) = tls::heap_in(self.id).filter(|h| h.as_ptr() == owner) {
            let heap = heap.as_ptr();
            if cfg!(feature = "memcheck") {
                // The page's block size, not the size's class: a block resized in place
                // may have kept a larger class (over-aligned at first).
                if let Some(page) = self.table.page_of(p) {
                    // SAFETY: a block of this thread's page being freed.
                    unsafe { self.memcheck_in(page, p) };
                }
            }
            // SAFETY: this thread's heap; `c < CACHED_CLASSES`.
            if unsafe { (*heap).cache_sized(c, p, limit) } {
                return;
            }
            // SAFETY: as above.
            return unsafe { self.free_sized_slow(heap, p, c) };
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.free_outlined(p) }
    }

    /// [`Core::free`] out of line, so the sized fast path stays a leaf function. A block of
    /// another thread's page goes back to that page, never into this thread's cache: two
    /// threads then never end up writing blocks of one cache line (passive false sharing).
    #[inline(never)]
    pub(super) unsafe fn free_outlined(&self, p: *mut u8) {
        // SAFETY: forwarded from the caller.
        unsafe { self.free(p) }
    }

    /// A sized free of a block of this thread's page when its cache is full: flush half the
    /// cache, then cache the block.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn free_sized_slow(&self, heap: *mut Heap, p: *mut u8, c: usize) {
        // SAFETY: this thread's heap (the caller's contract).
        let heap = unsafe { &*heap };
        heap.flush_half(c);
        let cached = heap.cache_sized(c, p, LIMIT[c]);
        debug_assert!(cached, "half the cache was just emptied");
    }
}
