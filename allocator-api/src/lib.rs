//! The nightly `core::alloc::Allocator` front end of rdma-pool.
//!
//! This member crate is where code that needs the unstable `allocator_api` feature lives, so the
//! stable `rdma-pool` crate never depends on nightly; CI builds and tests it with
//! `RUSTC_BOOTSTRAP=1`. One adapter, [`Alloc`], wraps a pool handle of the stable crate (the
//! orphan rule keeps the trait from being implemented on the stable crate's types here),
//! dereferences to it, and forwards the nightly `Allocator` to the handle's allocator-api2
//! implementation — the one adapter of the stable crate, so both traits keep the same rules.
//! [`Pool`] is `Alloc<rdma_pool::Pool>`: `std::vec::Vec::new_in(&pool)` and
//! `Box::new_in(x, &pool)` allocate NIC-registered memory while `keys_of`, `sge_of` and the
//! statistics stay one call away. [`GlobalPool`] is `Alloc<rdma_pool::GlobalPool>`: usable as
//! `#[global_allocator]` itself, and `&GlobalPool` is an `Allocator` too.
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
//! # Ok::<(), rdma_pool::PoolError>(())
//! ```
#![feature(allocator_api)]
#![warn(missing_docs, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

pub use rdma_pool;

use allocator_api2::alloc::Allocator as Api2;
use core::alloc::{AllocError, Allocator, GlobalAlloc, Layout};
use core::ptr::NonNull;
use rdma_pool::PoolError as Error;
use rdma_pool::arena::ArenaConfig;
use rdma_pool::nic::Pd;

/// A pool handle of the stable crate that `&Alloc` makes a nightly `Allocator` (and, for a
/// `GlobalAlloc` handle, a `GlobalAlloc`); it dereferences to the handle.
#[derive(Debug, Default)]
pub struct Alloc<A>(A);

/// An [`rdma_pool::Pool`] that `&Pool` makes a nightly `Allocator`.
pub type Pool = Alloc<rdma_pool::Pool>;

/// A [`rdma_pool::GlobalPool`] that is also a nightly `Allocator` (through `&GlobalPool`), and
/// a `GlobalAlloc` itself, so the same static can be the `#[global_allocator]`.
///
/// # Examples
/// ```
/// #![feature(allocator_api)]
/// use rdma_pool_allocator_api::GlobalPool;
/// static POOL: GlobalPool = GlobalPool::new();
/// let b = Box::new_in([1u64; 16], &POOL);
/// assert!(POOL.keys_of(b.as_ptr().cast()).is_some());
/// ```
pub type GlobalPool = Alloc<rdma_pool::GlobalPool>;

impl Pool {
    /// A pool over a fresh arena on `pd` (see [`rdma_pool::Pool::new`]).
    ///
    /// # Errors
    /// As [`rdma_pool::Pool::new`].
    pub fn new(pd: &Pd) -> Result<Pool, Error> {
        rdma_pool::Pool::new(pd).map(Alloc)
    }

    /// A pool over a fresh arena configured by `cfg`.
    ///
    /// # Errors
    /// As [`rdma_pool::Pool::with_config`].
    pub fn with_config(pd: &Pd, cfg: ArenaConfig) -> Result<Pool, Error> {
        rdma_pool::Pool::with_config(pd, cfg).map(Alloc)
    }
}

impl GlobalPool {
    /// See [`rdma_pool::GlobalPool::new`].
    pub const fn new() -> GlobalPool {
        Alloc(rdma_pool::GlobalPool::new())
    }

    /// See [`rdma_pool::GlobalPool::with_config`].
    pub const fn with_config(config: rdma_pool::GlobalConfig) -> GlobalPool {
        Alloc(rdma_pool::GlobalPool::with_config(config))
    }
}

impl<A> Alloc<A> {
    /// The stable handle inside.
    pub fn into_inner(self) -> A {
        self.0
    }
}

impl<A> From<A> for Alloc<A> {
    fn from(handle: A) -> Alloc<A> {
        Alloc(handle)
    }
}

impl<A> core::ops::Deref for Alloc<A> {
    type Target = A;
    fn deref(&self) -> &A {
        &self.0
    }
}

// SAFETY: forwards every call to the stable handle's `GlobalAlloc`, which upholds the contract.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Alloc<A> {
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

// SAFETY: forwards to the allocator-api2 implementation of the stable handle, whose contract
// is the same (zero-size requests included).
unsafe impl<A> Allocator for &Alloc<A>
where
    for<'a> &'a A: Api2,
{
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        Api2::allocate(&&self.0, layout).map_err(|_| AllocError)
    }

    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        Api2::allocate_zeroed(&&self.0, layout).map_err(|_| AllocError)
    }

    #[inline]
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
