//! The allocator-api2 front end of the global pool: `&GlobalPool` is an
//! `allocator_api2::alloc::Allocator`, so containers can name the pool explicitly (for example
//! when it is not the `#[global_allocator]`), with the same degradation rules as `GlobalAlloc`.

use super::GlobalPool;
use crate::alloc::slice;
use allocator_api2::alloc::{AllocError, Allocator, Layout};
use std::alloc::GlobalAlloc;
use std::ptr::NonNull;

// SAFETY: blocks come from the `GlobalAlloc` implementation and stay valid until freed;
// zero-size requests get a dangling, aligned pointer and are never passed on; a move to a new
// alignment copies the contents.
unsafe impl Allocator for &GlobalPool {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        // SAFETY: a non-zero-size layout.
        slice(unsafe { GlobalPool::alloc(self, layout) }, layout.size())
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            return Ok(dangling(layout));
        }
        // SAFETY: a non-zero-size layout.
        slice(
            unsafe { GlobalPool::alloc_zeroed(self, layout) },
            layout.size(),
        )
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() != 0 {
            // SAFETY: a block this allocator handed out with `layout`.
            unsafe { GlobalPool::dealloc(self, ptr.as_ptr(), layout) }
        }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        unsafe { resize(self, ptr, old, new, false) }
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        unsafe { resize(self, ptr, old, new, true) }
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        unsafe { resize(self, ptr, old, new, false) }
    }
}

/// `realloc` when the alignment stays and neither side is zero-size, else allocate, copy, free.
///
/// # Safety
/// `ptr` is a block of `pool` with layout `old`.
unsafe fn resize(
    pool: &GlobalPool,
    ptr: NonNull<u8>,
    old: Layout,
    new: Layout,
    zero: bool,
) -> Result<NonNull<[u8]>, AllocError> {
    let q = if old.size() != 0 && new.size() != 0 && old.align() == new.align() {
        // SAFETY: a block with `old`, resized to a non-zero size of the same alignment.
        let q = slice(
            unsafe { GlobalPool::realloc(pool, ptr.as_ptr(), old, new.size()) },
            new.size(),
        )?;
        if zero && new.size() > old.size() {
            // SAFETY: the block holds `new.size()` bytes; the tail past `old.size()` is ours.
            unsafe {
                q.cast::<u8>()
                    .as_ptr()
                    .add(old.size())
                    .write_bytes(0, new.size() - old.size())
            };
        }
        return Ok(q);
    } else {
        let q = if zero {
            (&pool).allocate_zeroed(new)?
        } else {
            (&pool).allocate(new)?
        };
        // SAFETY: distinct blocks, both valid for the copied length; `ptr` is freed once.
        unsafe {
            std::ptr::copy_nonoverlapping(
                ptr.as_ptr(),
                q.cast::<u8>().as_ptr(),
                old.size().min(new.size()),
            );
            (&pool).deallocate(ptr, old);
        }
        q
    };
    Ok(q)
}

fn dangling(layout: Layout) -> NonNull<[u8]> {
    // SAFETY: the alignment is non-zero, so the pointer is non-null.
    let p = unsafe { NonNull::new_unchecked(layout.align() as *mut u8) };
    NonNull::slice_from_raw_parts(p, 0)
}
