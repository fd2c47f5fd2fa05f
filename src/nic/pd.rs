//! The protection domain, [`Pd`]: what regions, windows and QPs are created on, and the
//! checks made before the backend sees them (access rights, `max_mr_size`, ODP support,
//! `max_qp_wr`/`max_sge`, the [`MAX_ADVISE_SGES`] bound of `advise_mr`).
//!
//! Contract: a `Pd` holds its [`Nic`]; every region, window and QP made from it holds the `Pd`,
//! so it is deallocated after the last of them (an adopted one, [`Pd::from_raw`], never).

use super::backend::Backend;
use super::error::{Error, Result, Verb};
use super::mr::{MrInner, check_mr_access};
use super::mw::MwState;
use super::qp::QpInner;
use super::{
    Access, Advice, AdviseFlags, Cq, MAX_ADVISE_SGES, Mr, Mw, MwType, Nic, Qp, QpCaps, Sge, Srq,
    leak_on_error,
};
use std::ffi::c_void;
use std::sync::Arc;

/// A protection domain. Regions, windows and QPs belong to one.
#[derive(Clone)]
pub struct Pd {
    pub(super) inner: Arc<PdInner>,
}

pub(super) struct PdInner {
    pub(super) nic: Nic,
    pub(super) handle: u64,
    /// False for a PD adopted with [`Pd::from_raw`]: its owner deallocates it.
    pub(super) owned: bool,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        if self.owned {
            leak_on_error("PD", self.handle, self.nic.backend.dealloc_pd(self.handle));
        }
    }
}

debug_fields!(Pd, |s| { "handle": s.inner.handle });

impl PartialEq for Pd {
    fn eq(&self, other: &Pd) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Pd {
    /// A PD for a `struct ibv_pd *` the caller allocated on `nic`'s context (see
    /// [`Nic::from_raw_context`]). Non-owning: dropping it does not deallocate the PD.
    ///
    /// # Errors
    /// [`Error::NoDevice`] without the `verbs` feature; `InvalidArgument` for a null `pd`, a
    /// soft NIC, or a PD of another context.
    ///
    /// # Safety
    /// `pd` is null or a live `struct ibv_pd *` that stays allocated until the returned `Pd` and
    /// every handle made from it are dropped.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Error, Nic, Pd};
    /// let nic = Nic::soft();
    /// // SAFETY: null is refused before anything is read.
    /// let e = unsafe { Pd::from_raw(&nic, std::ptr::null_mut()) }.unwrap_err();
    /// assert!(matches!(e, Error::InvalidArgument { verb: None, .. } | Error::NoDevice));
    /// ```
    pub unsafe fn from_raw(nic: &Nic, pd: *mut c_void) -> Result<Pd> {
        #[cfg(feature = "verbs")]
        {
            if pd.is_null() {
                return Err(Error::invalid_arg("null ibv_pd"));
            }
            let verbs = nic
                .as_verbs()
                .ok_or_else(|| Error::invalid_arg("Pd::from_raw needs a verbs NIC"))?;
            // SAFETY: forwarded from the caller.
            let handle = unsafe { verbs.adopt_pd(pd) }?;
            Ok(Pd {
                inner: Arc::new(PdInner {
                    nic: nic.clone(),
                    handle,
                    owned: false,
                }),
            })
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = (nic, pd);
            Err(Error::NoDevice)
        }
    }

    /// The NIC this PD belongs to.
    pub fn nic(&self) -> &Nic {
        &self.inner.nic
    }

    /// A number that identifies this PD while any handle to it lives (what `==` compares),
    /// for lock-free lookups.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The backend's handle (`struct ibv_pd *` on verbs, a table index on the soft NIC).
    pub fn as_raw(&self) -> u64 {
        self.inner.handle
    }

    pub(super) fn backend(&self) -> &dyn Backend {
        &*self.inner.nic.backend
    }

    /// Register `[addr, addr + len)` with `access` (`ibv_reg_mr`). With
    /// [`Access::ON_DEMAND`] the region is an explicit ODP region: nothing is pinned, pages are
    /// faulted in by the NIC or by [`Pd::advise_mr`].
    ///
    /// # Errors
    /// `InvalidArgument` for an empty range or `REMOTE_WRITE`/`REMOTE_ATOMIC` without
    /// `LOCAL_WRITE`; `Limit` above `max_mr_size`; `Unsupported` for ODP on a device without it;
    /// otherwise the verb's errno (`ENOMEM` past the memlock limit or `max_mr`, `EFAULT` for
    /// unmapped memory).
    ///
    /// # Safety
    /// The range must stay mapped while the region (and any window bound to it) lives, and the
    /// caller must tolerate the NIC reading and writing it as the access flags allow, at any
    /// time, outside Rust's aliasing rules.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, Nic};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// let mut buf = vec![0u8; 4096];
    /// // SAFETY: `buf` outlives `mr`.
    /// let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }.unwrap();
    /// assert_eq!(mr.len(), 4096);
    /// ```
    pub unsafe fn reg_mr(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        if len == 0 {
            return Err(Error::invalid(Verb::RegMr, "zero-length region"));
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.reg_mr_unchecked_len(addr, len, access) }
    }

    /// Register an implicit ODP region over the whole address space (`ibv_reg_mr(pd, NULL,
    /// SIZE_MAX, access | ON_DEMAND)`).
    ///
    /// # Errors
    /// `Unsupported` when the device lacks implicit ODP (kernel rxe, most devices).
    ///
    /// # Safety
    /// Every mapped page of the process becomes reachable by the NIC with `access`.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, Nic};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// // SAFETY: the test accepts NIC access to its address space.
    /// let mr = unsafe { pd.reg_mr_implicit_odp(Access::LOCAL_WRITE) }.unwrap();
    /// assert_eq!(mr.len(), usize::MAX);
    /// ```
    pub unsafe fn reg_mr_implicit_odp(&self, access: Access) -> Result<Mr> {
        if !self.nic().caps().odp.implicit {
            return Err(Error::unsupported(
                Verb::RegMr,
                "implicit ODP is not supported by this device",
            ));
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            self.reg_mr_unchecked_len(std::ptr::null_mut(), usize::MAX, access | Access::ON_DEMAND)
        }
    }

    unsafe fn reg_mr_unchecked_len(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        check_mr_access(Verb::RegMr, access)?;
        let caps = self.nic().caps();
        if access.contains(Access::ON_DEMAND) && !caps.odp.explicit {
            return Err(Error::unsupported(
                Verb::RegMr,
                "on-demand paging is not supported by this device",
            ));
        }
        if len != usize::MAX && len as u64 > caps.max_mr_size {
            return Err(Error::Limit {
                verb: Verb::RegMr,
                limit: "max_mr_size",
                max: caps.max_mr_size,
            });
        }
        let raw = self
            .backend()
            .reg_mr(self.inner.handle, addr as usize, len, access)?;
        Ok(Mr {
            inner: Arc::new(MrInner::new(self.clone(), raw, access)),
        })
    }

    /// Give the kernel advice about ranges of ODP regions of this PD (`ibv_advise_mr`).
    ///
    /// # Errors
    /// As `ibv_advise_mr(3)`: `EINVAL` for an empty list, bad flags, a window's key or a non-ODP
    /// region; `EFAULT` out of the region's bounds, for pages outside the process address space
    /// (with `FLUSH`) or for an lkey naming nothing; `ENOENT` for a stale lkey; `EPERM` for
    /// `PrefetchWrite` on a non-writable region or a region of another PD; `Unsupported` on a
    /// device without the verb; `Limit` above [`MAX_ADVISE_SGES`] entries (the kernel's bound;
    /// `max_sge` does not apply). Without `FLUSH` the prefetch
    /// itself is postponed and best-effort: its page errors are not reported.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, AdviseFlags, Advice, Nic};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// let mut buf = memmap2::MmapMut::map_anon(1 << 16).unwrap();
    /// // SAFETY: `buf` outlives `mr`.
    /// let mr = unsafe {
    ///     pd.reg_mr(buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE | Access::ON_DEMAND)
    /// }.unwrap();
    /// pd.advise_mr(Advice::PrefetchWrite, AdviseFlags::FLUSH, &[mr.sge(0, 1 << 16).unwrap()])
    ///     .unwrap();
    /// ```
    pub fn advise_mr(&self, advice: Advice, flags: AdviseFlags, sges: &[Sge]) -> Result<()> {
        if sges.is_empty() {
            return Err(Error::from_errno(Verb::AdviseMr, libc::EINVAL));
        }
        if sges.len() > MAX_ADVISE_SGES {
            return Err(Error::Limit {
                verb: Verb::AdviseMr,
                limit: "advise_mr list length",
                max: MAX_ADVISE_SGES as u64,
            });
        }
        self.backend()
            .advise_mr(self.inner.handle, advice, flags, sges)
    }

    /// Allocate a memory window of type `ty` (`ibv_alloc_mw`).
    ///
    /// # Errors
    /// `Unsupported` when the device lacks that window type; `ENOMEM` past `max_mw`.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{MwType, Nic};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// let mw = pd.alloc_mw(MwType::Type2).unwrap();
    /// assert_eq!(mw.mw_type(), MwType::Type2);
    /// ```
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw> {
        let caps = self.nic().caps();
        let (supported, missing) = match ty {
            MwType::Type1 => (caps.mw_type1, "type 1 memory windows are not supported"),
            MwType::Type2 => (caps.mw_type2, "type 2 memory windows are not supported"),
        };
        if !supported {
            return Err(Error::unsupported(Verb::AllocMw, missing));
        }
        let (handle, rkey) = self.backend().alloc_mw(self.inner.handle, ty)?;
        Ok(Mw {
            pd: self.clone(),
            handle,
            ty,
            cur: MwState {
                rkey,
                ..Default::default()
            },
            before_bind: None,
        })
    }

    /// Create an RC queue pair using `send_cq` and `recv_cq`.
    ///
    /// # Errors
    /// `Limit` above `max_qp_wr`/`max_sge`, or the `ibv_create_qp` failure.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Nic, QpCaps};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd().unwrap();
    /// let cq = nic.create_cq(16).unwrap();
    /// let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    /// assert!(qp.qpn() > 0);
    /// ```
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Result<Qp> {
        self.create_qp_in(send_cq, recv_cq, None, caps)
    }

    pub(super) fn create_qp_in(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        caps: QpCaps,
    ) -> Result<Qp> {
        if !self.nic().same_device(&send_cq.inner.nic)
            || !self.nic().same_device(&recv_cq.inner.nic)
        {
            return Err(Error::invalid(
                Verb::CreateQp,
                "completion queue of another device",
            ));
        }
        let dev = self.nic().caps();
        if caps.max_send_wr.max(caps.max_recv_wr) > dev.max_qp_wr {
            return Err(Error::Limit {
                verb: Verb::CreateQp,
                limit: "max_qp_wr",
                max: dev.max_qp_wr as u64,
            });
        }
        if caps.max_send_sge.max(caps.max_recv_sge) > dev.max_sge {
            return Err(Error::Limit {
                verb: Verb::CreateQp,
                limit: "max_sge",
                max: dev.max_sge as u64,
            });
        }
        let (handle, qpn, caps) = self.backend().create_qp(
            self.inner.handle,
            send_cq.inner.handle,
            recv_cq.inner.handle,
            srq.map(|s| s.handle()),
            &caps,
        )?;
        Ok(Qp {
            inner: Arc::new(QpInner {
                pd: self.clone(),
                _send_cq: send_cq.clone(),
                _recv_cq: recv_cq.clone(),
                _srq: srq.cloned(),
                handle,
                qpn,
                caps,
                owned: true,
            }),
        })
    }
}
