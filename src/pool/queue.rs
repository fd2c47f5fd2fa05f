//! DEVX queue memory of a [`Pool`] (see [`crate::queue_mem`] for the contract): the
//! feature's calls on the facade.

use super::Pool;
use crate::queue_mem::{QueueBuf, QueueMemError};

impl Pool {
    /// `len` bytes of DEVX queue memory aligned to `align` (a power of two; 64 for a doorbell
    /// record, the page size or more for a queue buffer), carved from a UMEM of the pool's NIC
    /// (see the [module contract](crate::queue_mem)).
    ///
    /// # Errors
    /// [`QueueMemError::Unsupported`] without DEVX; [`QueueMemError::InvalidArgument`] for a
    /// zero length or a bad alignment; [`QueueMemError::PageSize`] when the device takes none
    /// of the page sizes; the arena's or the NIC's failure.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::Pool;
    /// let pool = Pool::new(&rdma_pool::nic::Nic::soft().alloc_pd()?)?;
    /// let db = pool.queue_memory(64, 64)?;
    /// let sq = pool.queue_memory(16 << 10, 4096)?;
    /// assert_eq!(db.umem_id(), sq.umem_id()); // one UMEM for both
    /// assert!(sq.offset() % 4096 == 0 && db.offset() % 64 == 0);
    /// assert!(pool.keys_of(sq.as_ptr()).is_none()); // no region covers queue memory
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue_memory(&self, len: usize, align: usize) -> Result<QueueBuf<'_>, QueueMemError> {
        self.queue_memory_with(len, align, None)
    }

    /// [`Pool::queue_memory`] registering any new UMEM with exactly the page-size bitmap
    /// `pgsz_bitmap` (bit `n` = pages of `2ⁿ` bytes) instead of the one its slabs allow.
    ///
    /// # Errors
    /// As [`Pool::queue_memory`].
    pub fn queue_memory_with(
        &self,
        len: usize,
        align: usize,
        pgsz_bitmap: Option<u64>,
    ) -> Result<QueueBuf<'_>, QueueMemError> {
        self.features
            .queue
            .carve_from(&self.core, len, align, pgsz_bitmap)
    }
}
