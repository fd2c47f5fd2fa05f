//! The owned posts of a [`Qp`] (an `impl Qp` block: [`Qp::post_send_owned`] and its
//! siblings) and the [`Target`] an owned request is parked and posted on (a QP's CQ, or an
//! SRQ's: `srq.rs`). See the contract in `owned.rs`.
//!
//! Contract: the buffer is parked in a slot before the request is posted, and comes back in
//! the [`PostError`] when either step fails.

use super::owned::{NicBuf, NicBufMut, Parked, ReadOnly, Writable, owned_wr_id};
use super::{Cq, Error, Nic, PostError, Posted, Qp, Result, Rkey, Sge, Verb};
use std::marker::PhantomData;

/// Which owned request to post.
enum OwnedOp {
    Send,
    Write { remote_addr: u64, rkey: Rkey },
    Read { remote_addr: u64, rkey: Rkey },
    Recv,
}

impl Qp {
    /// Post a SEND of `buf`'s bytes; the buffer comes back with the completion.
    ///
    /// # Errors
    /// The buffer back with why: not registered memory of this QP's device, longer than
    /// 4 GiB, or the post's failure.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Nic, QpCaps, WcStatus};
    /// use std::time::Duration;
    /// # let nic = Nic::soft();
    /// # let pd = nic.alloc_pd()?;
    /// # let cq = nic.create_cq(8)?;
    /// # let (a, b) = (pd.create_qp(&cq, &cq, QpCaps::default())?, pd.create_qp(&cq, &cq, QpCaps::default())?);
    /// # a.connect(&b.endpoint()?)?; b.connect(&a.endpoint()?)?;
    /// let pool: &'static _ = Box::leak(Box::new(rdma_pool::Pool::new(&pd)?));
    /// let rx = b.post_recv_owned(1, allocator_api2::vec![in pool; 0u8; 64])?;
    /// let tx = a.post_send_owned(2, allocator_api2::vec![in pool; 7u8; 16])?;
    /// let sent = tx.wait(Duration::from_secs(5))?;
    /// assert_eq!(sent.completion.status, WcStatus::Success);
    /// let got = rx.wait(Duration::from_secs(5))?;
    /// assert_eq!(got.buf.len(), 16);
    /// assert!(got.buf.iter().all(|&x| x == 7));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn post_send_owned<B: NicBuf + std::fmt::Debug>(
        &self,
        wr_id: u64,
        buf: B,
    ) -> std::result::Result<Posted<B>, PostError<B>> {
        self.post_parked(wr_id, buf, OwnedOp::Send, |b| Box::new(ReadOnly(b)))
    }

    /// Post an RDMA WRITE of `buf`'s bytes to `remote_addr` under `rkey`; the buffer comes
    /// back with the completion.
    ///
    /// # Errors
    /// As [`Qp::post_send_owned`].
    pub fn post_write_owned<B: NicBuf + std::fmt::Debug>(
        &self,
        wr_id: u64,
        buf: B,
        remote_addr: u64,
        rkey: Rkey,
    ) -> std::result::Result<Posted<B>, PostError<B>> {
        self.post_parked(wr_id, buf, OwnedOp::Write { remote_addr, rkey }, |b| {
            Box::new(ReadOnly(b))
        })
    }

    /// Post an RDMA READ from `remote_addr` under `rkey` into `buf` (its `nic_len()` bytes);
    /// the buffer comes back with the completion, told the length read when it succeeded.
    ///
    /// # Errors
    /// As [`Qp::post_send_owned`].
    pub fn post_read_owned<B: NicBufMut + std::fmt::Debug>(
        &self,
        wr_id: u64,
        buf: B,
        remote_addr: u64,
        rkey: Rkey,
    ) -> std::result::Result<Posted<B>, PostError<B>> {
        self.post_owned_mut(wr_id, buf, OwnedOp::Read { remote_addr, rkey })
    }

    /// Post a receive into `buf` (its `nic_len()` bytes); the buffer comes back with the
    /// completion, told the length received when it succeeded.
    ///
    /// # Errors
    /// As [`Qp::post_send_owned`].
    pub fn post_recv_owned<B: NicBufMut + std::fmt::Debug>(
        &self,
        wr_id: u64,
        buf: B,
    ) -> std::result::Result<Posted<B>, PostError<B>> {
        self.post_owned_mut(wr_id, buf, OwnedOp::Recv)
    }

    fn post_owned_mut<B: NicBufMut + std::fmt::Debug>(
        &self,
        wr_id: u64,
        buf: B,
        op: OwnedOp,
    ) -> std::result::Result<Posted<B>, PostError<B>> {
        self.post_parked(wr_id, buf, op, |b| Box::new(Writable(b)))
    }

    /// Park `buf` (as `park` wraps it), then post `op` with it.
    fn post_parked<B: NicBuf + std::fmt::Debug>(
        &self,
        wr_id: u64,
        buf: B,
        op: OwnedOp,
        park: fn(B) -> Box<dyn Parked>,
    ) -> std::result::Result<Posted<B>, PostError<B>> {
        let verb = match op {
            OwnedOp::Recv => Verb::PostRecv,
            _ => Verb::PostSend,
        };
        let cq = match op {
            OwnedOp::Recv => &self.inner._recv_cq,
            _ => &self.inner._send_cq,
        };
        let read_len = matches!(op, OwnedOp::Read { .. }).then_some(buf.nic_len() as u32);
        let target = Target {
            cq,
            nic: self.pd().nic(),
            tag: self.qpn(),
            verb,
        };
        target.park_and_post(wr_id, buf, read_len, park, |id, sges| match op {
            OwnedOp::Recv => self.post_recv_any(id, sges),
            OwnedOp::Send => self.post(id, sges, super::RawSendOp::Send),
            OwnedOp::Write { remote_addr, rkey } => {
                self.post(id, sges, super::RawSendOp::Write { remote_addr, rkey })
            }
            OwnedOp::Read { remote_addr, rkey } => {
                self.post(id, sges, super::RawSendOp::Read { remote_addr, rkey })
            }
        })
    }
}

/// Where an owned request goes: the CQ it completes on, the device, the tag its slot is
/// matched and flushed by (a QP number, or an SRQ's tag: see [`srq_tag`]).
pub(super) struct Target<'a> {
    pub(super) cq: &'a Cq,
    pub(super) nic: &'a Nic,
    pub(super) tag: u32,
    pub(super) verb: Verb,
}

/// The slot tag of SRQ number `n`: above every 24-bit QP number, so a QP's destruction never
/// flushes an SRQ's receives, and a completion of any QP matches them.
pub(super) fn srq_tag(n: u32) -> u32 {
    0xff00_0000 | (n & 0xff_ffff)
}

impl Target<'_> {
    /// Park `buf` (as `park` wraps it) in a slot of the CQ, then `post` it with the slot's
    /// `wr_id`; the buffer comes back if either fails.
    pub(super) fn park_and_post<B: NicBuf + std::fmt::Debug>(
        &self,
        wr_id: u64,
        buf: B,
        read_len: Option<u32>,
        park: fn(B) -> Box<dyn Parked>,
        post: impl FnOnce(u64, &[Sge]) -> Result<()>,
    ) -> std::result::Result<Posted<B>, PostError<B>> {
        let (cq, verb) = (self.cq, self.verb);
        let sge = match checked_sge(&buf, self.nic, verb) {
            Ok(s) => s,
            Err(error) => return Err(PostError { error, buf }),
        };
        let sges: &[Sge] = sge.as_slice();
        let (key, epoch) = match cq
            .inner
            .inflight
            .insert(self.tag, wr_id, read_len, park(buf))
        {
            Ok(k) => k,
            Err(back) => {
                let buf = *back
                    .into_any()
                    .downcast::<B>()
                    .expect("the buffer just wrapped");
                let error = Error::invalid(verb, "2^20 owned requests in flight on one CQ");
                return Err(PostError { error, buf });
            }
        };
        match post(owned_wr_id(epoch, key), sges) {
            Ok(()) => Ok(Posted {
                cq: cq.clone(),
                key,
                epoch,
                taken: false,
                _buf: PhantomData,
            }),
            Err(error) => {
                let back = cq
                    .inner
                    .inflight
                    .unpost(key)
                    .expect("a refused post leaves its slot");
                let buf = *back
                    .into_any()
                    .downcast::<B>()
                    .expect("the slot holds the buffer just parked");
                Err(PostError { error, buf })
            }
        }
    }
}

/// The SGE of `buf` on `nic`, checked against what the buffer says it is.
fn checked_sge<B: NicBuf>(buf: &B, nic: &Nic, verb: Verb) -> Result<Option<Sge>> {
    if u32::try_from(buf.nic_len()).is_err() {
        return Err(Error::invalid(verb, "a buffer of 4 GiB or more"));
    }
    let sge = buf.sge(nic).map_err(|_| {
        Error::invalid(
            verb,
            "buffer is not registered memory of this device (a degraded or bootstrap block?)",
        )
    })?;
    match sge {
        Some(s) if s.addr != buf.nic_ptr() as u64 || s.length as usize != buf.nic_len() => Err(
            Error::invalid(verb, "the buffer's SGE does not describe its bytes"),
        ),
        None if buf.nic_len() != 0 => Err(Error::invalid(verb, "a non-empty buffer without SGE")),
        s => Ok(s),
    }
}
