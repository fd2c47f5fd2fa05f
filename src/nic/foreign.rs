//! Foreign verbs objects: CQs and QPs another library created (rdma_cm, `sideway`, C code),
//! adopted without ownership so that pools, grants and owned posts work on them.
//!
//! Contract:
//! - [`Cq::from_raw`] and [`Qp::from_raw`] wrap a `struct ibv_cq *` / `struct ibv_qp *` of the
//!   NIC's context without taking it over: dropping the wrapper destroys nothing, and the
//!   caller keeps the object alive longer than every wrapper (and every grant and owned
//!   request made through it). Wrap each foreign CQ once, and pass that wrapper to every
//!   `Qp::from_raw` of a QP that completes there: owned requests are matched to their
//!   completions per wrapper.
//! - rdma-pool posts on a foreign QP too: each grant is a bind (type 2 window) and later an
//!   invalidation, so a grant in flight holds up to **2 send-queue slots** of its QP and **2
//!   entries** of its send CQ until their completions are polled; an owned request holds one
//!   of each, as the application's own. Size the foreign QP and CQ for them.
//! - The crate's completions must reach it: poll the CQ through the wrapper ([`Cq::poll`]
//!   and the waits route them), or, where the other library polls, hand each completion to
//!   [`Cq::deliver`] (which routes grants' and owned requests' completions, and tells which
//!   were the crate's). [`Completion::from_raw`] converts a `struct ibv_wc` for it.
//!
//! Invariant: a wrapper's `owned` flag is false, so its `Drop` never calls a destroy verb.

use super::error::{Error, Result};
use super::{Completion, Cq, Nic, Pd, Qp};
#[cfg(feature = "verbs")]
use super::{cq::CqInner, inflight::Inflight, qp::QpInner};
use std::ffi::c_void;
#[cfg(feature = "verbs")]
use std::sync::Arc;

impl Cq {
    /// A CQ for a `struct ibv_cq *` created on `nic`'s context by someone else (see the
    /// module contract). Non-owning. Its completion channel, if any, stays the owner's: arm
    /// and wait on it there.
    ///
    /// # Errors
    /// [`Error::NoDevice`] without the `verbs` feature; `InvalidArgument` for a null `cq`, a
    /// soft NIC, or a CQ of another context.
    ///
    /// # Safety
    /// `cq` is null or a live `struct ibv_cq *` that stays alive until the returned `Cq` and
    /// every handle made from it (QPs, owned requests) are dropped.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Cq, Error, Nic};
    /// let nic = Nic::soft();
    /// // SAFETY: null is refused before anything is read.
    /// let e = unsafe { Cq::from_raw(&nic, std::ptr::null_mut()) }.unwrap_err();
    /// assert!(matches!(e, Error::InvalidArgument { verb: None, .. } | Error::NoDevice));
    /// ```
    pub unsafe fn from_raw(nic: &Nic, cq: *mut c_void) -> Result<Cq> {
        #[cfg(feature = "verbs")]
        {
            if cq.is_null() {
                return Err(Error::invalid_arg("null ibv_cq"));
            }
            let verbs = nic
                .as_verbs()
                .ok_or_else(|| Error::invalid_arg("Cq::from_raw needs a verbs NIC"))?;
            // SAFETY: forwarded from the caller.
            let handle = unsafe { verbs.adopt_cq(cq) }?;
            Ok(Cq {
                inner: Arc::new(CqInner {
                    nic: nic.clone(),
                    handle,
                    inflight: Inflight::default(),
                    channel: None,
                    owned: false,
                }),
            })
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = (nic, cq);
            Err(Error::NoDevice)
        }
    }

    /// Hand over a completion of this CQ that another library polled: an owned request's
    /// goes to its [`Posted`](super::Posted) handle, a grant's to its pool; returns true for
    /// those (the crate's: the caller ignores them) and false for the application's.
    ///
    /// # Safety
    /// `wc` was polled from this CQ by the device and is handed over once (a forged or
    /// repeated completion could end a grant's revocation while its key still works, or hand
    /// back a buffer the NIC still writes).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Completion, Nic};
    /// let cq = Nic::soft().create_cq(4)?;
    /// let wc = Completion { wr_id: 7, ..Completion::default() };
    /// // SAFETY: an application completion: not the crate's, nothing is routed.
    /// assert!(!unsafe { cq.deliver(&wc) });
    /// # Ok::<(), rdma_pool::nic::Error>(())
    /// ```
    pub unsafe fn deliver(&self, wc: &Completion) -> bool {
        self.route(wc)
    }
}

impl Completion {
    /// A `struct ibv_wc` another library polled (feature `verbs`), as a [`Completion`] for
    /// [`Cq::deliver`]: immediate data in host order, the invalidated rkey when
    /// `IBV_WC_WITH_INV` is set.
    ///
    /// # Safety
    /// `wc` points at a readable, initialised `struct ibv_wc`.
    #[cfg(feature = "verbs")]
    pub unsafe fn from_raw(wc: *const c_void) -> Completion {
        // SAFETY: forwarded from the caller.
        unsafe { super::verbs::completion_from_raw(wc) }
    }
}

impl Qp {
    /// A QP rdma_cm created for this crate (`rdma_create_qp` in `pd` on these CQs): owned,
    /// destroyed with `ibv_destroy_qp` when the last handle is dropped.
    ///
    /// # Safety
    /// `qp` is a live RC QP of `pd`'s context, created in `pd` on `send_cq`/`recv_cq` (and
    /// `srq`), that nothing else destroys.
    #[cfg(feature = "verbs")]
    pub(crate) unsafe fn adopt_owned(
        pd: &Pd,
        qp: *mut c_void,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&super::Srq>,
    ) -> Result<Qp> {
        let verbs = pd
            .nic()
            .as_verbs()
            .ok_or_else(|| Error::invalid_arg("rdma_cm needs a verbs NIC"))?;
        // SAFETY: forwarded from the caller.
        let q = unsafe { verbs.adopt_qp(qp) }?;
        Ok(Qp {
            inner: Arc::new(QpInner {
                pd: pd.clone(),
                _send_cq: send_cq.clone(),
                _recv_cq: recv_cq.clone(),
                _srq: srq.cloned(),
                handle: q.handle,
                qpn: q.qpn,
                caps: q.caps,
                owned: true,
            }),
        })
    }

    /// A QP for an RC `struct ibv_qp *` created by someone else (rdma_cm, `sideway`, C code)
    /// in `pd`, completing on `send_cq` and `recv_cq` (the wrappers of its CQs, see the
    /// module contract). Non-owning. Its sizes are read from the device (`ibv_query_qp`).
    /// Connecting it stays its owner's business; [`Qp::connect`] works too.
    ///
    /// # Errors
    /// [`Error::NoDevice`] without the `verbs` feature; `InvalidArgument` for a null `qp`, a
    /// soft NIC, a QP of another context, or when `pd`, `send_cq` or `recv_cq` is not the
    /// QP's; `Unsupported` for a QP that is not RC; the `ibv_query_qp` failure.
    ///
    /// # Safety
    /// `qp` is null or a live `struct ibv_qp *` that stays alive (not destroyed, not reset)
    /// until the returned `Qp` and every grant and owned request made through it are dropped
    /// or completed.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Error, Nic, Qp};
    /// let nic = Nic::soft();
    /// let (pd, cq) = (nic.alloc_pd()?, nic.create_cq(4)?);
    /// // SAFETY: null is refused before anything is read.
    /// let e = unsafe { Qp::from_raw(&pd, std::ptr::null_mut(), &cq, &cq) }.unwrap_err();
    /// assert!(matches!(e, Error::InvalidArgument { verb: None, .. } | Error::NoDevice));
    /// # Ok::<(), Error>(())
    /// ```
    pub unsafe fn from_raw(pd: &Pd, qp: *mut c_void, send_cq: &Cq, recv_cq: &Cq) -> Result<Qp> {
        #[cfg(feature = "verbs")]
        {
            if qp.is_null() {
                return Err(Error::invalid_arg("null ibv_qp"));
            }
            let verbs = pd
                .nic()
                .as_verbs()
                .ok_or_else(|| Error::invalid_arg("Qp::from_raw needs a verbs NIC"))?;
            // SAFETY: forwarded from the caller.
            let q = unsafe { verbs.adopt_qp(qp) }?;
            if q.pd != pd.as_raw() {
                return Err(Error::invalid_arg("the ibv_qp is in another PD"));
            }
            if q.send_cq != send_cq.inner.handle || q.recv_cq != recv_cq.inner.handle {
                return Err(Error::invalid_arg(
                    "send_cq/recv_cq are not the CQs of the ibv_qp",
                ));
            }
            Ok(Qp {
                inner: Arc::new(QpInner {
                    pd: pd.clone(),
                    _send_cq: send_cq.clone(),
                    _recv_cq: recv_cq.clone(),
                    _srq: None,
                    handle: q.handle,
                    qpn: q.qpn,
                    caps: q.caps,
                    owned: false,
                }),
            })
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = (pd, qp, send_cq, recv_cq);
            Err(Error::NoDevice)
        }
    }
}
