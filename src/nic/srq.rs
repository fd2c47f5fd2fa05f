//! Shared receive queues: one pool of receives for many QPs, and [`RecvRing`], a ring of owned
//! receive buffers that refills itself from an allocator (a [`Pool`](crate::Pool), or
//! the global one under [`GlobalPool`](crate::GlobalPool)).
//!
//! Contract:
//! - an [`Srq`] belongs to a PD and has one receive CQ: every QP created on it
//!   ([`Pd::create_qp_on_srq`]) completes its receives there, so owned receives posted to the
//!   SRQ ([`Srq::post_recv_owned`]) find their completions whichever QP took them; the
//!   completion's `qp_num` tells which;
//! - a QP's destruction never flushes the SRQ's receives (they stay for the other QPs); the
//!   SRQ is destroyed after its last QP (each holds it), and that flushes its owned receives
//!   back to their handles;
//! - [`RecvRing`] keeps `depth` owned receives posted: each message taken from it
//!   ([`RecvRing::try_next`], [`RecvRing::wait`], `RecvRing::next` on tokio) hands over the
//!   buffer it landed in and posts a fresh one in its place. Messages of one QP come out in
//!   the order they arrived (the SRQ hands receives out in posting order, and the ring takes
//!   the earliest-posted completed one).
//!
//! Invariant: `ring.posted() + ring.deficit() == depth`.

use super::error::{Error, Result, Verb};
use super::owned::Writable;
use super::owned_post::{Target, srq_tag};
use super::{Cq, Done, NicBufMut, Pd, PostError, Posted, Qp, QpCaps, Sge};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// A shared receive queue (`struct ibv_srq`).
///
/// # Examples
/// Two QPs of a server receive through one SRQ.
/// ```
/// use rdma_pool::nic::*;
/// use std::time::Duration;
/// let (server, client) = (Nic::soft(), Nic::soft());
/// let (spd, cpd) = (server.alloc_pd()?, client.alloc_pd()?);
/// let (scq, ccq) = (server.create_cq(64)?, client.create_cq(64)?);
/// let srq = spd.create_srq(&scq, 16, 1)?;
/// let mut pairs = Vec::new();
/// for _ in 0..2 {
///     let s = spd.create_qp_on_srq(&scq, &srq, QpCaps::default())?;
///     let c = cpd.create_qp(&ccq, &ccq, QpCaps::default())?;
///     s.connect(&c.endpoint()?)?;
///     c.connect(&s.endpoint()?)?;
///     pairs.push((s, c));
/// }
/// for i in 0..2 {
///     // SAFETY: no memory: the receives only take immediates.
///     unsafe { srq.post_recv(i, &[]) }?;
/// }
/// pairs[1].1.post_inline(7, SendOp::SendWithImm(1), &[], SendFlags::SIGNALED)?;
/// let wc = scq.wait_one(Duration::from_secs(5))?;
/// assert_eq!((wc.wr_id, wc.qp_num, wc.imm_data), (0, pairs[1].0.qpn(), Some(1)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

struct SrqInner {
    pd: Pd,
    cq: Cq,
    handle: u64,
    max_wr: u32,
    max_sge: u32,
    /// The tag of its owned receives' slots in `cq`.
    tag: u32,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        match self.pd.backend().destroy_srq(self.handle) {
            // The device no longer holds its receives: owned ones come back flushed.
            Ok(()) => self.cq.inner.inflight.qp_gone(self.tag),
            Err(e) => tracing::error!(error = %e, "destroying an SRQ failed; it is leaked"),
        }
    }
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("handle", &self.inner.handle)
            .field("max_wr", &self.inner.max_wr)
            .finish()
    }
}

/// SRQs created so far (their slot tags).
static SRQS: AtomicU32 = AtomicU32::new(0);

impl Pd {
    /// Create a shared receive queue of `max_wr` receives of up to `max_sge` entries, whose
    /// QPs complete their receives on `recv_cq`.
    ///
    /// # Errors
    /// `Limit` above the device's `max_qp_wr` or `max_sge`; `InvalidArgument` for a CQ of
    /// another device; the `ibv_create_srq` failure.
    pub fn create_srq(&self, recv_cq: &Cq, max_wr: u32, max_sge: u32) -> Result<Srq> {
        if !self.nic().same_device(&recv_cq.inner.nic) {
            return Err(Error::invalid(
                Verb::CreateSrq,
                "completion queue of another device",
            ));
        }
        let caps = self.nic().caps();
        if max_wr > caps.max_qp_wr {
            return Err(Error::Limit {
                verb: Verb::CreateSrq,
                limit: "max_qp_wr",
                max: caps.max_qp_wr as u64,
            });
        }
        if max_sge > caps.max_sge {
            return Err(Error::Limit {
                verb: Verb::CreateSrq,
                limit: "max_sge",
                max: caps.max_sge as u64,
            });
        }
        let max_wr = max_wr.max(1);
        let handle = self
            .backend()
            .create_srq(self.inner.handle, max_wr, max_sge)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: self.clone(),
                cq: recv_cq.clone(),
                handle,
                max_wr,
                max_sge,
                tag: srq_tag(SRQS.fetch_add(1, Relaxed)),
            }),
        })
    }

    /// Create an RC QP whose receives come from `srq` (and complete on its CQ); `caps`'
    /// receive sizes are ignored.
    ///
    /// # Errors
    /// As [`Pd::create_qp`]; `InvalidArgument` for an SRQ of another PD.
    pub fn create_qp_on_srq(&self, send_cq: &Cq, srq: &Srq, caps: QpCaps) -> Result<Qp> {
        if srq.inner.pd != *self {
            return Err(Error::invalid(Verb::CreateQp, "SRQ of another PD"));
        }
        let caps = QpCaps {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..caps
        };
        self.create_qp_in(send_cq, &srq.inner.cq, Some(srq), caps)
    }
}

impl Srq {
    pub(super) fn handle(&self) -> u64 {
        self.inner.handle
    }

    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }

    /// The CQ its QPs' receives complete on.
    pub fn cq(&self) -> &Cq {
        &self.inner.cq
    }

    /// The backend's handle (`struct ibv_srq *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.inner.handle
    }

    /// Receives it can hold.
    pub fn max_wr(&self) -> u32 {
        self.inner.max_wr
    }

    /// Post a receive of `sges` (the raw verb; [`Srq::post_recv_owned`] is the safe one).
    ///
    /// # Errors
    /// A reserved `wr_id`, `Limit` above `max_sge`, or the `ibv_post_srq_recv` failure
    /// (`ENOMEM` when full).
    ///
    /// # Safety
    /// The NIC writes the memory of `sges` until the receive's completion is polled: it must
    /// stay allocated and registered, and not be touched, until then.
    pub unsafe fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        if super::is_reserved_wr_id(wr_id) {
            return Err(Error::invalid(
                Verb::PostSrqRecv,
                "wr_id in the range rdma-pool reserves (top 16 bits 0x5250/0x5251)",
            ));
        }
        self.post_any(wr_id, sges)
    }

    fn post_any(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        if sges.len() > self.inner.max_sge as usize {
            return Err(Error::Limit {
                verb: Verb::PostSrqRecv,
                limit: "max_sge",
                max: self.inner.max_sge as u64,
            });
        }
        self.inner
            .pd
            .backend()
            .post_srq_recv(self.inner.handle, wr_id, sges)
    }

    /// Post a receive into `buf`; the buffer comes back with the completion (on the SRQ's
    /// CQ, whichever QP took it), told the length received.
    ///
    /// # Errors
    /// The buffer back with why: not registered memory of this device, 4 GiB or more, or the
    /// post's failure.
    pub fn post_recv_owned<B: NicBufMut + std::fmt::Debug>(
        &self,
        wr_id: u64,
        buf: B,
    ) -> std::result::Result<Posted<B>, PostError<B>> {
        let target = Target {
            cq: &self.inner.cq,
            nic: self.inner.pd.nic(),
            tag: self.inner.tag,
            verb: Verb::PostSrqRecv,
        };
        target.park_and_post(
            wr_id,
            buf,
            None,
            |b| Box::new(Writable(b)),
            |id, sges| self.post_any(id, sges),
        )
    }
}

/// A ring of owned receives on an [`Srq`] that refills itself: `make` gives each fresh buffer
/// (e.g. `|| vec![0u8; 4096]` under a [`GlobalPool`](crate::GlobalPool), or
/// `|| allocator_api2::vec![in pool; 0u8; 4096]` with a `&'static Pool`).
///
/// # Examples
/// ```
/// use rdma_pool::nic::*;
/// use std::time::Duration;
/// # let (server, client) = (Nic::soft(), Nic::soft());
/// # let (spd, cpd) = (server.alloc_pd()?, client.alloc_pd()?);
/// # let (scq, ccq) = (server.create_cq(64)?, client.create_cq(64)?);
/// let pool: &'static _ = Box::leak(Box::new(rdma_pool::Pool::new(&spd)?));
/// let srq = spd.create_srq(&scq, 8, 1)?;
/// let mut ring = RecvRing::new(&srq, 4, || allocator_api2::vec![in pool; 0u8; 256])?;
/// # let s = spd.create_qp_on_srq(&scq, &srq, QpCaps::default())?;
/// # let c = cpd.create_qp(&ccq, &ccq, QpCaps { max_inline_data: 64, ..QpCaps::default() })?;
/// # s.connect(&c.endpoint()?)?;
/// # c.connect(&s.endpoint()?)?;
/// for i in 0..10u8 {
///     c.post_inline(i as u64, SendOp::Send, &[i; 3], SendFlags::SIGNALED)?;
///     let got = ring.wait(Duration::from_secs(5))?;
///     assert_eq!(&got.buf[..], &[i; 3]);
///     assert_eq!(ring.posted(), 4); // refilled
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RecvRing<B, F> {
    srq: Srq,
    posted: Vec<Posted<B>>,
    make: F,
    depth: usize,
    next_id: u64,
}

impl<B, F> std::fmt::Debug for RecvRing<B, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing")
            .field("depth", &self.depth)
            .field("posted", &self.posted.len())
            .finish()
    }
}

impl<B: NicBufMut + std::fmt::Debug, F: FnMut() -> B> RecvRing<B, F> {
    /// Post `depth` buffers made by `make` to `srq`.
    ///
    /// # Errors
    /// `Limit` when `depth` exceeds the SRQ's `max_wr`; the first post's failure (the
    /// buffers posted before it are drained when the ring is dropped).
    pub fn new(srq: &Srq, depth: usize, make: F) -> Result<RecvRing<B, F>> {
        if depth > srq.max_wr() as usize {
            return Err(Error::Limit {
                verb: Verb::PostSrqRecv,
                limit: "max_wr",
                max: srq.max_wr() as u64,
            });
        }
        let mut ring = RecvRing {
            srq: srq.clone(),
            posted: Vec::with_capacity(depth),
            make,
            depth,
            next_id: 0,
        };
        ring.refill()?;
        Ok(ring)
    }

    /// Receives posted now.
    pub fn posted(&self) -> usize {
        self.posted.len()
    }

    /// Receives missing (refills that failed; [`RecvRing::refill`] retries them).
    pub fn deficit(&self) -> usize {
        self.depth - self.posted.len()
    }

    /// Post fresh buffers until `depth` are posted.
    ///
    /// # Errors
    /// The first post that failed (the ring keeps what it posted).
    pub fn refill(&mut self) -> Result<()> {
        while self.posted.len() < self.depth {
            let id = self.next_id;
            match self.srq.post_recv_owned(id, (self.make)()) {
                Ok(p) => {
                    self.next_id += 1;
                    self.posted.push(p);
                }
                Err(e) => return Err(e.error),
            }
        }
        Ok(())
    }

    /// The earliest-posted completed receive, if any (polls the SRQ's CQ once); a fresh
    /// buffer takes its place. A failed refill shows in [`RecvRing::deficit`], the message is
    /// still handed over.
    ///
    /// # Errors
    /// The poll's failure.
    pub fn try_next(&mut self) -> Result<Option<Done<B>>> {
        self.srq.inner.cq.pump()?;
        Ok(self.take_done())
    }

    fn take_done(&mut self) -> Option<Done<B>> {
        let i = self.posted.iter().position(|p| p.is_complete())?;
        let done = match self.posted.remove(i).take() {
            Ok(d) => d,
            Err(p) => {
                self.posted.insert(i, p);
                return None;
            }
        };
        if let Err(e) = self.refill() {
            tracing::warn!(error = %e, deficit = self.deficit(), "RecvRing: a refill failed");
        }
        Some(done)
    }

    /// Wait (as [`Cq::wait_one`] does: sleeping on a channel CQ, else spinning) for at most
    /// `timeout` for the next message.
    ///
    /// # Errors
    /// [`Error::Timeout`]; the poll's failure.
    pub fn wait(&mut self, timeout: Duration) -> Result<Done<B>> {
        let deadline = Instant::now() + timeout;
        let cq = self.srq.inner.cq.clone();
        loop {
            if let Some(d) = self.try_next()? {
                return Ok(d);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(timeout));
            }
            match cq.channel() {
                Some(ch) => {
                    cq.req_notify(false)?;
                    if let Some(d) = self.try_next()? {
                        return Ok(d);
                    }
                    if ch.wait_readable(left.min(Duration::from_millis(50)))?
                        && ch.take_events()? > 0
                    {
                        cq.inner.inflight.wake.changed();
                    }
                }
                None => std::thread::yield_now(),
            }
        }
    }

    /// The next message (feature `tokio`), awaited on `cq`, the [`AsyncCq`](super::AsyncCq)
    /// of the SRQ's CQ. Cancel-safe: a message is taken only in the poll that returns it.
    ///
    /// # Errors
    /// `InvalidArgument` when `cq` is not the SRQ's CQ; a poll or channel failure.
    #[cfg(feature = "tokio")]
    pub async fn next(&mut self, cq: &super::AsyncCq) -> Result<Done<B>> {
        if !Arc::ptr_eq(&cq.cq().inner, &self.srq.inner.cq.inner) {
            return Err(Error::invalid(Verb::PollCq, "not the SRQ's CQ"));
        }
        cq.until(|c| {
            c.pump()?;
            Ok(self.take_done())
        })
        .await
    }
}
