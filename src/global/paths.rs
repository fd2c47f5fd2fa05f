//! The paths of `GlobalAlloc`: the fast path (the ready pool's own, after one thread-local
//! read), and the cold paths that initialise, provision, degrade (counted, never a panic) and
//! tell pool, bootstrap and system blocks apart by address. See the module contract (`mod.rs`).

use super::*;

impl GlobalPool {
    /// The fast path: a ready pool's own, else the cold path.
    #[inline(always)]
    pub(super) fn alloc_fast(&self, layout: Layout, zero: bool) -> *mut u8 {
        if !zero {
            let p = Core::alloc_fast_in(self.fast_id.load(Relaxed), layout);
            if !p.is_null() {
                return p;
            }
        }
        // The last call: the fast path above saves no register for it.
        self.alloc_cold(layout, zero)
    }

    /// Serve `layout` when the fast path could not: the ready pool's slow path (asked once: a
    /// refusal is counted once), else initialise, provision, degrade.
    #[inline(never)]
    pub(super) fn alloc_cold(&self, layout: Layout, zero: bool) -> *mut u8 {
        if !zero {
            let p = Core::alloc_fast_mid(self.fast_id.load(Relaxed), layout);
            if !p.is_null() {
                return p;
            }
        }
        // The slow paths make system calls (commit, madvise, registration) whose failures may
        // be handled and leave `errno` set: a successful allocation leaves it as it found it
        // (C's `malloc` is this path too).
        let _errno = ErrnoGuard::save();
        let ready = self.hot();
        // A thread that provisions has no heap in view (hidden), so the mark's own thread-local
        // (a call of `__tls_get_addr` in the C library) is read only by threads without one.
        if !Core::heap_in_view(self.fast_id.load(Relaxed)) && provision::active() {
            // The NIC layer's bookkeeping, never in this thread's heap (hidden meanwhile): it
            // lives as long as what it registers (`alloc/heap/provisioning.rs`). The bootstrap
            // region, then `malloc`: outside registered memory, so no record keeps a region.
            // Where `malloc` is this pool (the C library), small records go to the pool's
            // provisioning heap first (the fallback there maps a page per block).
            if let Some(pool) = ready.filter(|_| self.config.fallback == Fallback::Mmap) {
                let p = pool.alloc_provisioning(layout, zero);
                if !p.is_null() {
                    Counters::bump(&self.counters().reentrant);
                    Counters::bump(&self.counters().provisioning);
                    return p;
                }
            }
            return self.alloc_reentrant(layout, zero);
        }
        if let Some(pool) = ready {
            let p = pool.alloc_with(layout, zero);
            if !p.is_null() {
                return p;
            }
        }
        let mut why = DegradeReason::PoolRefused;
        if ready.is_none() {
            match self.get_cold() {
                Some(pool) => {
                    let p = pool.alloc_with(layout, zero);
                    if !p.is_null() {
                        return p;
                    }
                }
                None if self.state.load(Acquire) == FAILED => why = DegradeReason::InitFailed,
                None => why = DegradeReason::InitPending,
            }
        }
        self.alloc_degraded(layout, zero, why)
    }

    /// An allocation made while this thread calls into the NIC: bootstrap region, then malloc.
    fn alloc_reentrant(&self, layout: Layout, zero: bool) -> *mut u8 {
        Counters::bump(&self.counters().reentrant);
        let p = bootstrap::alloc(layout, zero);
        if !p.is_null() {
            return p;
        }
        Counters::bump(&self.counters().overflow);
        // SAFETY: `layout` has a non-zero size (the `GlobalAlloc` contract).
        unsafe { fallback::fallback_alloc(self.config.fallback, layout, zero) }
    }

    /// The pool could not serve `layout`: the system allocator, or null under `Fail`.
    fn alloc_degraded(&self, layout: Layout, zero: bool, why: DegradeReason) -> *mut u8 {
        self.counters().degraded_for(why);
        if self.config.on_failure == OnFailure::Fail {
            Counters::bump(&self.counters().failed);
            return null_mut();
        }
        // SAFETY: `layout` has a non-zero size (the `GlobalAlloc` contract).
        let p = unsafe { fallback::fallback_alloc(self.config.fallback, layout, zero) };
        if p.is_null() {
            // The system refused it too (larger than memory, say): a failure, not a
            // degradation — nothing was served.
            Counters::bump(&self.counters().failed);
            return p;
        }
        Counters::bump(&self.counters().degraded);
        self.counters()
            .degraded_bytes
            .fetch_add(layout.size() as u64, Relaxed);
        p
    }

    /// Free a block that is not the pool's: a bootstrap or a system block.
    #[cold]
    #[inline(never)]
    unsafe fn dealloc_cold(&self, p: *mut u8, layout: Layout) {
        if bootstrap::contains(p) {
            // SAFETY: a live bootstrap block (the caller's contract).
            unsafe { bootstrap::free(p) };
        } else {
            // SAFETY: neither pool nor bootstrap: a fallback block with `layout`.
            unsafe { fallback::fallback_dealloc(self.config.fallback, p, layout) };
        }
    }

    /// `realloc` of a block the fast path did not handle.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn realloc_cold(
        &self,
        p: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return null_mut();
        };
        let in_pool = self.owner_of(p).is_some();
        // A bootstrap block stays put only while provisioning; otherwise it moves to the pool.
        // SAFETY: a live bootstrap block when it is in the region (the caller's contract).
        if bootstrap::contains(p)
            && provision::active()
            && unsafe { bootstrap::resize_in_place(p, new_size) }
        {
            return p;
        }
        if !in_pool && !bootstrap::contains(p) && provision::active() {
            // A system block while provisioning: stay there.
            // SAFETY: forwarded from the caller; a fallback block with `layout`.
            return unsafe {
                fallback::fallback_realloc(self.config.fallback, p, layout, new_size)
            };
        }
        // Move: into the pool when possible (healing a degraded block), else wherever the
        // allocation path sends it.
        // SAFETY: `new` has a non-zero size (the caller's contract).
        let q = unsafe { self.alloc(new) };
        if !q.is_null() {
            if !in_pool && !bootstrap::contains(p) && self.keys_of(q).is_some() {
                Counters::bump(&self.counters().healed);
            }
            // SAFETY: distinct live blocks, both valid for the copied length.
            unsafe {
                ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                self.dealloc(p, layout);
            }
        }
        q
    }
}

/// Restores this thread's `errno` when dropped.
pub(super) struct ErrnoGuard(*mut libc::c_int, libc::c_int);

impl ErrnoGuard {
    pub(super) fn save() -> ErrnoGuard {
        // SAFETY: `__errno_location` returns this thread's `errno`, valid for the thread's life.
        let e = unsafe { libc::__errno_location() };
        // SAFETY: as above.
        ErrnoGuard(e, unsafe { *e })
    }
}

impl Drop for ErrnoGuard {
    fn drop(&mut self) {
        // SAFETY: as in `save`, on the same thread.
        unsafe { *self.0 = self.1 };
    }
}

// SAFETY: every block handed out is valid for its layout until freed: pool blocks (aligned,
// never straddling registrations), bootstrap blocks (disjoint bump ranges of a static) and
// system blocks; `dealloc`/`realloc` route each pointer back to where it came from by address.
unsafe impl GlobalAlloc for GlobalPool {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.alloc_fast(layout, false)
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.alloc_fast(layout, true)
    }

    #[inline(always)]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        let reserve = self.reserve.load(Acquire);
        let off = (p as usize).wrapping_sub(self.base.load(Relaxed));
        if off < reserve {
            // SAFETY: a non-zero `reserve` was published (Release) after `hot` was written.
            let pool = unsafe { (*self.hot.get()).assume_init_ref() };
            // SAFETY: a block of the pool with `layout`; `off` is its offset from the
            // reservation's first address, which is the pool's (`span`, published together).
            return unsafe { pool.free_sized_at(p, off, layout) };
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.dealloc_cold(p, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if let Some(pool) = self.owner_of(p) {
            // SAFETY: a block of the pool with `layout` (the caller's contract).
            let q = unsafe { pool.realloc(p, layout, new_size) };
            if !q.is_null() {
                return q;
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.realloc_cold(p, layout, new_size) }
    }
}
