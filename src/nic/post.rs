//! The send-queue verbs beyond one signaled request: immediate data, inline payloads,
//! unsignaled requests and batches posted with one call (one doorbell on hardware).
//!
//! Contract:
//! - a batch is checked whole before anything is posted (reserved `wr_id`s, `max_send_sge`,
//!   inline size and operation): a bad batch posts nothing and says which request was bad;
//!   past the checks, a device refusal leaves the requests before it posted, and
//!   [`BatchError::posted`] says how many;
//! - an inline request's bytes are copied during the post: [`Qp::post_inline`] takes a plain
//!   slice and is safe; the NIC never reads that memory again;
//! - an unsignaled request holds its send-queue slot until a later signaled request of the
//!   same QP completes ([`SendFlags::SIGNALED`]); rdma-pool's own requests on a QP (grant
//!   binds and invalidations) are always signaled.
//!
//! Invariant: `posted <= wrs.len()`, and `posted == 0` for every error found by the checks.

use super::backend::{RawSendOp, RawSendWr};
use super::error::{Error, Verb};
use super::types::{Lkey, QpCaps, SendFlags, SendOp, SendWr, Sge};
use super::{Qp, is_reserved_wr_id};

/// A batch post that failed ([`Qp::post_send_wrs`]).
#[derive(Debug, thiserror::Error)]
#[error("{posted} of the batch posted, then: {error}")]
pub struct BatchError {
    /// How many requests, from the first, were posted (their completions will come).
    pub posted: usize,
    /// Why the next one was not.
    #[source]
    pub error: Error,
}

impl Qp {
    /// The sizes the device granted this QP (at least those asked at creation; the inline
    /// size may be larger).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Nic, QpCaps};
    /// let nic = Nic::soft();
    /// let cq = nic.create_cq(4)?;
    /// let caps = QpCaps { max_inline_data: 64, ..QpCaps::default() };
    /// let qp = nic.alloc_pd()?.create_qp(&cq, &cq, caps)?;
    /// assert!(qp.caps().max_inline_data >= 64);
    /// # Ok::<(), rdma_pool::nic::Error>(())
    /// ```
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// Check one application request of a batch.
    fn check_wr(&self, wr: &SendWr<'_>) -> Result<(), Error> {
        if is_reserved_wr_id(wr.wr_id) {
            return Err(Error::invalid(
                Verb::PostSend,
                "wr_id in the range rdma-pool reserves (top 16 bits 0x5250/0x5251)",
            ));
        }
        let caps = &self.inner.caps;
        if wr.sges.len() > caps.max_send_sge as usize {
            return Err(Error::Limit {
                verb: Verb::PostSend,
                limit: "max_send_sge",
                max: caps.max_send_sge as u64,
            });
        }
        if wr.flags.contains(SendFlags::INLINE) {
            if matches!(wr.op, SendOp::Read { .. }) {
                return Err(Error::invalid(
                    Verb::PostSend,
                    "INLINE applies to SEND and WRITE, not READ",
                ));
            }
            let total: u64 = wr.sges.iter().map(|s| s.length as u64).sum();
            if total > caps.max_inline_data as u64 {
                return Err(Error::Limit {
                    verb: Verb::PostSend,
                    limit: "max_inline_data",
                    max: caps.max_inline_data as u64,
                });
            }
        }
        Ok(())
    }

    /// Post a batch of send-queue requests with one call (a chain of `ibv_send_wr`: one
    /// doorbell on hardware). Unsignaled requests ([`SendFlags`] without `SIGNALED`) report
    /// only errors.
    ///
    /// # Errors
    /// [`BatchError`] with `posted == 0` when a request is bad (reserved `wr_id`, more than
    /// `max_send_sge` entries, an inline payload over [`QpCaps::max_inline_data`] or an inline
    /// READ): nothing was posted. Else the device's refusal (`ENOMEM` when the send queue is
    /// full) with how many requests before it were posted.
    ///
    /// # Safety
    /// For every request that is not inline, the NIC reads (SEND, WRITE) or writes (READ) the
    /// memory of its SGEs until its completion is polled — for an unsignaled request, until
    /// the completion of a later request of this QP is polled: that memory must stay
    /// allocated and registered, and not be written (READ: not be touched) until then. An
    /// inline request's SGEs need only be readable during the call.
    ///
    /// # Examples
    /// Three WRITEs with immediate data in one post, only the last signaled: the responder's
    /// receives report each immediate.
    /// ```
    /// use rdma_pool::nic::*;
    /// use std::time::Duration;
    /// # let (a, b) = (Nic::soft(), Nic::soft());
    /// # let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    /// # let (ca, cb) = (a.create_cq(16)?, b.create_cq(16)?);
    /// # let qa = pa.create_qp(&ca, &ca, QpCaps::default())?;
    /// # let qb = pb.create_qp(&cb, &cb, QpCaps::default())?;
    /// # qa.connect(&qb.endpoint()?)?;
    /// # qb.connect(&qa.endpoint()?)?;
    /// let mut dst = Buffer::new(4096)?; // the responder's
    /// let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    /// // SAFETY: `dst` outlives the region.
    /// let mr = unsafe { pb.reg_mr(dst.as_mut_ptr(), 4096, rw) }?;
    /// for i in 0..3 {
    ///     // SAFETY: no memory: the receives only take the immediates.
    ///     unsafe { qb.post_recv(i, &[]) }?;
    /// }
    /// let data = *b"abc";
    /// let sge = |i: usize| Sge { addr: data[i..].as_ptr() as u64, length: 1, lkey: Lkey(0) };
    /// let sges = [[sge(0)], [sge(1)], [sge(2)]];
    /// let wrs: Vec<SendWr> = (0..3)
    ///     .map(|i| {
    ///         let op = SendOp::WriteWithImm { remote_addr: mr.addr() as u64 + i as u64, rkey: mr.rkey(), imm: 100 + i as u32 };
    ///         let flags = if i == 2 { SendFlags::SIGNALED } else { SendFlags::empty() };
    ///         SendWr::new(i as u64, op, &sges[i]).flags(flags | SendFlags::INLINE)
    ///     })
    ///     .collect();
    /// // SAFETY: inline: the bytes are copied during the call.
    /// unsafe { qa.post_send_wrs(&wrs) }?;
    /// assert_eq!(ca.wait_one(Duration::from_secs(5))?.wr_id, 2);
    /// for i in 0..3 {
    ///     let wc = cb.wait_one(Duration::from_secs(5))?;
    ///     assert_eq!((wc.opcode, wc.imm_data, wc.byte_len), (WcOpcode::RecvRdmaWithImm, Some(100 + i), 1));
    /// }
    /// assert_eq!(&dst.as_slice()[..3], b"abc");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn post_send_wrs(&self, wrs: &[SendWr<'_>]) -> Result<(), BatchError> {
        for wr in wrs {
            self.check_wr(wr)
                .map_err(|error| BatchError { posted: 0, error })?;
        }
        let raw: Vec<RawSendWr<'_>> = wrs
            .iter()
            .map(|wr| RawSendWr {
                wr_id: wr.wr_id,
                signaled: wr.flags.contains(SendFlags::SIGNALED),
                inline: wr.flags.contains(SendFlags::INLINE),
                solicited: wr.flags.contains(SendFlags::SOLICITED),
                sges: wr.sges,
                op: RawSendOp::from_public(wr.op),
            })
            .collect();
        self.backend()
            .post_send_list(self.inner.handle, &raw)
            .map_err(|(posted, error)| BatchError { posted, error })
    }

    /// Post one request ([`Qp::post_send_wrs`] of one).
    ///
    /// # Errors
    /// As [`Qp::post_send_wrs`], without the count.
    ///
    /// # Safety
    /// As [`Qp::post_send_wrs`].
    pub unsafe fn post_send_wr(&self, wr: &SendWr<'_>) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.post_send_wrs(std::slice::from_ref(wr)) }.map_err(|e| e.error)
    }

    /// Post a SEND carrying `imm` (`IBV_WR_SEND_WITH_IMM`): the responder's receive completes
    /// with `imm_data == Some(imm)`.
    ///
    /// # Errors
    /// As [`Qp::post_send`](Qp::post_send).
    ///
    /// # Safety
    /// As [`Qp::post_send`](Qp::post_send).
    pub unsafe fn post_send_with_imm(
        &self,
        wr_id: u64,
        sges: &[Sge],
        imm: u32,
    ) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.post_send_wr(&SendWr::new(wr_id, SendOp::SendWithImm(imm), sges)) }
    }

    /// Post an RDMA WRITE carrying `imm` (`IBV_WR_RDMA_WRITE_WITH_IMM`): it consumes one
    /// receive at the responder, which completes as [`WcOpcode::RecvRdmaWithImm`](super::WcOpcode::RecvRdmaWithImm)
    /// with the length written.
    ///
    /// # Errors
    /// As [`Qp::post_send`](Qp::post_send).
    ///
    /// # Safety
    /// As [`Qp::post_send`](Qp::post_send).
    pub unsafe fn post_write_with_imm(
        &self,
        wr_id: u64,
        sges: &[Sge],
        remote_addr: u64,
        rkey: super::Rkey,
        imm: u32,
    ) -> Result<(), Error> {
        let op = SendOp::WriteWithImm {
            remote_addr,
            rkey,
            imm,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.post_send_wr(&SendWr::new(wr_id, op, sges)) }
    }

    /// Post `data` inline (SEND or WRITE, with or without immediate): the bytes are copied
    /// during the call, so any memory will do — registered or not — and it is free again when
    /// this returns. `flags` may add `SOLICITED` or drop `SIGNALED`; `INLINE` is implied.
    ///
    /// # Errors
    /// `Limit "max_inline_data"` when `data` is longer than [`Qp::caps`] allows;
    /// `InvalidArgument` for READ or a reserved `wr_id`; the `ibv_post_send` failure.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::*;
    /// use std::time::Duration;
    /// # let (a, b) = (Nic::soft(), Nic::soft());
    /// # let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    /// # let (ca, cb) = (a.create_cq(16)?, b.create_cq(16)?);
    /// let caps = QpCaps { max_inline_data: 64, ..QpCaps::default() };
    /// # let qa = pa.create_qp(&ca, &ca, caps)?;
    /// # let qb = pb.create_qp(&cb, &cb, QpCaps::default())?;
    /// # qa.connect(&qb.endpoint()?)?;
    /// # qb.connect(&qa.endpoint()?)?;
    /// // SAFETY: no memory: the receive only takes the immediate.
    /// unsafe { qb.post_recv(1, &[]) }?;
    /// qa.post_inline(2, SendOp::SendWithImm(7), &[], SendFlags::SIGNALED)?;
    /// assert_eq!(cb.wait_one(Duration::from_secs(5))?.imm_data, Some(7));
    /// let too_long = [0u8; 4096];
    /// assert!(qa.post_inline(3, SendOp::Send, &too_long, SendFlags::SIGNALED).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn post_inline(
        &self,
        wr_id: u64,
        op: SendOp,
        data: &[u8],
        flags: SendFlags,
    ) -> Result<(), Error> {
        let length = u32::try_from(data.len()).map_err(|_| Error::Limit {
            verb: Verb::PostSend,
            limit: "max_inline_data",
            max: self.inner.caps.max_inline_data as u64,
        })?;
        let sge = [Sge {
            addr: data.as_ptr() as u64,
            length,
            lkey: Lkey(0),
        }];
        let sges: &[Sge] = if data.is_empty() { &[] } else { &sge };
        let wr = SendWr::new(wr_id, op, sges).flags(flags | SendFlags::INLINE);
        // SAFETY: inline (checked in `post_send_wrs`, READ refused): the device copies `data`
        // during the call and never reads it again.
        unsafe { self.post_send_wr(&wr) }
    }
}
