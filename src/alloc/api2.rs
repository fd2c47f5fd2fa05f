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
        let p = NonNull::new(Pool::alloc(self, layout)).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let p = NonNull::new(Pool::alloc_zeroed(self, layout)).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
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
        unsafe { self.resize(ptr, old, new) }
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        let p = unsafe { self.resize(ptr, old, new) }?;
        // SAFETY: the block holds `new.size()` bytes; zero what was not copied.
        unsafe {
            std::ptr::write_bytes(
                p.cast::<u8>().as_ptr().add(old.size()),
                0,
                new.size() - old.size(),
            )
        };
        Ok(p)
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.resize(ptr, old, new) }
    }
}

impl Pool {
    /// Resize for `grow`/`shrink`: in place when the block allows and is aligned for `new`.
    unsafe fn resize(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        let p = if ptr.as_ptr() as usize % new.align() == 0 {
            // SAFETY: forwarded from the caller.
            unsafe { Pool::realloc(self, ptr.as_ptr(), old, new.size()) }
        } else {
            let q = Pool::alloc(self, new);
            if !q.is_null() {
                // SAFETY: distinct blocks, both valid for the copied length.
                unsafe {
                    std::ptr::copy_nonoverlapping(ptr.as_ptr(), q, old.size().min(new.size()));
                    Pool::free(self, ptr.as_ptr());
                }
            }
            q
        };
        let p = NonNull::new(p).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, new.size()))
    }
}
