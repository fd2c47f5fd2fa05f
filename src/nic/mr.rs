//! The registered memory region, [`Mr`]: its keys and range, re-registration
//! ([`Mr::rereg`]), deregistration ([`Mr::dereg`], failing with [`DeregError`]) and the
//! access-rights check shared with [`Pd::reg_mr`].
//!
//! Contract: `lkey()/rkey()/addr()/len()` always equal what the backend last reported for the
//! region; after a re-registration failed with `ERR_CMD` the region is *poisoned* and can only
//! be dropped. A window bound to the region holds its inner part, so the region is deregistered
//! after the last window lets go of it.

use super::backend::RawMr;
use super::error::{Error, ReregError, ReregErrorKind, Result, Verb};
use super::{Access, Lkey, MrAttrs, Pd, ReregFlags, Rkey, Sge, leak_on_error};
use std::sync::Arc;

pub(super) fn check_mr_access(verb: Verb, access: Access) -> Result<()> {
    if !access.is_valid_for_mr() {
        return Err(Error::invalid(
            verb,
            "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE",
        ));
    }
    if access.contains(Access::ZERO_BASED) {
        return Err(Error::invalid(
            verb,
            "ZERO_BASED applies to memory windows only",
        ));
    }
    Ok(())
}

/// A registered memory region. Dropping it deregisters it (once no window bound to it holds it).
pub struct Mr {
    pub(super) inner: Arc<MrInner>,
}

pub(super) struct MrInner {
    pd: Pd,
    raw: RawMr,
    access: Access,
    poisoned: bool,
    registered: std::sync::atomic::AtomicBool,
}

impl MrInner {
    pub(super) fn new(pd: Pd, raw: RawMr, access: Access) -> MrInner {
        MrInner {
            pd,
            raw,
            access,
            poisoned: false,
            registered: true.into(),
        }
    }

    fn dereg(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        if !self.registered.load(Ordering::Acquire) {
            return Ok(());
        }
        self.pd.backend().dereg_mr(self.raw.handle)?;
        self.registered.store(false, Ordering::Release);
        Ok(())
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        leak_on_error("MR", self.raw.handle, self.dereg());
    }
}

debug_fields!(Mr, |s| {
    "addr": format_args!("{:#x}", s.inner.raw.addr),
    "len": s.inner.raw.len,
    "lkey": s.inner.raw.lkey,
    "rkey": s.inner.raw.rkey,
    "access": s.inner.access,
    "poisoned": s.inner.poisoned,
});

/// A failed [`Mr::dereg`]: the region, still registered, and why.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct DeregError {
    /// The region, unchanged.
    pub mr: Mr,
    /// What the verb said (`EBUSY`/`EINVAL` while a window is bound).
    #[source]
    pub error: Error,
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> Lkey {
        self.inner.raw.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        self.inner.raw.rkey
    }
    /// Start address.
    pub fn addr(&self) -> usize {
        self.inner.raw.addr
    }
    /// Length in bytes (`usize::MAX` for implicit ODP).
    pub fn len(&self) -> usize {
        self.inner.raw.len
    }
    /// True for a zero-length region (never: registration refuses them).
    pub fn is_empty(&self) -> bool {
        self.inner.raw.len == 0
    }
    /// Access flags.
    pub fn access(&self) -> Access {
        self.inner.access
    }
    /// True for an ODP region.
    pub fn is_odp(&self) -> bool {
        self.inner.access.contains(Access::ON_DEMAND)
    }
    /// True after a re-registration failed with `ERR_CMD`: the region must not be used.
    pub fn is_poisoned(&self) -> bool {
        self.inner.poisoned
    }
    /// The PD the region belongs to.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }
    /// The backend's handle (`struct ibv_mr *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.inner.raw.handle
    }

    /// A scatter/gather entry for `[addr() + offset, addr() + offset + len)`.
    ///
    /// # Errors
    /// `InvalidArgument` (with no verb: nothing is posted here) when the range leaves the
    /// region, `len` exceeds `u32::MAX`, or the region is poisoned.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::nic::{Access, Nic};
    /// # let pd = Nic::soft().alloc_pd().unwrap();
    /// # let mut buf = vec![0u8; 64];
    /// # // SAFETY: `buf` outlives `mr`.
    /// # let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// let sge = mr.sge(8, 16).unwrap();
    /// assert_eq!(sge.addr, mr.addr() as u64 + 8);
    /// assert!(matches!(
    ///     mr.sge(60, 16),
    ///     Err(rdma_pool::nic::Error::InvalidArgument { verb: None, .. })
    /// ));
    /// ```
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        if self.inner.poisoned {
            return Err(Error::invalid_arg("region is poisoned by a failed rereg"));
        }
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > self.len()) || len > u32::MAX as usize {
            return Err(Error::invalid_arg("range outside the region"));
        }
        Ok(Sge {
            addr: (self.addr() + offset) as u64,
            length: len as u32,
            lkey: self.lkey(),
        })
    }

    /// Re-register the region (`ibv_rereg_mr`): new translation, PD and/or access.
    ///
    /// On success the region's keys are those the device reports; they may or may not have
    /// changed (mlx5 keeps them on an in-place update). On failure, `ReregError::kind` says
    /// whether the old region is still valid; after `Cmd` the region is poisoned.
    ///
    /// # Errors
    /// `Input` (nothing changed) for empty flags, unknown flags, an empty new range, invalid
    /// access, a PD of another device, or while windows are bound; `Cmd` (with `EOPNOTSUPP`)
    /// where the provider has no re-registration (kernel rxe).
    ///
    /// # Safety
    /// With `CHANGE_TRANSLATION`, as for [`Pd::reg_mr`] for the new range.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, Nic, ReregFlags};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// let mut a = vec![0u8; 4096];
    /// let mut b = vec![0u8; 8192];
    /// // SAFETY: `a` and `b` outlive `mr`.
    /// let mut mr = unsafe { pd.reg_mr(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE) }.unwrap();
    /// unsafe { mr.rereg(ReregFlags::CHANGE_TRANSLATION, None, b.as_mut_ptr(), b.len(), Access::empty()) }
    ///     .unwrap();
    /// assert_eq!(mr.len(), 8192);
    /// ```
    pub unsafe fn rereg(
        &mut self,
        flags: ReregFlags,
        pd: Option<&Pd>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<(), ReregError> {
        let input = |errno| Err(ReregError::new(ReregErrorKind::Input, errno));
        if flags.is_empty() || self.inner.poisoned {
            return input(libc::EINVAL);
        }
        if flags.contains(ReregFlags::CHANGE_TRANSLATION) && (len == 0 || addr.is_null()) {
            return input(libc::EINVAL);
        }
        if !access.is_empty() && !flags.contains(ReregFlags::CHANGE_ACCESS) {
            return input(libc::EINVAL);
        }
        if flags.contains(ReregFlags::CHANGE_ACCESS)
            && check_mr_access(Verb::ReregMr, access).is_err()
        {
            return input(libc::EINVAL);
        }
        if flags.contains(ReregFlags::CHANGE_PD)
            && !pd.is_some_and(|pd| pd.nic().same_device(self.inner.pd.nic()))
        {
            return input(libc::EINVAL);
        }
        let cur = &self.inner;
        let new = flags.resolve(
            MrAttrs {
                pd: &cur.pd,
                addr: cur.raw.addr,
                len: cur.raw.len,
                access: cur.access,
            },
            MrAttrs {
                pd: pd.unwrap_or(&cur.pd),
                addr: addr as usize,
                len,
                access,
            },
        );
        let (new_pd, new_addr, new_len, new_access) =
            (new.pd.clone(), new.addr, new.len, new.access);
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            // Windows bound to the region hold it; the pool never re-registers under them.
            return input(libc::EBUSY);
        };
        let backend = &*new_pd.inner.nic.backend;
        match backend.rereg_mr(
            inner.raw.handle,
            flags,
            new_pd.inner.handle,
            new_addr,
            new_len,
            new_access,
        ) {
            Ok(raw) => {
                inner.raw = raw;
                inner.pd = new_pd;
                inner.access = new_access;
                Ok(())
            }
            Err(e) => {
                if let Some(raw) = e.replaced {
                    // DO_FORK_OLD: the new registration is in force.
                    inner.raw = raw;
                    inner.pd = new_pd;
                    inner.access = new_access;
                } else if !e.kind.mr_usable() {
                    inner.poisoned = true;
                }
                Err(e)
            }
        }
    }

    /// Deregister now (`ibv_dereg_mr`), getting the region back when that fails.
    ///
    /// # Errors
    /// While a memory window is bound to the region the verb refuses (`EBUSY` on the soft NIC,
    /// `EINVAL` on rxe) and the region is returned unchanged in [`DeregError`].
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::nic::{Access, Nic};
    /// # let pd = Nic::soft().alloc_pd().unwrap();
    /// # let mut buf = vec![0u8; 64];
    /// # // SAFETY: `buf` outlives `mr`.
    /// # let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// mr.dereg().unwrap();
    /// ```
    pub fn dereg(self) -> Result<(), DeregError> {
        match self.inner.dereg() {
            Ok(()) => Ok(()),
            Err(error) => Err(DeregError { mr: self, error }),
        }
    }
}
