//! The process-wide lookups: [`keys_of`] and [`keys_of_on`] of any heap pointer and [`stats`],
//! answered by the first `GlobalPool` that became ready (else by any live `Pool`), from
//! anywhere, without a reference to the pool.

use super::*;

/// The lkey and rkey of any heap pointer: the registration covering `p` in the global pool
/// (the first [`GlobalPool`] that initialised), else in any live [`Pool`]. `None` for memory
/// no pool handed out — the stack, statics, bootstrap or degraded blocks, C `malloc`.
///
/// # Examples
/// ```
/// use rdma_pool::Pool;
/// let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
/// let pool = Pool::new(&pd)?;
/// let p = pool.alloc(std::alloc::Layout::new::<[u8; 64]>());
/// assert_eq!(rdma_pool::keys_of(p), pool.keys_of(p));
/// assert!(rdma_pool::keys_of(&0u8).is_none());
/// # unsafe { pool.free(p) };
/// # Ok::<(), rdma_pool::PoolError>(())
/// ```
pub fn keys_of<T: ?Sized>(p: *const T) -> Option<Keys> {
    let p = p.cast::<u8>();
    if let Some(ready) = instance()
        && ready.pool.contains(p)
    {
        return ready.pool.keys_of(p);
    }
    crate::alloc::keys_of_any(p)
}

/// What the front end answers when its pool could not initialise (the cause is kept by
/// [`GlobalPool::init_error`]).
pub(super) fn not_ready() -> Error {
    Error::Config("the global pool could not initialise: see GlobalPool::init_error")
}

/// The keys of any heap pointer on `nic`: as [`keys_of`], on the global pool's own device or
/// on a device it was attached to ([`GlobalPool::attach`]); `None` where the memory is not
/// registered on `nic`.
///
/// # Examples
/// ```
/// use rdma_pool::Pool;
/// use rdma_pool::nic::Nic;
/// let (a, b) = (Nic::soft(), Nic::soft());
/// let pool = Pool::new(&a.alloc_pd()?)?;
/// pool.attach(&b.alloc_pd()?)?;
/// let p = pool.alloc(std::alloc::Layout::new::<[u8; 64]>());
/// assert_eq!(rdma_pool::keys_of_on(p, &b), pool.keys_of_on(p, &b));
/// assert!(rdma_pool::keys_of_on(p, &b).is_some());
/// assert!(rdma_pool::keys_of_on(&0u8, &a).is_none());
/// # unsafe { pool.free(p) };
/// # Ok::<(), rdma_pool::PoolError>(())
/// ```
pub fn keys_of_on<T: ?Sized>(p: *const T, nic: &crate::nic::Nic) -> Option<Keys> {
    let p = p.cast::<u8>();
    if let Some(ready) = instance()
        && ready.pool.contains(p)
    {
        return ready.pool.keys_of_on(p, nic);
    }
    crate::alloc::keys_of_any_on(p, Some(nic))
}

/// The statistics of the global pool (the first [`GlobalPool`] that initialised); `None` when
/// none did.
///
/// # Examples
/// ```
/// // No `GlobalPool` is the global allocator of doctests.
/// if let Some(s) = rdma_pool::stats() {
///     println!("{:?}: {} degraded allocations", s.state, s.degraded_allocations);
/// }
/// ```
pub fn stats() -> Option<GlobalStats> {
    let state = match FIRST_STATE.load(Acquire) {
        UNINIT => return None,
        BUSY => GlobalState::Initialising,
        READY => GlobalState::Ready,
        _ => GlobalState::Failed,
    };
    let counters = FIRST_COUNTERS.load(Acquire);
    // SAFETY: set (to a `&'static Counters`) before `FIRST_STATE` leaves UNINIT.
    let counters = if counters.is_null() {
        &ZERO
    } else {
        unsafe { &*counters }
    };
    if !provision::active() {
        exit_report::report(counters);
    }
    Some(counters.snapshot(state, instance().map(|r| r.pool.core().stats())))
}

fn instance() -> Option<&'static Ready> {
    let p = INSTANCE.load(Acquire);
    // SAFETY: `INSTANCE` only ever holds a `&'static Ready` (mapped and never unmapped).
    (!p.is_null()).then(|| unsafe { &*p })
}
