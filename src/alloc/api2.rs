//! The allocator-api2 front end, written once for every pool handle: `&Pool` and
//! `&GlobalPool` are `allocator_api2::alloc::Allocator`s (version 0.2, the one hashbrown uses),
//! so `allocator_api2::vec::Vec::new_in(&pool)` and `hashbrown::HashMap::new_in(&pool)` allocate
//! NIC-registered memory.
//!
//! Contract: a handle offers [`RawBlocks`] (allocate, sized free, realloc at the same
//! alignment, with the pool's own rules: null for a refusal, never a panic); [`allocator!`]
//! implements `Allocator` for a reference to it through the functions below, so every front end
//! has the same rules:
//! - a zero-size request gets a dangling, aligned pointer and never reaches the pool (and its
//!   deallocation is nothing);
//! - growing or shrinking at the same alignment is the handle's realloc (in place when the
//!   block's size class or run allows), zero-filling the new tail for `grow_zeroed`;
//! - a change of alignment allocates, copies and frees;
//! - the reported length is the length asked for.

use allocator_api2::alloc::{AllocError, Layout};
use std::ptr::NonNull;

/// The block calls an allocator front end is written on.
pub(crate) trait RawBlocks {
    /// A block of `layout` (zero-filled when `zero`), null when refused. `layout.size() > 0`.
    fn raw_alloc(&self, layout: Layout, zero: bool) -> *mut u8;
    /// Free a block.
    ///
    /// # Safety
    /// `p` came from this handle with `layout` (size > 0) and is not used afterwards.
    unsafe fn raw_free(&self, p: *mut u8, layout: Layout);
    /// Resize a block at its alignment; null (and `p` untouched) when refused.
    ///
    /// # Safety
    /// As [`RawBlocks::raw_free`]; `new_size > 0`. On success `p` is not used afterwards
    /// (unless returned).
    unsafe fn raw_realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8;
}

/// `Ok` for a non-null block of `len` bytes.
pub(crate) fn slice(p: *mut u8, len: usize) -> Result<NonNull<[u8]>, AllocError> {
    NonNull::new(p)
        .map(|p| NonNull::slice_from_raw_parts(p, len))
        .ok_or(AllocError)
}

fn dangling(layout: Layout) -> NonNull<[u8]> {
    // SAFETY: the alignment is non-zero, so the pointer is non-null.
    let p = unsafe { NonNull::new_unchecked(layout.align() as *mut u8) };
    NonNull::slice_from_raw_parts(p, 0)
}

/// `Allocator::allocate` / `allocate_zeroed`.
#[inline]
pub(crate) fn allocate(
    a: &impl RawBlocks,
    layout: Layout,
    zero: bool,
) -> Result<NonNull<[u8]>, AllocError> {
    if layout.size() == 0 {
        return Ok(dangling(layout));
    }
    slice(a.raw_alloc(layout, zero), layout.size())
}

/// `Allocator::deallocate`.
///
/// # Safety
/// As `Allocator::deallocate`.
#[inline]
pub(crate) unsafe fn deallocate(a: &impl RawBlocks, ptr: NonNull<u8>, layout: Layout) {
    if layout.size() != 0 {
        // SAFETY: a block this handle handed out with `layout` (the caller's contract).
        unsafe { a.raw_free(ptr.as_ptr(), layout) }
    }
}

/// `Allocator::grow`, `grow_zeroed` and `shrink`.
///
/// # Safety
/// As `Allocator::grow` (or `shrink`).
pub(crate) unsafe fn resize(
    a: &impl RawBlocks,
    ptr: NonNull<u8>,
    old: Layout,
    new: Layout,
    zero: bool,
) -> Result<NonNull<[u8]>, AllocError> {
    if old.size() != 0 && new.size() != 0 && old.align() == new.align() {
        // SAFETY: a block with `old`, resized to a non-zero size of the same alignment.
        let q = slice(
            unsafe { a.raw_realloc(ptr.as_ptr(), old, new.size()) },
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
    }
    let q = allocate(a, new, zero)?;
    // SAFETY: distinct blocks, both valid for the copied length; `ptr` is freed once.
    unsafe {
        std::ptr::copy_nonoverlapping(
            ptr.as_ptr(),
            q.cast::<u8>().as_ptr(),
            old.size().min(new.size()),
        );
        deallocate(a, ptr, old);
    }
    Ok(q)
}

/// `unsafe impl Allocator for &$handle` through its [`RawBlocks`].
macro_rules! allocator {
    ($handle:ty) => {
        // SAFETY: `crate::alloc::api2`'s functions keep the contract (see its docs): blocks
        // stay valid until freed, zero-size requests never reach the pool, a resize keeps or
        // copies the contents.
        unsafe impl allocator_api2::alloc::Allocator for &$handle {
            #[inline]
            fn allocate(
                &self,
                layout: allocator_api2::alloc::Layout,
            ) -> Result<std::ptr::NonNull<[u8]>, allocator_api2::alloc::AllocError> {
                $crate::alloc::api2::allocate(*self, layout, false)
            }

            fn allocate_zeroed(
                &self,
                layout: allocator_api2::alloc::Layout,
            ) -> Result<std::ptr::NonNull<[u8]>, allocator_api2::alloc::AllocError> {
                $crate::alloc::api2::allocate(*self, layout, true)
            }

            #[inline]
            unsafe fn deallocate(
                &self,
                ptr: std::ptr::NonNull<u8>,
                layout: allocator_api2::alloc::Layout,
            ) {
                // SAFETY: forwarded from the caller.
                unsafe { $crate::alloc::api2::deallocate(*self, ptr, layout) }
            }

            unsafe fn grow(
                &self,
                ptr: std::ptr::NonNull<u8>,
                old: allocator_api2::alloc::Layout,
                new: allocator_api2::alloc::Layout,
            ) -> Result<std::ptr::NonNull<[u8]>, allocator_api2::alloc::AllocError> {
                // SAFETY: forwarded from the caller.
                unsafe { $crate::alloc::api2::resize(*self, ptr, old, new, false) }
            }

            unsafe fn grow_zeroed(
                &self,
                ptr: std::ptr::NonNull<u8>,
                old: allocator_api2::alloc::Layout,
                new: allocator_api2::alloc::Layout,
            ) -> Result<std::ptr::NonNull<[u8]>, allocator_api2::alloc::AllocError> {
                // SAFETY: forwarded from the caller.
                unsafe { $crate::alloc::api2::resize(*self, ptr, old, new, true) }
            }

            unsafe fn shrink(
                &self,
                ptr: std::ptr::NonNull<u8>,
                old: allocator_api2::alloc::Layout,
                new: allocator_api2::alloc::Layout,
            ) -> Result<std::ptr::NonNull<[u8]>, allocator_api2::alloc::AllocError> {
                // SAFETY: forwarded from the caller.
                unsafe { $crate::alloc::api2::resize(*self, ptr, old, new, false) }
            }
        }
    };
}
pub(crate) use allocator;

impl RawBlocks for super::Core {
    #[inline(always)]
    fn raw_alloc(&self, layout: Layout, zero: bool) -> *mut u8 {
        self.alloc_with(layout, zero)
    }

    #[inline(always)]
    unsafe fn raw_free(&self, p: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller.
        unsafe { self.free_sized(p, layout) }
    }

    unsafe fn raw_realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe { self.realloc(p, layout, new_size) }
    }
}
