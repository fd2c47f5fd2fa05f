//! The reliable-connected queue pair, [`Qp`]: the handle, what it holds alive, and its
//! connection (endpoint, INIT → RTR → RTS, state). The raw post verbs are a second `impl Qp`
//! block in `qp_post.rs`, the owned ones in `owned_post.rs`, the batches in `post.rs`.
//!
//! Contract: a `Qp` holds its PD, its CQs and its SRQ, so they are destroyed after it;
//! destroying it flushes its owned requests back to their handles (`owned.rs`).

use super::backend::Backend;
use super::error::{Error, Result, Verb};
use super::{ConnectOptions, Cq, Endpoint, Pd, QpCaps, QpState, Srq, leak_on_error};
use std::sync::Arc;

/// A reliable-connected queue pair.
///
/// # Examples
/// The raw verbs (the owned posts, [`Qp::post_send_owned`] and siblings, need no `unsafe`):
/// SEND into a posted receive, then a grant through a type 2 window and its revocation.
/// ```
/// use rdma_pool::nic::{Access, Buffer, MwType, Nic, QpCaps, WcStatus};
/// use std::time::Duration;
/// let (nic, peer) = (Nic::soft(), Nic::soft());
/// let (pd, ppd) = (nic.alloc_pd()?, peer.alloc_pd()?);
/// let (cq, pcq) = (nic.create_cq(16)?, peer.create_cq(16)?);
/// let qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
/// let pqp = ppd.create_qp(&pcq, &pcq, QpCaps::default())?;
/// qp.connect(&pqp.endpoint()?)?;
/// pqp.connect(&qp.endpoint()?)?;
/// let t = Duration::from_secs(5);
///
/// let (mut a, mut b) = (Buffer::new(4096)?, Buffer::new(4096)?);
/// a.as_mut_slice()[..4].copy_from_slice(b"ping");
/// // SAFETY: the buffers outlive their regions.
/// let amr = unsafe { pd.reg_mr(a.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }?;
/// let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::MW_BIND;
/// // SAFETY: as above.
/// let bmr = unsafe { ppd.reg_mr(b.as_mut_ptr(), 4096, rw) }?;
/// // SAFETY: `a` and `b` are not touched until the completions are polled below.
/// unsafe {
///     pqp.post_recv(1, &[bmr.sge(0, 4096)?])?;
///     qp.post_send(2, &[amr.sge(0, 4)?])?;
/// }
/// assert_eq!(cq.wait_one(t)?.status, WcStatus::Success);
/// assert_eq!(pcq.wait_one(t)?.byte_len, 4);
///
/// // Grant the first 64 bytes of `b` to this QP's peer only, then revoke.
/// let mut mw = ppd.alloc_mw(MwType::Type2)?;
/// // SAFETY: `b` outlives the window, and the peer only reads it.
/// let rkey = unsafe { pqp.post_bind_mw(3, &mut mw, &bmr, 0, 64, Access::REMOTE_READ) }?;
/// assert_eq!(pcq.wait_one(t)?.status, WcStatus::Success);
/// // SAFETY: `a` is not touched until the completion is polled.
/// unsafe { qp.post_read(4, &[amr.sge(0, 64)?], bmr.addr() as u64, rkey) }?;
/// assert_eq!(cq.wait_one(t)?.status, WcStatus::Success);
/// assert_eq!(&a.as_slice()[..4], b"ping");
/// pqp.post_local_inv(5, rkey)?;
/// assert_eq!(pcq.wait_one(t)?.status, WcStatus::Success);
/// // SAFETY: as above.
/// unsafe { qp.post_read(6, &[amr.sge(0, 64)?], bmr.addr() as u64, rkey) }?;
/// assert_eq!(cq.wait_one(t)?.status, WcStatus::RemAccessErr);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Qp {
    pub(super) inner: Arc<QpInner>,
}

pub(super) struct QpInner {
    pub(super) pd: Pd,
    pub(super) _send_cq: Cq,
    pub(super) _recv_cq: Cq,
    /// The shared receive queue it receives through (destroyed after the QP).
    pub(super) _srq: Option<Srq>,
    pub(super) handle: u64,
    pub(super) qpn: u32,
    pub(super) caps: QpCaps,
    /// False for a QP adopted with [`Qp::from_raw`]: its owner destroys it.
    pub(super) owned: bool,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let destroyed = self.pd.backend().destroy_qp(self.handle);
        // Owned requests: the device can no longer touch their buffers, so they come back
        // flushed (a completion made before the destruction replaces the flush when a poll
        // finds it first) and the parked ones are dropped; their slots stay tombstones while
        // such a completion may be left (`owned.rs`). If the QP could not be destroyed, its
        // requests stay as they are: their completions may still come, the buffers with them.
        if destroyed.is_ok() {
            for cq in [&self._send_cq, &self._recv_cq] {
                cq.inner.inflight.qp_gone(self.qpn);
            }
        }
        leak_on_error("QP", self.handle, destroyed);
    }
}

debug_fields!(Qp, |s| { "qpn": s.inner.qpn });

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }
    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }
    /// The backend's handle (`struct ibv_qp *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.inner.handle
    }
    pub(super) fn backend(&self) -> &dyn Backend {
        self.inner.pd.backend()
    }

    /// What the peer needs to connect to this QP.
    ///
    /// # Errors
    /// The port/GID query failure.
    pub fn endpoint(&self) -> Result<Endpoint> {
        self.endpoint_with(0)
    }

    /// What the peer needs to connect to this QP, with the GID at `gid_index` (RoCE v2 over
    /// IPv4: the index of the address's GID).
    ///
    /// # Errors
    /// The port/GID query failure (`ENODATA` for an empty GID; the soft NIC has index 0
    /// only).
    pub fn endpoint_with(&self, gid_index: u8) -> Result<Endpoint> {
        self.backend().endpoint(self.inner.handle, gid_index)
    }

    /// Connect to `remote` (INIT → RTR → RTS) with the default [`ConnectOptions`].
    ///
    /// # Errors
    /// The `ibv_modify_qp` failure; on the soft NIC, `EINVAL` when no such peer QP exists.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        self.connect_with(remote, &ConnectOptions::default())
    }

    /// Connect to `remote` with `opts`: GID index, path MTU (capped at the port's), ACK
    /// timeout, retry and RNR counts.
    ///
    /// # Errors
    /// `InvalidArgument` for an option out of range ([`ConnectOptions::check`]) or an
    /// endpoint whose numbers are ([`Endpoint::check`]); as [`Qp::connect`].
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{ConnectOptions, Nic, QpCaps};
    /// let (a, b) = (Nic::soft(), Nic::soft());
    /// let (ca, cb) = (a.create_cq(4)?, b.create_cq(4)?);
    /// let qa = a.alloc_pd()?.create_qp(&ca, &ca, QpCaps::default())?;
    /// let qb = b.alloc_pd()?.create_qp(&cb, &cb, QpCaps::default())?;
    /// let opts = ConnectOptions { path_mtu: Some(1024), retry_cnt: 3, rnr_retry: 0, ..ConnectOptions::default() };
    /// qa.connect_with(&qb.endpoint()?, &opts)?;
    /// qb.connect_with(&qa.endpoint()?, &opts)?;
    /// # Ok::<(), rdma_pool::nic::Error>(())
    /// ```
    pub fn connect_with(&self, remote: &Endpoint, opts: &ConnectOptions) -> Result<()> {
        opts.check()?;
        remote
            .check()
            .map_err(|detail| Error::invalid(Verb::ModifyQp, detail))?;
        self.backend().connect_qp(self.inner.handle, remote, opts)
    }

    /// The QP's state.
    ///
    /// # Errors
    /// The `ibv_query_qp` failure.
    pub fn state(&self) -> Result<QpState> {
        self.backend().qp_state(self.inner.handle)
    }

    /// The shared receive queue it receives through, if any.
    pub fn srq(&self) -> Option<&Srq> {
        self.inner._srq.as_ref()
    }
}
