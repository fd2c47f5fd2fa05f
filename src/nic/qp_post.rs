//! The raw post verbs of a [`Qp`] (a second `impl Qp` block): SEND, WRITE, READ, the
//! atomics, receives, local invalidation and window binds, with the checks made before the
//! backend sees them.
//!
//! Contract: every public post refuses the `wr_id`s the crate reserves
//! ([`is_reserved_wr_id`]); the `pub(crate)` variants take any `wr_id` (the crate's own posts).
//! The raw verbs are `unsafe` where the NIC touches memory; the owned ones (`owned_post.rs`) are
//! their safe counterparts.

use super::backend::{RawBind, RawSendOp, RawSendWr};
use super::error::{Error, Result, Verb};
use super::{Access, Mr, Mw, MwType, Qp, Rkey, Sge, is_reserved_wr_id};

impl Qp {
    /// Post a send-queue request (any `wr_id`: the crate's own posts come here too).
    pub(crate) fn post(&self, wr_id: u64, sges: &[Sge], op: RawSendOp) -> Result<()> {
        if sges.len() > self.inner.caps.max_send_sge as usize {
            return Err(Error::Limit {
                verb: Verb::PostSend,
                limit: "max_send_sge",
                max: self.inner.caps.max_send_sge as u64,
            });
        }
        self.backend().post_send(
            self.inner.handle,
            &RawSendWr {
                wr_id,
                signaled: true,
                inline: false,
                solicited: false,
                sges,
                op,
            },
        )
    }

    /// Post a receive (any `wr_id`).
    pub(super) fn post_recv_any(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        if self.inner._srq.is_some() {
            return Err(Error::invalid(
                Verb::PostRecv,
                "the QP receives through its SRQ: post to the SRQ",
            ));
        }
        if sges.len() > self.inner.caps.max_recv_sge as usize {
            return Err(Error::Limit {
                verb: Verb::PostRecv,
                limit: "max_recv_sge",
                max: self.inner.caps.max_recv_sge as u64,
            });
        }
        self.backend().post_recv(self.inner.handle, wr_id, sges)
    }

    /// Refuse an application `wr_id` in the range the crate reserves ([`is_reserved_wr_id`]).
    fn app_wr_id(wr_id: u64, verb: Verb) -> Result<()> {
        if is_reserved_wr_id(wr_id) {
            return Err(Error::invalid(
                verb,
                "wr_id in the range rdma-pool reserves (top 16 bits 0x5250/0x5251)",
            ));
        }
        Ok(())
    }

    /// Post a SEND of `sges` (the raw verb; [`Qp::post_send_owned`] is the safe one).
    ///
    /// # Errors
    /// A reserved `wr_id` ([`is_reserved_wr_id`]), `Limit` above `max_send_sge`, or the
    /// `ibv_post_send` failure (the outcome of the transfer arrives as a completion).
    ///
    /// # Safety
    /// The NIC reads the memory of `sges` until the request's completion is polled: it must
    /// stay allocated and registered, and not be written, until then.
    pub unsafe fn post_send(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, sges, RawSendOp::Send)
    }

    /// Post a SEND that also invalidates `rkey` at the responder (SEND_WITH_INV).
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// As [`Qp::post_send`].
    pub unsafe fn post_send_with_inv(&self, wr_id: u64, sges: &[Sge], rkey: Rkey) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, sges, RawSendOp::SendWithInv(rkey))
    }

    /// Post an RDMA WRITE of `sges` to `remote_addr` under `rkey` (the raw verb;
    /// [`Qp::post_write_owned`] is the safe one).
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// As [`Qp::post_send`]: the NIC reads `sges` until the completion is polled.
    pub unsafe fn post_write(
        &self,
        wr_id: u64,
        sges: &[Sge],
        remote_addr: u64,
        rkey: Rkey,
    ) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, sges, RawSendOp::Write { remote_addr, rkey })
    }

    /// Post an RDMA READ from `remote_addr` under `rkey` into `sges` (the raw verb;
    /// [`Qp::post_read_owned`] is the safe one).
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// The NIC writes the memory of `sges` until the request's completion is polled: it must
    /// stay allocated and registered, and be neither read nor written by anything else, until
    /// then.
    pub unsafe fn post_read(
        &self,
        wr_id: u64,
        sges: &[Sge],
        remote_addr: u64,
        rkey: Rkey,
    ) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, sges, RawSendOp::Read { remote_addr, rkey })
    }

    /// Post an RC atomic compare-and-swap (`IBV_WR_ATOMIC_CMP_AND_SWP`): the 8 bytes at
    /// `remote_addr` under `rkey` become `swap` if they equal `compare`; their original value
    /// is written to `local` (8 bytes, `LOCAL_WRITE`). The remote address must be 8-byte
    /// aligned (else the completion is `RemInvReqErr`) and the key must carry
    /// `REMOTE_ATOMIC` (else `RemAccessErr`). The remote address must be 8-byte aligned:
    /// refused at the call (rxe refuses it at post time, hardware NAKs it as an invalid
    /// request; the soft NIC models the NAK, `RemInvReqErr`). The value's byte order is the
    /// device's: host order on the soft NIC and rxe (mlx5 hardware keeps it big-endian).
    ///
    /// # Errors
    /// `Unsupported` where the device has no atomics (`Caps::atomics`); `InvalidArgument` when
    /// `local` is not 8 bytes, `remote_addr` is not 8-byte aligned or `wr_id` is reserved; the
    /// `ibv_post_send` failure.
    ///
    /// # Safety
    /// As [`Qp::post_read`] for `local`: the NIC writes it until the completion is polled.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::*;
    /// # let (a, b) = (Nic::soft(), Nic::soft());
    /// # let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    /// # let (ca, cb) = (a.create_cq(16)?, b.create_cq(16)?);
    /// # let qa = pa.create_qp(&ca, &ca, QpCaps::default())?;
    /// # let qb = pb.create_qp(&cb, &cb, QpCaps::default())?;
    /// # qa.connect(&qb.endpoint()?)?;
    /// # qb.connect(&qa.endpoint()?)?;
    /// let mut counter = Box::new(5u64); // the peer's, registered with REMOTE_ATOMIC
    /// let mut old = Box::new(0u64);
    /// let rights = Access::LOCAL_WRITE | Access::REMOTE_ATOMIC;
    /// // SAFETY: both boxes outlive their regions and are read only after the completion.
    /// let theirs = unsafe { pb.reg_mr((&mut *counter as *mut u64).cast(), 8, rights) }?;
    /// let mine = unsafe { pa.reg_mr((&mut *old as *mut u64).cast(), 8, Access::LOCAL_WRITE) }?;
    /// unsafe { qa.post_compare_swap(1, mine.sge(0, 8)?, theirs.addr() as u64, theirs.rkey(), 5, 9) }?;
    /// assert_eq!(ca.wait_one(std::time::Duration::from_secs(5))?.status, WcStatus::Success);
    /// assert_eq!((*old, *counter), (5, 9));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn post_compare_swap(
        &self,
        wr_id: u64,
        local: Sge,
        remote_addr: u64,
        rkey: Rkey,
        compare: u64,
        swap: u64,
    ) -> Result<()> {
        self.atomic_args(wr_id, &local, remote_addr)?;
        let op = RawSendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        };
        self.post(wr_id, &[local], op)
    }

    /// Post an RC atomic fetch-and-add (`IBV_WR_ATOMIC_FETCH_AND_ADD`): `add` is added
    /// (wrapping) to the 8 bytes at `remote_addr` under `rkey`; their original value is written
    /// to `local`. Alignment, rights and byte order as [`Qp::post_compare_swap`].
    ///
    /// # Errors
    /// As [`Qp::post_compare_swap`].
    ///
    /// # Safety
    /// As [`Qp::post_compare_swap`].
    pub unsafe fn post_fetch_add(
        &self,
        wr_id: u64,
        local: Sge,
        remote_addr: u64,
        rkey: Rkey,
        add: u64,
    ) -> Result<()> {
        self.atomic_args(wr_id, &local, remote_addr)?;
        let op = RawSendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        };
        self.post(wr_id, &[local], op)
    }

    /// The checks every atomic post makes before the device sees it.
    fn atomic_args(&self, wr_id: u64, local: &Sge, remote_addr: u64) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        if !self.pd().nic().caps().atomics {
            return Err(Error::unsupported(
                Verb::PostSend,
                "the device has no RC atomics (atomic_cap IBV_ATOMIC_NONE)",
            ));
        }
        if local.length != 8 {
            return Err(Error::invalid(
                Verb::PostSend,
                "an atomic's local buffer is exactly 8 bytes",
            ));
        }
        if remote_addr % 8 != 0 {
            return Err(Error::invalid(
                Verb::PostSend,
                "an atomic's remote address is 8-byte aligned",
            ));
        }
        Ok(())
    }

    /// Post a LOCAL_INV of `rkey` (a type 2 window bound on this QP). Touches no memory.
    ///
    /// # Errors
    /// A reserved `wr_id`, or the `ibv_post_send` failure.
    pub fn post_local_inv(&self, wr_id: u64, rkey: Rkey) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, &[], RawSendOp::LocalInv(rkey))
    }

    /// Post a LOCAL_INV of the window `mw`, recording it in `mw`: once the completion is passed
    /// to [`Mw::settle`], the window lets go of its region and QP.
    ///
    /// # Errors
    /// A reserved `wr_id`, or the `ibv_post_send` failure (nothing recorded then).
    pub fn post_invalidate(&self, wr_id: u64, mw: &mut Mw) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.invalidate(wr_id, mw)
    }

    /// [`Qp::post_invalidate`] with any `wr_id` (the crate's grants).
    pub(crate) fn invalidate(&self, wr_id: u64, mw: &mut Mw) -> Result<()> {
        self.post(wr_id, &[], RawSendOp::LocalInv(mw.cur.rkey))?;
        mw.bound(mw.cur.rkey, None, None);
        Ok(())
    }

    /// Post a receive into `sges` (the raw verb; [`Qp::post_recv_owned`] is the safe one).
    ///
    /// # Errors
    /// A reserved `wr_id`, `Limit` above `max_recv_sge`, or the `ibv_post_recv` failure.
    ///
    /// # Safety
    /// The NIC writes the memory of `sges` until the request's completion is polled (or the
    /// QP is destroyed): it must stay allocated and registered, and be neither read nor
    /// written by anything else, until then.
    pub unsafe fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostRecv)?;
        self.post_recv_any(wr_id, sges)
    }

    fn bind_args(
        &self,
        wr_id: u64,
        mw: &Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<RawBind> {
        if !self.pd().nic().same_device(mw.pd.nic()) || !self.pd().nic().same_device(mr.pd().nic())
        {
            return Err(Error::invalid(
                Verb::BindMw,
                "window or region of another device",
            ));
        }
        if mr.is_poisoned() {
            return Err(Error::invalid(
                Verb::BindMw,
                "region is poisoned by a failed rereg",
            ));
        }
        if offset.checked_add(len).is_none_or(|e| e > mr.len()) {
            return Err(Error::invalid(
                Verb::BindMw,
                "window range outside the region",
            ));
        }
        if access.intersects(!(Access::REMOTE | Access::ZERO_BASED)) {
            return Err(Error::invalid(
                Verb::BindMw,
                "windows take only remote rights and ZERO_BASED",
            ));
        }
        Ok(RawBind {
            wr_id,
            signaled: true,
            mr: mr.as_raw(),
            mr_lkey: mr.lkey(),
            addr: mr.addr() + offset,
            len,
            access,
        })
    }

    /// Bind the type 1 window `mw` to `[offset, offset + len)` of `mr` with `access`
    /// (`ibv_bind_mw`). A zero `len` unbinds. The window gets a new rkey (returned and stored
    /// in `mw`); a completion with `wr_id` follows.
    ///
    /// # Errors
    /// `InvalidArgument` for a type 2 window, a range outside `mr` or a reserved `wr_id`; the
    /// verb's failure.
    ///
    /// # Safety
    /// Whoever holds the key may read or write (as `access` allows) the bound range until the
    /// window is invalidated and that completion polled: the memory must stay allocated, and
    /// not be accessed by the program in a way that conflicts with `access`, until then.
    pub unsafe fn bind_mw(
        &self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Rkey> {
        Self::app_wr_id(wr_id, Verb::BindMw)?;
        self.bind_type1(wr_id, mw, mr, offset, len, access)
    }

    /// [`Qp::bind_mw`] with any `wr_id` (the crate's grants).
    pub(crate) fn bind_type1(
        &self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Rkey> {
        let bind = self.bind_args(wr_id, mw.of_type(MwType::Type1)?, mr, offset, len, access)?;
        let rkey = self
            .backend()
            .bind_mw(self.inner.handle, mw.handle, mw.cur.rkey, &bind)?;
        mw.bound(rkey, (len > 0).then(|| mr.inner.clone()), None);
        Ok(rkey)
    }

    /// Post a BIND_MW work request binding the type 2 window `mw` to `[offset, offset + len)` of
    /// `mr`; the window is then usable only through this QP. Returns the window's new rkey (the
    /// next variant), valid once the completion reports success.
    ///
    /// # Errors
    /// `InvalidArgument` for a type 1 window, a range outside `mr` or a reserved `wr_id`; the
    /// post failure.
    ///
    /// # Safety
    /// As [`Qp::bind_mw`]: the peer may access the range until the window is invalidated.
    pub unsafe fn post_bind_mw(
        &self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Rkey> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        let variant = mw.rkey().next_variant().variant();
        self.bind_type2(wr_id, mw, mr, offset, len, access, variant)
    }

    /// [`Qp::post_bind_mw`] with any `wr_id` and the new key's 8-bit `variant` chosen by the
    /// caller (the crate's grants: an unpredictable one).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bind_type2(
        &self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
        variant: u8,
    ) -> Result<Rkey> {
        let bind = self.bind_args(wr_id, mw.of_type(MwType::Type2)?, mr, offset, len, access)?;
        let new_rkey = Rkey(mw.cur.rkey.0 & !0xff | variant as u32);
        self.post(
            wr_id,
            &[],
            RawSendOp::BindMw {
                mw: mw.handle,
                mw_rkey: mw.cur.rkey,
                new_rkey,
                bind,
            },
        )?;
        mw.bound(new_rkey, Some(mr.inner.clone()), Some(self.inner.clone()));
        Ok(new_rkey)
    }
}
