//! The memory window, [`Mw`]: a sub-range of a region with its own rkey and rights, and the
//! record of its binding (what it holds alive, the state to restore when a bind fails).
//!
//! Contract: a bound window holds its region (and, for type 2, its QP) until the next bind or
//! invalidation is settled ([`Mw::settle`]); it is deallocated before the QP it holds is
//! destroyed. The binds themselves are posted by the QP (`qp_post.rs`).

use super::error::{Error, Result, Verb};
use super::mr::MrInner;
use super::qp::QpInner;
use super::{MwType, Pd, Rkey, WcStatus, leak_on_error};
use std::sync::Arc;

/// A memory window: a sub-range of a region with its own rkey and rights.
pub struct Mw {
    pub(super) pd: Pd,
    pub(super) handle: u64,
    pub(super) ty: MwType,
    pub(super) cur: MwState,
    /// The state before the last bind, for [`Mw::bind_failed`].
    pub(super) before_bind: Option<MwState>,
}

/// A window's key and what its binding holds alive (the region; for type 2, the QP).
#[derive(Default)]
pub(super) struct MwState {
    pub(super) rkey: Rkey,
    /// Held so the region outlives the binding (dereg waits for the window).
    pub(super) _mr: Option<Arc<MrInner>>,
    /// Held so a type 2 window is deallocated before its QP is destroyed.
    pub(super) _qp: Option<Arc<QpInner>>,
}

debug_fields!(Mw, |s| { "type": s.ty, "rkey": s.cur.rkey });

impl Mw {
    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.ty
    }
    /// The window's current rkey (updated by every bind this handle made).
    pub fn rkey(&self) -> Rkey {
        self.cur.rkey
    }
    /// The backend's handle (`struct ibv_mw *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.handle
    }
    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// `self`, if it is a window of type `ty` (type 1 binds with `ibv_bind_mw`, type 2 with a
    /// BIND_MW work request).
    pub(super) fn of_type(&self, ty: MwType) -> Result<&Mw> {
        if self.ty != ty {
            let why = match ty {
                MwType::Type1 => "ibv_bind_mw binds type 1 windows only",
                MwType::Type2 => "BIND_MW work requests bind type 2 windows only",
            };
            return Err(Error::invalid(Verb::BindMw, why));
        }
        Ok(self)
    }

    /// Record a bind (or invalidation) that was posted: the new key and what it binds. The
    /// previous state stays alive until [`Mw::settle`].
    pub(super) fn bound(&mut self, rkey: Rkey, mr: Option<Arc<MrInner>>, qp: Option<Arc<QpInner>>) {
        let before = std::mem::replace(
            &mut self.cur,
            MwState {
                rkey,
                _mr: mr,
                _qp: qp,
            },
        );
        self.before_bind = Some(before);
    }

    /// Tell the window how its last bind or invalidation completed (pass the completion's
    /// status). On success, what the previous binding held alive (its region, its QP) is
    /// released; on failure, the previous key and binding are restored, as `ibv_bind_mw(3)` tells
    /// the caller to do. Until then both are kept, since the device may still use either.
    /// Returns false when nothing was pending.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, MwType, Nic, QpCaps, WcStatus};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd().unwrap();
    /// let cq = nic.create_cq(8).unwrap();
    /// let (q1, q2) = (pd.create_qp(&cq, &cq, QpCaps::default()).unwrap(), pd.create_qp(&cq, &cq, QpCaps::default()).unwrap());
    /// q1.connect(&q2.endpoint().unwrap()).unwrap();
    /// let mut buf = vec![0u8; 64];
    /// // SAFETY: `buf` outlives the region. (No MW_BIND right: the bind will fail.)
    /// let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// let mut mw = pd.alloc_mw(MwType::Type1).unwrap();
    /// let old = mw.rkey();
    /// // SAFETY: `buf` outlives the window (the bind fails anyway).
    /// unsafe { q1.bind_mw(1, &mut mw, &mr, 0, 64, Access::REMOTE_READ) }.unwrap();
    /// let wc = cq.poll_one().unwrap().unwrap();
    /// assert_ne!(wc.status, WcStatus::Success);
    /// assert!(mw.settle(wc.status));
    /// assert_eq!(mw.rkey(), old);
    /// ```
    pub fn settle(&mut self, status: WcStatus) -> bool {
        match self.before_bind.take() {
            Some(before) if status != WcStatus::Success => {
                self.cur = before;
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// Shorthand for [`Mw::settle`] with a failed status.
    pub fn bind_failed(&mut self) -> bool {
        self.settle(WcStatus::MwBindErr)
    }

    /// Deallocate now (`ibv_dealloc_mw`), which kills every key of the window, and say how it
    /// went (dropping deallocates too, logging a failure).
    ///
    /// # Errors
    /// The verb's failure, with the window back unchanged: its key may still work.
    ///
    /// # Examples
    /// ```
    /// let pd = rdma_pool::nic::Nic::soft().alloc_pd().unwrap();
    /// let mw = pd.alloc_mw(rdma_pool::nic::MwType::Type1).unwrap();
    /// assert!(mw.dealloc().is_ok());
    /// ```
    #[allow(clippy::result_large_err)] // the window comes back on the rare failure
    pub fn dealloc(self) -> std::result::Result<(), (Mw, Error)> {
        if let Err(e) = self.pd.backend().dealloc_mw(self.handle) {
            return Err((self, e));
        }
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; each field is moved out once, and
        // dropped after the window is gone (its QP and region may go now).
        drop(unsafe {
            (
                std::ptr::read(&me.cur),
                std::ptr::read(&me.before_bind),
                std::ptr::read(&me.pd),
            )
        });
        Ok(())
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        leak_on_error("MW", self.handle, self.pd.backend().dealloc_mw(self.handle));
        // The bound QP and MR (fields) are released after the window: type 2 windows must be
        // deallocated before their QP is destroyed (rxe stalls otherwise).
    }
}
