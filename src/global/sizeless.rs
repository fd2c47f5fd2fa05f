//! Size-less operations, for the C library (`free`, `malloc_usable_size`, `realloc`) and other
//! callers that do not keep a layout: the pool finds the block's size itself, and a pointer no
//! part of the pool handed out is ignored and counted.

use super::paths::ErrnoGuard;
use super::*;

/// Size-less frees and sizes: what C's `free`, `realloc` and `malloc_usable_size` need (the
/// C library, `capi/`). A block is found by its address alone: the pool's by its page
/// table, the bootstrap region's by its header, a fallback block by the fallback's registry
/// ([`Fallback::Mmap`]); any other pointer is a stranger's.
impl GlobalPool {
    /// Free `p` without its layout, wherever it came from (pool, bootstrap region,
    /// fallback). Null and pointers no part of this pool handed out — including pointers
    /// into a pool block that are not its first byte — are ignored and the latter counted
    /// ([`GlobalStats::foreign_frees`]; under [`Fallback::System`] those outside the pool are
    /// passed to `free`).
    ///
    /// # Safety
    /// `p` is null, or a block of this `GlobalPool` freed once, or a pointer it did not hand
    /// out that is inside the pool or (under [`Fallback::Mmap`]) anywhere — left alone; under
    /// [`Fallback::System`] a pointer outside the pool must be a `malloc` block.
    ///
    /// # Examples
    /// ```
    /// use std::alloc::{GlobalAlloc, Layout};
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// // SAFETY: a non-zero-size layout; the block is freed once.
    /// unsafe {
    ///     let p = POOL.alloc(Layout::from_size_align(100, 8).unwrap());
    ///     assert!(POOL.usable_size(p).unwrap() >= 100);
    ///     POOL.free_unsized(p);
    /// }
    /// ```
    #[inline]
    pub unsafe fn free_unsized(&self, p: *mut u8) {
        if let Some(pool) = self.owner_of(p) {
            // SAFETY: in the pool's reservation: a block of the pool freed once, or ignored.
            if !unsafe { pool.free_found(p) } {
                Counters::bump(&self.counters().foreign);
            }
            return;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.free_unsized_cold(p) }
    }

    #[cold]
    #[inline(never)]
    unsafe fn free_unsized_cold(&self, p: *mut u8) {
        if p.is_null() {
            return;
        }
        if bootstrap::contains(p) {
            // SAFETY: a live bootstrap block (the caller's contract).
            return unsafe { bootstrap::free(p) };
        }
        // SAFETY: forwarded from the caller.
        if !unsafe { fallback::free_unsized(self.config.fallback, p) } {
            Counters::bump(&self.counters().foreign);
        }
    }

    /// Bytes usable in the live block `p` (at least what was asked for), wherever it came
    /// from; `None` for a pointer this pool did not hand out (or not a block's start).
    ///
    /// # Safety
    /// `p` is null, a live block of this `GlobalPool`, or — under [`Fallback::Mmap`] — a
    /// pointer it did not hand out. (Under [`Fallback::System`] a pointer outside the pool
    /// is taken for a `malloc` block and measured by `malloc_usable_size`; a freed bootstrap
    /// block's header may be gone, so its answer would be made up.)
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::GlobalPool;
    /// use rdma_pool::global::{Fallback, GlobalConfig};
    /// static POOL: GlobalPool = GlobalPool::with_config(GlobalConfig {
    ///     fallback: Fallback::Mmap,
    ///     ..GlobalConfig::DEFAULT
    /// });
    /// // SAFETY: under `Mmap`, a pointer the pool did not hand out is answered `None`.
    /// assert_eq!(unsafe { POOL.usable_size(&0u8) }, None);
    /// ```
    pub unsafe fn usable_size(&self, p: *const u8) -> Option<usize> {
        if let Some(pool) = self.owner_of(p) {
            return pool.usable_size(p);
        }
        if p.is_null() {
            return None;
        }
        if bootstrap::contains(p) {
            // SAFETY: a pointer into the region is one of its live blocks (the caller's
            // contract: strangers are not in the region).
            return Some(unsafe { bootstrap::size_of(p) });
        }
        fallback::size_of(self.config.fallback, p)
            .map(|size| fallback::usable(self.config.fallback, size))
    }

    /// Resize the block `p` to `new_size` bytes without its layout (C's `realloc`): in place
    /// when it can, else moved with its contents, the result aligned to 16 (`max_align_t`).
    /// Null when nothing could be allocated or `p` is not a block of this pool; `p` is then
    /// untouched.
    ///
    /// # Safety
    /// `p` is a live block of this `GlobalPool`, or (under [`Fallback::Mmap`]) a pointer it
    /// did not hand out; on success it must no longer be used (unless the same pointer is
    /// returned). `new_size` is not 0.
    ///
    /// # Examples
    /// ```
    /// use std::alloc::{GlobalAlloc, Layout};
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// // SAFETY: a non-zero-size layout; each block is used until it is resized or freed.
    /// unsafe {
    ///     let p = POOL.alloc(Layout::from_size_align(16, 8).unwrap());
    ///     p.write(42);
    ///     let q = POOL.realloc_unsized(p, 1 << 20);
    ///     assert_eq!(q.read(), 42);
    ///     POOL.free_unsized(q);
    /// }
    /// ```
    pub unsafe fn realloc_unsized(&self, p: *mut u8, new_size: usize) -> *mut u8 {
        let _errno = ErrnoGuard::save();
        let Some(new) = new_size.checked_next_multiple_of(bootstrap::MIN_ALIGN) else {
            return null_mut();
        };
        if let Some(pool) = self.owner_of(p) {
            let Some(old) = pool.usable_size(p) else {
                // Not a block's first byte: a stranger's pointer, refused and counted.
                Counters::bump(&self.counters().foreign);
                return null_mut();
            };
            // SAFETY: a live block of the pool (caller's contract), at most `old` bytes long
            // (align 8: a size class of a multiple of 16 is 16-aligned).
            let q = unsafe { pool.realloc(p, Layout::from_size_align_unchecked(old, 8), new) };
            if !q.is_null() {
                return q;
            }
            // SAFETY: as above; moved wherever the allocation path serves it (degraded).
            return unsafe { self.move_unsized(p, old, new) };
        }
        // SAFETY: forwarded from the caller.
        let Some(old) = (unsafe { self.usable_size(p) }) else {
            return null_mut();
        };
        let Ok(layout) = Layout::from_size_align(old.max(1), bootstrap::MIN_ALIGN) else {
            return null_mut();
        };
        // SAFETY: a live bootstrap or fallback block; the paths of `realloc_cold` find its
        // size again by its address (header, registry), not by `layout`.
        unsafe { self.realloc_cold(p, layout, new) }
    }

    /// Move the block `p` (of `old` usable bytes) to a new block of `new` bytes.
    ///
    /// # Safety
    /// As [`GlobalPool::realloc_unsized`].
    unsafe fn move_unsized(&self, p: *mut u8, old: usize, new: usize) -> *mut u8 {
        // SAFETY: a non-zero size.
        let q = unsafe { self.alloc(Layout::from_size_align_unchecked(new, 8)) };
        if !q.is_null() {
            // SAFETY: distinct live blocks, both valid for the copied length.
            unsafe {
                ptr::copy_nonoverlapping(p, q, old.min(new));
                self.free_unsized(p);
            }
        }
        q
    }
}
