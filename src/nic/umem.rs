//! The DEVX UMEM, [`Umem`]: user memory registered for device queue objects
//! ([`Nic::umem_reg`]).
//!
//! Contract: a `Umem` holds its [`Nic`]; it is deregistered by [`Umem::dereg`] or when
//! dropped (a failure there is logged and the UMEM leaked).

use super::error::Result;
use super::{Nic, leak_on_error};

/// A DEVX UMEM: user memory registered for device queue objects.
pub struct Umem {
    pub(super) nic: Nic,
    pub(super) handle: u64,
    pub(super) id: u32,
    pub(super) addr: usize,
    pub(super) len: usize,
}

debug_fields!(Umem, |s| { "id": s.id, "len": s.len });

impl Umem {
    /// The UMEM id the device assigned.
    pub fn id(&self) -> u32 {
        self.id
    }
    /// Start address.
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never true: registration refuses empty ranges.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The backend's handle (`struct mlx5dv_devx_umem *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.handle
    }

    /// Deregister now and say how it went (dropping deregisters too, logging a failure).
    ///
    /// # Errors
    /// The device's refusal (a UMEM still used by a DEVX object); the UMEM is then left
    /// registered (leaked), as `Drop` would.
    ///
    /// # Examples
    /// ```
    /// let nic = rdma_pool::nic::Nic::soft();
    /// let mut buf = memmap2::MmapMut::map_anon(1 << 16).unwrap();
    /// // SAFETY: `buf` outlives the UMEM.
    /// let umem = unsafe {
    ///     nic.umem_reg(buf.as_mut_ptr(), buf.len(), rdma_pool::nic::Access::LOCAL_WRITE, 1 << 12)
    /// }.unwrap();
    /// umem.dereg().unwrap();
    /// ```
    pub fn dereg(self) -> Result<()> {
        let me = std::mem::ManuallyDrop::new(self);
        let r = me.nic.backend.umem_dereg(me.handle);
        // SAFETY: `me` is not used again; its NIC handle is released once, here.
        drop(unsafe { std::ptr::read(&me.nic) });
        r
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        leak_on_error(
            "UMEM",
            self.handle,
            self.nic.backend.umem_dereg(self.handle),
        );
    }
}
