//! Prefetch of hot ranges, and the refill, for applications: [`Core::prefetch`],
//! [`Core::prefetch_all`], [`Core::start_refill`].

use super::PrefetchError;
use crate::alloc::Core;
use crate::nic::{Advice, AdviseFlags};

impl Core {
    /// Make the NIC's translations of `buf` (pool memory) present now, waiting until they are
    /// (`FLUSH`): `Prefetch`/`PrefetchWrite` fault the pages in (after a purge dropped them,
    /// say), `PrefetchNoFault` maps only the pages the CPU already has (e.g. after a
    /// migration). Returns the bytes advised: 0 for pinned memory, which needs no prefetch.
    ///
    /// # Errors
    /// [`PrefetchError::OutsidePool`], [`PrefetchError::Unregistered`] for a bad range;
    /// [`PrefetchError::Disabled`] when prefetch is off; the device's refusal, typed (see
    /// [`PrefetchError`]).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::Pool;
    /// use rdma_pool::arena::{ArenaConfig, Registration};
    /// use rdma_pool::nic::{Advice, Nic};
    /// let pd = Nic::soft().alloc_pd()?;
    /// let cfg = ArenaConfig { reserve: 1 << 32, registration: Registration::Odp, ..Default::default() };
    /// let pool = Pool::with_config(&pd, cfg)?;
    /// let buf = allocator_api2::vec![in &pool; 0u8; 1 << 20];
    /// assert_eq!(pool.prefetch(&buf, Advice::PrefetchWrite)?, 1 << 20);
    /// assert!(pool.prefetch(&[0u8; 8], Advice::Prefetch).is_err()); // not pool memory
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn prefetch(&self, buf: &[u8], advice: Advice) -> Result<usize, PrefetchError> {
        self.prefetch_all(&[buf], advice, AdviseFlags::FLUSH)
    }

    /// [`Core::prefetch`] of several buffers with `flags` (without `FLUSH` the device may
    /// postpone the work and drops its errors): one `advise_mr` call per 4095 entries.
    ///
    /// # Errors
    /// As [`Core::prefetch`]; nothing is advised when a buffer is refused.
    pub fn prefetch_all(
        &self,
        bufs: &[&[u8]],
        advice: Advice,
        flags: AdviseFlags,
    ) -> Result<usize, PrefetchError> {
        let arena = self.arena();
        let mut sges = Vec::new();
        let mut bytes = 0;
        for b in bufs.iter().filter(|b| !b.is_empty()) {
            let addr = b.as_ptr() as usize;
            if !self.contains(b.as_ptr()) {
                return Err(PrefetchError::OutsidePool);
            }
            let Some(odp) = arena.odp_keys(addr) else {
                return Err(PrefetchError::Unregistered);
            };
            // Pinned memory is always present in the NIC.
            let Some(keys) = odp else { continue };
            if !keys.contains(addr, b.len()) {
                return Err(PrefetchError::Unregistered);
            }
            sges.extend(crate::arena::prefetch::entries(keys.lkey, addr, b.len()));
            bytes += b.len();
        }
        if sges.is_empty() {
            return Ok(0);
        }
        arena.prefetcher().advise(self.pd(), advice, flags, &sges)?;
        Ok(bytes)
    }

    /// Keep `slabs` (at most [`RESERVE_MAX`](super::RESERVE_MAX)) one-slab runs
    /// committed, registered and prefetched ahead of demand, by a background thread; `0`
    /// stops it. Call it from ordinary code (not from inside an allocator); the thread stops
    /// with [`Core::stop_refill`] or when the pool is dropped. Under
    /// [`NumaPolicy::Local`](crate::arena::NumaPolicy::Local) placement the reserve is not used
    /// (runs come from the calling thread's node), and the call starts nothing.
    ///
    /// # Errors
    /// The thread could not be spawned.
    ///
    /// # Examples
    /// ```
    /// # let pool = rdma_pool::Pool::new(&rdma_pool::nic::Nic::soft().alloc_pd()?)?;
    /// pool.start_refill(2)?;
    /// assert_eq!(pool.stats().prefetch.reserve_target, 2);
    /// pool.stop_refill();
    /// assert_eq!(pool.stats().prefetch.reserve_target, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start_refill(&self, slabs: usize) -> std::io::Result<()> {
        // SAFETY: the pool's drop stops the refill before its arena goes.
        unsafe { self.inner().refill.start(self.arena(), slabs) }
    }

    /// Stop the refill thread and wait for it (the slabs it reserved stay ready).
    pub fn stop_refill(&self) {
        self.inner().refill.stop(self.arena());
    }
}
