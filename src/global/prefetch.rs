//! Prefetch and the refill on the global pool (see [`crate::prefetch`]).

use super::GlobalPool;
use crate::nic::Advice;
use crate::prefetch::PrefetchError;

impl GlobalPool {
    /// [`Pool::prefetch`](crate::alloc::Core::prefetch) of a heap buffer of the global pool.
    ///
    /// # Errors
    /// As [`Pool::prefetch`](crate::alloc::Core::prefetch); [`PrefetchError::OutsidePool`]
    /// before the pool is ready.
    pub fn prefetch(&self, buf: &[u8], advice: Advice) -> Result<usize, PrefetchError> {
        self.ready()
            .ok_or(PrefetchError::OutsidePool)?
            .prefetch(buf, advice)
    }

    /// [`Pool::start_refill`](crate::alloc::Core::start_refill) on the global pool,
    /// initialising it first. Call it from `main`, never from inside an allocation.
    ///
    /// # Errors
    /// The pool could not initialise, or the thread could not be spawned.
    ///
    /// # Examples
    /// ```
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// POOL.start_refill(2).unwrap();
    /// POOL.stop_refill();
    /// ```
    pub fn start_refill(&self, slabs: usize) -> std::io::Result<()> {
        let pool = self
            .init()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        pool.start_refill(slabs)
    }

    /// Stop the refill thread, if one runs, and wait for it.
    pub fn stop_refill(&self) {
        if let Some(p) = self.ready() {
            p.stop_refill();
        }
    }
}
