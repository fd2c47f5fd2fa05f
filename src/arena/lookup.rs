//! From an address to its keys: [`Arena::keys_of`], [`Arena::sge_of`], and the crate's own
//! lookups of the region covering an address (exposed for grants, or peeked for ODP keys).
//!
//! Contract:
//! - every lookup here is O(1), lock-free and allocation-free, and makes no NIC call: it reads
//!   the key table (`table.rs`) and nothing else;
//! - handing out keys ([`Arena::keys_of`], [`Arena::sge_of`], `exposed_region`) freezes them:
//!   the region is never re-registered afterwards (`grow.rs`); `odp_keys` hands out only an ODP
//!   region's keys, which never change anyway, and freezes nothing;
//! - an SGE is built only for a slice wholly inside one registration, and shorter than 4 GiB.

use super::table::Keys;
use super::{Arena, Error};
use crate::nic::Sge;

impl Arena {
    /// The keys of the one registration covering `ptr`, and its range (which covers the whole
    /// run `ptr` lies in). O(1), lock-free and allocation-free; `None` for a pointer outside
    /// the arena or in memory not handed out. Handing out the keys freezes them: the region
    /// is never re-registered afterwards.
    #[inline]
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&pd, cfg)?;
    /// let run = arena.alloc_run(4096, 64)?;
    /// let keys = arena.keys_of(run.as_ptr().wrapping_add(100)).unwrap();
    /// assert!(keys.contains(run.as_ptr() as usize, run.len()));
    /// assert_eq!(arena.keys_of(&keys as *const _ as *const u8), None); // not arena memory
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn keys_of(&self, ptr: *const u8) -> Option<Keys> {
        self.table.keys_of(ptr as usize)
    }

    /// The region covering `ptr`, marked exposed (its keys and `Mr` then never change while
    /// memory it covers is live): what grants bind windows to.
    pub(crate) fn exposed_region(&self, ptr: usize) -> Option<&crate::nic::Mr> {
        self.table.exposed_region(ptr)
    }

    /// The keys of the region covering `addr` if it is an ODP region (`Some(None)` for a
    /// pinned one, `None` for unregistered memory), without exposing it: ODP regions are
    /// never re-registered, so their keys are stable.
    pub(crate) fn odp_keys(&self, addr: usize) -> Option<Option<Keys>> {
        let (id, keys) = self.table.peek(addr)?;
        Some(self.table.reg(id).is_odp().then_some(keys))
    }

    /// One SGE for `buf` (its lkey).
    ///
    /// # Errors
    /// [`Error::NotRegistered`] when `buf` is not wholly inside one registration of the arena;
    /// [`Error::InvalidArgument`] when it is longer than an SGE can describe (4 GiB − 1).
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&pd, cfg)?;
    /// let run = arena.alloc_run(4096, 64)?;
    /// // SAFETY: the run is ours while the arena lives.
    /// let buf = unsafe { std::slice::from_raw_parts(run.as_ptr(), 512) };
    /// assert_eq!(arena.sge_of(buf)?.length, 512);
    /// assert!(arena.sge_of(&[0u8; 8]).is_err());
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn sge_of(&self, buf: &[u8]) -> Result<Sge, Error> {
        let keys = self.keys_of(buf.as_ptr()).ok_or(Error::NotRegistered)?;
        sge_in(&keys, buf)
    }
}

/// One SGE for `buf` with `keys`, which must cover it.
pub(super) fn sge_in(keys: &Keys, buf: &[u8]) -> Result<Sge, Error> {
    let addr = buf.as_ptr() as usize;
    if !keys.contains(addr, buf.len()) {
        return Err(Error::NotRegistered);
    }
    let length = u32::try_from(buf.len())
        .map_err(|_| Error::InvalidArgument("a slice of 4 GiB or more is not one SGE"))?;
    Ok(Sge {
        addr: addr as u64,
        length,
        lkey: keys.lkey,
    })
}
