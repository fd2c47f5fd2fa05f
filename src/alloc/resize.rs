//! Resizing a block and asking its size: in place within the block's own class (a small block)
//! or run (a large one that stays more than half used), else moved with its contents; a block
//! under an open grant always moves. See the module contract (`mod.rs`).

use super::*;

impl Core {
    /// Resize a block, in place when its size class or slab run allows.
    ///
    /// # Safety
    /// `p` came from this pool with `layout`; on success it must no longer be used (unless the
    /// same pointer is returned). On failure (null) `p` is untouched.
    pub unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A block under an open grant is never resized in place (a shrink would hand granted
        // bytes back): it moves, and its free parks it.
        // SAFETY: `page_of` checks `contains` first.
        let page = self
            .table
            .page_of(p)
            .filter(|_| !unsafe { self.table.granted(p) });
        if let Some(page) = page {
            let keep = match page.kind.load(Relaxed) {
                // In place only within the block's own class, so that a later sized free
                // (which trusts the class of the size) puts it back where it belongs.
                SMALL => {
                    let c = page.class.load(Relaxed) as usize;
                    new_size <= class_size(c) && (layout.align() > 8 || class_of(new_size) == c)
                }
                LARGE if page.start.load(Relaxed) == p as usize => {
                    let cap = page.large_len.load(Relaxed) - memcheck::LARGE_GUARD;
                    new_size <= cap && new_size > cap / 2
                }
                _ => false,
            };
            if keep {
                if cfg!(feature = "memcheck") {
                    self.memcheck_resized(p);
                }
                return p;
            }
        }
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return null_mut();
        };
        let q = self.alloc(new_layout);
        if !q.is_null() {
            // SAFETY: both blocks are valid for the copied length and do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                self.free(p);
            }
        }
        q
    }

    /// Resize a block to `new` (size and alignment), as allocator-api2's `grow`/`shrink`: in
    /// place when the block allows and is aligned for `new`, else moved with its contents.
    ///
    /// # Safety
    /// As [`Core::realloc`], with `old` the block's layout.
    ///
    /// # Examples
    /// ```
    /// use std::alloc::Layout;
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd().unwrap();
    /// # let pool = rdma_pool::Pool::new(&pd).unwrap();
    /// let old = Layout::from_size_align(24, 8).unwrap();
    /// let p = pool.alloc(old);
    /// // SAFETY: `p` came from this pool with `old`.
    /// let q = unsafe { pool.resize(p, old, Layout::from_size_align(24, 256).unwrap()) };
    /// assert_eq!(q as usize % 256, 0);
    /// # unsafe { pool.free(q) };
    /// ```
    pub unsafe fn resize(&self, p: *mut u8, old: Layout, new: Layout) -> *mut u8 {
        if p as usize % new.align() == 0 {
            // Resized as a block of `new`'s alignment: kept in place only where a later free
            // with `new` finds its class (a block over-aligned at first, shrunk to a small
            // alignment, moves), and moved to a block aligned for `new`.
            if let Ok(as_new) = Layout::from_size_align(old.size(), new.align()) {
                // SAFETY: forwarded from the caller; the block is aligned for `new`.
                return unsafe { self.realloc(p, as_new, new.size()) };
            }
        }
        let q = self.alloc(new);
        if !q.is_null() {
            // SAFETY: distinct blocks, both valid for the copied length.
            unsafe {
                std::ptr::copy_nonoverlapping(p, q, old.size().min(new.size()));
                self.free(p);
            }
        }
        q
    }

    /// [`Core::resize`] to a larger `new`, the bytes past `old.size()` zeroed (allocator-api2's
    /// `grow_zeroed`).
    ///
    /// # Safety
    /// As [`Core::resize`], and `new.size() >= old.size()`.
    pub unsafe fn resize_zeroed(&self, p: *mut u8, old: Layout, new: Layout) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        let q = unsafe { self.resize(p, old, new) };
        if !q.is_null() {
            // SAFETY: the block holds `new.size()` bytes; zero what was not copied.
            unsafe { std::ptr::write_bytes(q.add(old.size()), 0, new.size() - old.size()) };
        }
        q
    }

    /// Bytes usable in the block at `p` (at least what was asked for); `None` for a pointer
    /// that is not the start of a live large block or inside a small-block page.
    pub fn usable_size(&self, p: *const u8) -> Option<usize> {
        let page = self.block_start(p)?;
        match page.kind.load(Relaxed) {
            SMALL => Some(page.block_size.load(Relaxed) as usize),
            LARGE if page.start.load(Relaxed) == p as usize => {
                Some(page.large_len.load(Relaxed) - memcheck::LARGE_GUARD)
            }
            _ => None,
        }
    }

    /// `(first byte, usable bytes)` of the live block holding `addr` (any byte of it), for
    /// grants; `None` outside live pages and runs.
    pub(crate) fn block_span(&self, addr: usize) -> Option<(usize, usize)> {
        let page = self.inner().page_of(addr as *const u8)?;
        match page.kind.load(Relaxed) {
            SMALL if !page.heap.load(Relaxed).is_null() => {
                let (start, bs) = (
                    page.start.load(Relaxed),
                    page.block_size.load(Relaxed) as usize,
                );
                let i = (addr - start) / bs;
                (i < page.capacity.load(Relaxed) as usize).then_some((start + i * bs, bs))
            }
            LARGE => {
                let (start, len) = (page.start.load(Relaxed), page.large_len.load(Relaxed));
                let len = len - memcheck::LARGE_GUARD;
                (addr - start < len).then_some((start, len))
            }
            UNUSED => self.large_run_around(addr),
            _ => None,
        }
    }

    /// The live large run holding `addr`, whose head (slab aligned) lies below: a large run
    /// marks its head granule only, the others stay `UNUSED` (cold: grants only).
    #[cold]
    pub(super) fn large_run_around(&self, addr: usize) -> Option<(usize, usize)> {
        let base = self.inner().base;
        let mut at = addr & !(SLAB - 1);
        while at >= base {
            let d = self.inner().desc(at);
            match d.kind.load(Relaxed) {
                UNUSED => at = at.checked_sub(SLAB)?,
                LARGE => {
                    let (start, len) = (d.start.load(Relaxed), d.large_len.load(Relaxed));
                    let len = len - memcheck::LARGE_GUARD;
                    return (start == at && addr - start < len).then_some((start, len));
                }
                _ => return None,
            }
        }
        None
    }
}
