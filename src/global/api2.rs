//! The allocator-api2 front end of the global pool: `&GlobalPool` is an
//! `allocator_api2::alloc::Allocator` (the one adapter of `alloc/api2.rs`), so containers can
//! name the pool explicitly (for example when it is not the `#[global_allocator]`), with the
//! same degradation rules as `GlobalAlloc`.

use super::GlobalPool;
use crate::alloc::api2::{RawBlocks, allocator};
use std::alloc::{GlobalAlloc, Layout};

impl RawBlocks for GlobalPool {
    #[inline(always)]
    fn raw_alloc(&self, layout: Layout, zero: bool) -> *mut u8 {
        self.alloc_fast(layout, zero)
    }

    #[inline(always)]
    unsafe fn raw_free(&self, p: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller: a block of this pool with `layout`, size > 0.
        unsafe { GlobalAlloc::dealloc(self, p, layout) }
    }

    unsafe fn raw_realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe { GlobalAlloc::realloc(self, p, layout, new_size) }
    }
}

allocator!(GlobalPool);
