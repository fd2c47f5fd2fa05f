//! The allocator-api2 front end: `&Pool` is an `allocator_api2::alloc::Allocator` (version
//! 0.2, the one hashbrown uses), so `allocator_api2::vec::Vec::new_in(&pool)` and
//! `hashbrown::HashMap::new_in(&pool)` allocate NIC-registered memory.

use super::Pool;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::ptr::NonNull;

// SAFETY: blocks stay valid until freed (or the pool is dropped, which never unmaps live
// blocks); `usable_size` bounds what is reported; `grow`/`shrink` keep or copy contents.
unsafe impl Allocator for &Pool {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        slice(Pool::alloc(self, layout), layout.size())
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        slice(Pool::alloc_zeroed(self, layout), layout.size())
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: forwarded from the caller (a block of this pool with `layout`).
        unsafe { Pool::free_sized(self, ptr.as_ptr(), layout) }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        slice(
            unsafe { Pool::resize(self, ptr.as_ptr(), old, new) },
            new.size(),
        )
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        slice(
            unsafe { Pool::resize_zeroed(self, ptr.as_ptr(), old, new) },
            new.size(),
        )
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        slice(
            unsafe { Pool::resize(self, ptr.as_ptr(), old, new) },
            new.size(),
        )
    }
}

/// `Ok` for a non-null block of `len` bytes (also used by the global pool's front end).
pub(crate) fn slice(p: *mut u8, len: usize) -> Result<NonNull<[u8]>, AllocError> {
    NonNull::new(p)
        .map(|p| NonNull::slice_from_raw_parts(p, len))
        .ok_or(AllocError)
}
