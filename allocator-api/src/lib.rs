//! The nightly `core::alloc::Allocator` front end of rdma-pool.
//!
//! This member crate is where code that needs the unstable `allocator_api` feature lives, so the
//! stable `rdma-pool` crate never depends on nightly; CI builds and tests it with
//! `RUSTC_BOOTSTRAP=1`. [`Pool`] wraps [`rdma_pool::alloc::Pool`] (the orphan rule keeps the
//! trait from being implemented on the stable crate's type here) and dereferences to it, so
//! `std::vec::Vec::new_in(&pool)` and `Box::new_in(x, &pool)` allocate NIC-registered memory
//! while `keys_of`, `sge_of` and the statistics stay one call away. [`GlobalPool`] does the same
//! for [`rdma_pool::GlobalPool`]: usable as `#[global_allocator]` itself, and `&GlobalPool` is an
//! `Allocator` too.
//!
//! # Examples
//! ```
//! #![feature(allocator_api)]
//! use rdma_pool_allocator_api::Pool;
//! let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
//! let pool = Pool::new(&pd)?;
//! let mut v = Vec::new_in(&pool);
//! v.extend_from_slice(b"posted as-is");
//! assert!(pool.keys_of(v.as_ptr()).is_some());
//! # Ok::<(), rdma_pool::arena::Error>(())
//! ```
#![feature(allocator_api)]
#![warn(missing_docs, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

pub use rdma_pool;

use core::alloc::{AllocError, Allocator, Layout};
use core::ptr::NonNull;
use rdma_pool::arena::{ArenaConfig, Error};
use rdma_pool::nic::Pd;

/// A [`rdma_pool::alloc::Pool`] that `&Pool` makes a nightly `Allocator`.
#[derive(Debug)]
pub struct Pool(rdma_pool::alloc::Pool);

impl Pool {
    /// A pool over a fresh arena on `pd` (see [`rdma_pool::alloc::Pool::new`]).
    ///
    /// # Errors
    /// As [`rdma_pool::alloc::Pool::new`].
    pub fn new(pd: &Pd) -> Result<Pool, Error> {
        rdma_pool::alloc::Pool::new(pd).map(Pool)
    }

    /// A pool over a fresh arena configured by `cfg`.
    ///
    /// # Errors
    /// As [`rdma_pool::alloc::Pool::with_config`].
    pub fn with_config(pd: &Pd, cfg: ArenaConfig) -> Result<Pool, Error> {
        rdma_pool::alloc::Pool::with_config(pd, cfg).map(Pool)
    }

    /// The stable pool inside.
    pub fn into_inner(self) -> rdma_pool::alloc::Pool {
        self.0
    }
}

impl From<rdma_pool::alloc::Pool> for Pool {
    fn from(pool: rdma_pool::alloc::Pool) -> Pool {
        Pool(pool)
    }
}

impl core::ops::Deref for Pool {
    type Target = rdma_pool::alloc::Pool;
    fn deref(&self) -> &rdma_pool::alloc::Pool {
        &self.0
    }
}

fn slice(p: *mut u8, len: usize) -> Result<NonNull<[u8]>, AllocError> {
    NonNull::new(p)
        .map(|p| NonNull::slice_from_raw_parts(p, len))
        .ok_or(AllocError)
}

// SAFETY: blocks stay valid until freed (a dropped pool never unmaps live blocks); the
// reported length is what was asked for; grow/shrink keep or copy the contents.
unsafe impl Allocator for &Pool {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        slice(self.0.alloc(layout), layout.size())
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        slice(self.0.alloc_zeroed(layout), layout.size())
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: forwarded from the caller: a block of this pool with `layout`.
        unsafe { self.0.free_sized(ptr.as_ptr(), layout) }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        slice(unsafe { self.0.resize(ptr.as_ptr(), old, new) }, new.size())
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        slice(
            unsafe { self.0.resize_zeroed(ptr.as_ptr(), old, new) },
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
        slice(unsafe { self.0.resize(ptr.as_ptr(), old, new) }, new.size())
    }
}

/// A [`rdma_pool::GlobalPool`] that is also a nightly `Allocator` (through `&GlobalPool`), and a
/// `GlobalAlloc` itself, so the same static can be the `#[global_allocator]`.
///
/// # Examples
/// ```
/// #![feature(allocator_api)]
/// use rdma_pool_allocator_api::GlobalPool;
/// static POOL: GlobalPool = GlobalPool::new();
/// let b = Box::new_in([1u64; 16], &POOL);
/// assert!(POOL.keys_of(b.as_ptr().cast()).is_some());
/// ```
#[derive(Debug, Default)]
pub struct GlobalPool(rdma_pool::GlobalPool);

impl GlobalPool {
    /// See [`rdma_pool::GlobalPool::new`].
    pub const fn new() -> GlobalPool {
        GlobalPool(rdma_pool::GlobalPool::new())
    }

    /// See [`rdma_pool::GlobalPool::with_config`].
    pub const fn with_config(config: rdma_pool::global::GlobalConfig) -> GlobalPool {
        GlobalPool(rdma_pool::GlobalPool::with_config(config))
    }
}

impl core::ops::Deref for GlobalPool {
    type Target = rdma_pool::GlobalPool;
    fn deref(&self) -> &rdma_pool::GlobalPool {
        &self.0
    }
}

// SAFETY: forwards every call to the stable `GlobalPool`, which upholds the contract.
unsafe impl core::alloc::GlobalAlloc for GlobalPool {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

use allocator_api2::alloc::Allocator as Api2;

// SAFETY: forwards to the allocator-api2 implementation of the stable `&GlobalPool`, whose
// contract is the same (zero-size requests included).
unsafe impl Allocator for &GlobalPool {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        Api2::allocate(&&self.0, layout).map_err(|_| AllocError)
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        Api2::allocate_zeroed(&&self.0, layout).map_err(|_| AllocError)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: forwarded from the caller.
        unsafe { Api2::deallocate(&&self.0, ptr, layout) }
    }

    unsafe fn grow(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        unsafe { Api2::grow(&&self.0, ptr, old, new) }.map_err(|_| AllocError)
    }

    unsafe fn grow_zeroed(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        unsafe { Api2::grow_zeroed(&&self.0, ptr, old, new) }.map_err(|_| AllocError)
    }

    unsafe fn shrink(
        &self,
        ptr: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded from the caller.
        unsafe { Api2::shrink(&&self.0, ptr, old, new) }.map_err(|_| AllocError)
    }
}
