//! Owned posts: the buffer travels with the work request and comes back with its completion
//! (tokio-uring's model), so safe code can post without promising anything.
//!
//! Contract:
//! - [`Qp::post_send_owned`] and its siblings take a buffer by value ([`NicBuf`] to be read by
//!   the NIC, [`NicBufMut`] to be written) and park it in a slot of the CQ the request completes
//!   on, *before* the request is posted; they return a [`Posted`] handle. The work request
//!   carries a `wr_id` of the crate's reserved range ([`is_reserved_wr_id`]); raw posts refuse
//!   that range, so no request of the application can complete a slot.
//! - [`Cq::poll`] (and every wait of a [`Posted`]) routes the completions of slots to them and
//!   hands the application only its own; completions of the application read while a handle
//!   waits are kept, in order, for the next [`Cq::poll`].
//! - The handle gives the buffer back with its completion ([`Done`]); a receive or a read that
//!   succeeded has told the buffer how many bytes arrived ([`NicBufMut::nic_wrote`]).
//! - Dropping a handle whose request is still in flight *parks* its buffer: it is dropped when
//!   the completion arrives or when the QP is destroyed, never before ([`Cq::parked`] counts
//!   them). Destroying a QP returns the buffers of its unfinished requests to their handles
//!   with [`WcStatus::WrFlushErr`] (or with the completion the device made before the
//!   destruction, when a poll finds it first); their slots stay *tombstones*, keeping their
//!   keys, until a poll that started after the destruction found the CQ empty — so a
//!   completion left in the device can never match a later request. A QP whose destruction
//!   fails keeps its requests (their completions may still come); a CQ whose destruction fails
//!   leaks the buffers still in its slots.
//!
//! Invariant: a buffer is in exactly one place — its owner's hands, or one slot from before its
//! request is posted until (a) its handle took the completion, (b) its completion arrived after
//! its handle was dropped, or (c) its QP was destroyed. `parked == |slots abandoned, in flight|`;
//! a slot's key is reused only when no completion for it can be in the device.

use super::{Completion, Cq, Error, Nic, Qp, Result, Rkey, Sge, Verb, WcOpcode, WcStatus};
use slab::Slab;
use std::any::Any;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The top 16 bits of the `wr_id`s the crate posts for owned requests.
const OWNED_TAG: u64 = 0x5251;

/// The top 16 bits of the `wr_id`s the crate's grants post ([`crate::grant`]).
pub(crate) const GRANT_TAG: u64 = 0x5250;

/// Where completions of the crate's grants go ([`set_grant_sink`]).
static GRANT_SINK: std::sync::OnceLock<fn(&Completion, &super::Nic)> = std::sync::OnceLock::new();

/// Install the handler of the grants' completions (and of receives that report a peer's
/// SEND_WITH_INV): [`Cq::poll`] calls it, so no completion of the crate's is ever the
/// application's to hand over — nor to forge. The sink gets the NIC of the CQ: QP numbers are
/// per device.
pub(crate) fn set_grant_sink(sink: fn(&Completion, &super::Nic)) {
    let _ = GRANT_SINK.set(sink);
}

/// True for a `wr_id` in the range the crate reserves for its own work requests (top 16 bits
/// `0x5250` or `0x5251`): raw posts refuse it, so the application can never complete a
/// request of the crate's.
///
/// # Examples
/// ```
/// use rdma_pool::nic::is_reserved_wr_id;
/// assert!(!is_reserved_wr_id(42));
/// assert!(is_reserved_wr_id(0x5251 << 48));
/// ```
pub fn is_reserved_wr_id(wr_id: u64) -> bool {
    matches!(wr_id >> 48, GRANT_TAG | OWNED_TAG)
}

/// Memory a work request may own: the NIC reads `nic_len()` bytes from `nic_ptr()`.
///
/// # Safety
/// An implementor promises that, while a value is owned by a work request (moved into it and
/// not dropped), the `nic_len()` bytes at `nic_ptr()` stay allocated and unmoved, and nothing
/// but the value can write them; and that [`NicBuf::sge`] describes exactly those bytes.
/// (`Vec<u8>`, `Box<[u8]>` and the pool's own vectors qualify: their bytes are on the heap.)
pub unsafe trait NicBuf: Send + 'static {
    /// First byte.
    fn nic_ptr(&self) -> *const u8;
    /// Bytes the NIC uses.
    fn nic_len(&self) -> usize;
    /// The scatter/gather entry of the bytes on `nic` (`None` when empty).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the bytes are not wholly inside one registration of a
    /// pool on `nic` (a degraded or bootstrap block, or memory of another device).
    fn sge(&self, nic: &Nic) -> Result<Option<Sge>>;
}

/// Memory a work request may own and the NIC may write: receives and RDMA READs land in its
/// `nic_len()` bytes.
///
/// # Safety
/// As [`NicBuf`], and no other value can read the bytes while the request owns them (no
/// shared ownership).
pub unsafe trait NicBufMut: NicBuf {
    /// A receive or read that succeeded wrote `n` bytes at the start (`n <= nic_len()`): a
    /// growable buffer keeps just those.
    fn nic_wrote(&mut self, n: usize) {
        let _ = n;
    }
}

/// A finished owned request: the buffer back, and its completion (with the `wr_id` the
/// application gave).
#[derive(Debug)]
pub struct Done<B> {
    /// The buffer.
    pub buf: B,
    /// The completion; `status` says whether the transfer happened.
    pub completion: Completion,
}

/// A refused owned post: why, and the buffer, untouched.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct PostError<B: std::fmt::Debug> {
    /// Why the post was refused.
    #[source]
    pub error: Error,
    /// The buffer, given back.
    pub buf: B,
}

/// An owned request that did not complete in time (or whose CQ could not be polled): why,
/// and its handle, to wait again or drop (which parks the buffer).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct WaitError<B> {
    /// [`Error::Timeout`], or the poll's failure.
    #[source]
    pub error: Error,
    /// The request, still in flight.
    pub posted: Posted<B>,
}

/// The slots of one CQ (see the module contract).
#[derive(Default)]
pub(super) struct Inflight {
    slots: Mutex<Slab<Slot>>,
    backlog: Mutex<VecDeque<Completion>>,
    next_gen: AtomicU64,
    parked: AtomicU64,
    /// Device polls started on the CQ (each takes the next number).
    polls: AtomicU64,
    /// Slots kept as tombstones (see [`Slot::tomb`]).
    tombs: AtomicU64,
    /// Wakes async waiters when the CQ's state moved without their channel firing.
    pub(super) wake: Wake,
}

/// Async waiters of a CQ (feature `tokio`; nothing without it): [`Wake::changed`] wakes them
/// whenever something they may wait for happened that their completion channel does not
/// report — completions taken from the device by any poll (which may be theirs: routed to a
/// slot, kept in the backlog), channel events taken by a blocking wait, slots flushed by a
/// QP's or SRQ's destruction.
#[derive(Default)]
pub(super) struct Wake {
    #[cfg(feature = "tokio")]
    notify: tokio::sync::Notify,
    /// Async waits in progress (no notification is sent while there is none).
    #[cfg(feature = "tokio")]
    waiters: std::sync::atomic::AtomicUsize,
}

impl Wake {
    /// Something moved: wake every async waiter to re-check.
    #[inline]
    pub(super) fn changed(&self) {
        #[cfg(feature = "tokio")]
        if self.waiters.load(std::sync::atomic::Ordering::Acquire) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Count an async wait in while the guard lives.
    #[cfg(feature = "tokio")]
    pub(super) fn enter(&self) -> WakeGuard<'_> {
        self.waiters
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        WakeGuard(self)
    }

    /// The notification to await (enable it before checking).
    #[cfg(feature = "tokio")]
    pub(super) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

/// An async wait in progress ([`Wake::enter`]).
#[cfg(feature = "tokio")]
pub(super) struct WakeGuard<'a>(&'a Wake);

#[cfg(feature = "tokio")]
impl Drop for WakeGuard<'_> {
    fn drop(&mut self) {
        self.0
            .waiters
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

struct Slot {
    epoch: u32,
    qpn: u32,
    wr_id: u64,
    /// What the completion tells the buffer: bytes written by a successful READ.
    read_len: Option<u32>,
    buf: Option<Box<dyn Parked>>,
    wc: Option<Completion>,
    abandoned: bool,
    /// Its QP was destroyed when `polls` stood here: the device may still hold a completion
    /// of it, made before the destruction. The slot keeps its key (no later request can take
    /// it, so that completion can never match another request) until a poll that started
    /// after the destruction found the CQ empty, or that completion arrived.
    tomb: Option<u64>,
}

/// Buffers a device may still write (their CQ could not be destroyed): never dropped.
static KEPT_FOR_THE_DEVICE: Mutex<Vec<Box<dyn Parked>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Calls [`Wake::changed`] when dropped, if armed.
struct WakeOnDrop<'a>(&'a Wake, bool);

impl Drop for WakeOnDrop<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.changed();
        }
    }
}

/// Bits of a slot's key in its `wr_id`: at most this many owned requests per CQ at once.
const SLOT_BITS: u32 = 20;

/// Bits of the epoch: a slot's key comes back with another epoch.
const EPOCH_MASK: u64 = (1 << (48 - SLOT_BITS)) - 1;

/// `OWNED_TAG (16) | epoch (28) | slot (20)`.
fn owned_wr_id(epoch: u32, key: usize) -> u64 {
    OWNED_TAG << 48 | (epoch as u64 & EPOCH_MASK) << SLOT_BITS | key as u64
}

/// `(slot, epoch)` of an owned `wr_id`.
fn parse_owned(wr_id: u64) -> (usize, u32) {
    (
        (wr_id & ((1 << SLOT_BITS) - 1)) as usize,
        ((wr_id >> SLOT_BITS) & EPOCH_MASK) as u32,
    )
}

impl Inflight {
    /// Park `buf` for a request of QP `qpn`; returns `(slot, epoch)`, or the buffer when
    /// `2^SLOT_BITS` slots are taken.
    fn insert(
        &self,
        qpn: u32,
        wr_id: u64,
        read_len: Option<u32>,
        buf: Box<dyn Parked>,
    ) -> std::result::Result<(usize, u32), Box<dyn Parked>> {
        let epoch = (self.next_gen.fetch_add(1, Relaxed) & EPOCH_MASK) as u32;
        let mut slots = lock(&self.slots);
        if slots.vacant_key() >> SLOT_BITS != 0 {
            return Err(buf);
        }
        let key = slots.insert(Slot {
            epoch,
            qpn,
            wr_id,
            read_len,
            buf: Some(buf),
            wc: None,
            abandoned: false,
            tomb: None,
        });
        Ok((key, epoch))
    }

    /// Take back the buffer of a request that was never posted.
    fn unpost(&self, key: usize) -> Option<Box<dyn Parked>> {
        lock(&self.slots).try_remove(key).and_then(|s| s.buf)
    }

    /// A completion of an owned request: kept for its handle, or its buffer dropped when the
    /// handle is gone. A completion of a destroyed QP's request replaces the flush its handle
    /// was given, if not taken yet, and ends the slot's tombstone. Unknown ones are ignored.
    fn complete(&self, wc: Completion) {
        let (key, epoch) = parse_owned(wc.wr_id);
        let mut slots = lock(&self.slots);
        let Some(s) = slots
            .get_mut(key)
            .filter(|s| s.epoch == epoch && (s.qpn == wc.qp_num || s.qpn >> 24 != 0))
        else {
            return;
        };
        if s.tomb.take().is_some() {
            self.tombs.fetch_sub(1, Relaxed);
            if s.buf.is_none() {
                slots.remove(key);
            } else {
                s.wc = Some(Completion {
                    wr_id: s.wr_id,
                    ..wc
                });
            }
            return;
        }
        if s.wc.is_some() {
            return;
        }
        if s.abandoned {
            let dropped = slots.remove(key).buf;
            drop(slots);
            self.parked.fetch_sub(1, Relaxed);
            drop(dropped);
            return;
        }
        s.wc = Some(Completion {
            wr_id: s.wr_id,
            ..wc
        });
    }

    /// Remove slot `key` (its buffer already taken), or leave its tombstone.
    fn retire(&self, slots: &mut Slab<Slot>, key: usize) -> Option<Box<dyn Parked>> {
        let s = &mut slots[key];
        if s.tomb.is_some() {
            return s.buf.take();
        }
        slots.remove(key).buf
    }

    /// The completion and buffer of slot `key`, if it completed.
    fn take(&self, key: usize, epoch: u32) -> Option<(Completion, Option<u32>, Box<dyn Parked>)> {
        let mut slots = lock(&self.slots);
        let s = slots.get(key).filter(|s| s.epoch == epoch)?;
        let (wc, read_len) = (s.wc?, s.read_len);
        s.buf.as_ref()?;
        let buf = self.retire(&mut slots, key)?;
        Some((wc, read_len, buf))
    }

    fn is_complete(&self, key: usize, epoch: u32) -> bool {
        lock(&self.slots)
            .get(key)
            .is_some_and(|s| s.epoch == epoch && s.wc.is_some() && s.buf.is_some())
    }

    /// Whether slot `key` holds a flush its QP's destruction gave it.
    fn flushed(&self, key: usize, epoch: u32) -> bool {
        lock(&self.slots)
            .get(key)
            .is_some_and(|s| s.epoch == epoch && s.tomb.is_some())
    }

    /// The handle of slot `key` was dropped: drop the buffer now if the request finished, else
    /// park it.
    fn abandon(&self, key: usize, epoch: u32) {
        let mut slots = lock(&self.slots);
        let Some(s) = slots.get_mut(key).filter(|s| s.epoch == epoch) else {
            return;
        };
        if s.wc.is_some() {
            let dropped = self.retire(&mut slots, key);
            drop(slots);
            drop(dropped);
        } else {
            s.abandoned = true;
            self.parked.fetch_add(1, Relaxed);
        }
    }

    /// QP `qpn` was destroyed: hand its unfinished requests back flushed, drop the parked
    /// ones; every such slot stays a tombstone until no completion of it can be left.
    pub(super) fn qp_gone(&self, qpn: u32) {
        let stamp = self.polls.load(Relaxed);
        let mut dropped = Vec::new();
        {
            let mut slots = lock(&self.slots);
            for (_, s) in slots
                .iter_mut()
                .filter(|(_, s)| s.qpn == qpn && s.wc.is_none())
            {
                s.tomb = Some(stamp);
                self.tombs.fetch_add(1, Relaxed);
                s.wc = Some(Completion {
                    wr_id: s.wr_id,
                    status: WcStatus::WrFlushErr,
                    qp_num: qpn,
                    ..Default::default()
                });
                if s.abandoned {
                    dropped.push(s.buf.take());
                    self.parked.fetch_sub(1, Relaxed);
                }
            }
        }
        drop(dropped);
        // No completion will tell the async waiters: wake them to find the flush.
        self.wake.changed();
    }

    /// A device poll numbered `seq` found the CQ empty: the tombstones of QPs destroyed before
    /// it started can go (nothing of theirs is left in the device).
    fn emptied(&self, seq: u64) {
        if self.tombs.load(Relaxed) == 0 {
            return;
        }
        let mut slots = lock(&self.slots);
        let ended: Vec<usize> = slots
            .iter()
            .filter(|(_, s)| s.tomb.is_some_and(|t| t < seq))
            .map(|(k, _)| k)
            .collect();
        for k in ended {
            slots[k].tomb = None;
            self.tombs.fetch_sub(1, Relaxed);
            if slots[k].buf.is_none() {
                slots.remove(k);
            }
        }
    }

    /// The CQ could not be destroyed, so a QP on it may not have been either: every buffer
    /// still in a slot stays allocated for good (kept where a leak checker still sees it).
    pub(super) fn leak(&self) {
        let mut kept = lock(&KEPT_FOR_THE_DEVICE);
        for (_, s) in lock(&self.slots).iter_mut() {
            kept.extend(s.buf.take());
        }
    }
}

impl Cq {
    /// Poll the device once for up to `out.len()` completions: the crate's owned requests'
    /// go to their slots, the rest stay in `out`, compacted. Returns how many the device gave
    /// and how many stayed.
    pub(super) fn poll_routed(&self, out: &mut [Completion]) -> Result<(usize, usize)> {
        let inflight = &self.inner.inflight;
        let seq = inflight.polls.fetch_add(1, Relaxed) + 1;
        let got = self.inner.nic.backend.poll_cq(self.inner.handle, out)?;
        // After routing (below), async waiters re-check: these may be theirs.
        let _wake = WakeOnDrop(&inflight.wake, got > 0);
        let mut kept = 0;
        for i in 0..got {
            let wc = out[i];
            if !self.route(&wc) {
                out[kept] = wc;
                kept += 1;
            }
        }
        // After routing what it got: those may be the completions the tombstones wait for.
        if got < out.len() {
            inflight.emptied(seq);
        }
        Ok((got, kept))
    }

    /// Route one completion of this CQ: an owned request's to its slot, a grant's to its pool
    /// (true: the crate's, consumed). An application completion that reports an invalidated
    /// rkey is shown to the grants too (the peer may have killed a grant's key), and kept.
    pub(super) fn route(&self, wc: &Completion) -> bool {
        if wc.wr_id >> 48 == OWNED_TAG {
            self.inner.inflight.complete(*wc);
            true
        } else if wc.wr_id >> 48 == GRANT_TAG {
            // A grant's bind or invalidation: never the application's (raw posts refuse the
            // tag), whether or not its pool still lives.
            if let Some(sink) = GRANT_SINK.get() {
                sink(wc, &self.inner.nic);
            }
            true
        } else {
            if wc.invalidated_rkey.is_some()
                && let Some(sink) = GRANT_SINK.get()
            {
                sink(wc, &self.inner.nic);
            }
            false
        }
    }

    /// Completions of the application read while an owned request waited, first; the
    /// returned guard keeps other polls out until the caller has polled the device too.
    pub(super) fn take_backlog(
        &self,
        out: &mut [Completion],
    ) -> (usize, MutexGuard<'_, VecDeque<Completion>>) {
        let mut backlog = lock(&self.inner.inflight.backlog);
        let n = backlog.len().min(out.len());
        for (slot, wc) in out.iter_mut().zip(backlog.drain(..n)) {
            *slot = wc;
        }
        (n, backlog)
    }

    /// Poll the device for the owned requests waiting on this CQ; keep the application's
    /// completions for its next [`Cq::poll`].
    pub(super) fn pump(&self) -> Result<()> {
        let mut buf = [Completion::default(); 16];
        // Under the backlog's lock, so the application's completions enter it in the device's
        // order and no concurrent poll overtakes them (`Cq::poll` takes it too).
        let mut backlog = lock(&self.inner.inflight.backlog);
        loop {
            let (got, kept) = self.poll_routed(&mut buf)?;
            backlog.extend(&buf[..kept]);
            // A full batch may have more behind it.
            if got < buf.len() {
                return Ok(());
            }
        }
    }

    /// Buffers of owned requests whose handle was dropped while the request was in flight:
    /// they are dropped when their completion arrives or their QP is destroyed.
    ///
    /// # Examples
    /// ```
    /// let cq = rdma_pool::nic::Nic::soft().create_cq(4).unwrap();
    /// assert_eq!(cq.parked(), 0);
    /// ```
    pub fn parked(&self) -> u64 {
        self.inner.inflight.parked.load(Relaxed)
    }
}

/// An owned request in flight; [`Posted::wait`] or [`Posted::take`] give the buffer back with
/// its completion. Dropping it while the request is in flight parks the buffer (see the
/// module contract): the NIC never touches freed memory.
#[must_use = "dropping the handle parks the buffer until the request completes"]
pub struct Posted<B> {
    cq: Cq,
    key: usize,
    epoch: u32,
    taken: bool,
    _buf: PhantomData<fn() -> B>,
}

impl<B> std::fmt::Debug for Posted<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Posted").field("slot", &self.key).finish()
    }
}

impl<B: NicBuf> Posted<B> {
    /// Whether the request completed (its completion was routed here by a poll). Does not
    /// poll.
    pub fn is_complete(&self) -> bool {
        self.cq.inner.inflight.is_complete(self.key, self.epoch)
    }

    /// The buffer and completion if the request completed, else the handle back. Polls the
    /// CQ once.
    ///
    /// # Errors
    /// The handle itself while the request is in flight; a failed poll counts as in flight.
    pub fn take(mut self) -> std::result::Result<Done<B>, Posted<B>> {
        let inflight = &self.cq.inner.inflight;
        // Poll when the request is not done, or was flushed by its QP's destruction (a
        // completion made before it may still be in the device, and is the truth).
        if (!self.is_complete() || inflight.flushed(self.key, self.epoch))
            && self.cq.pump().is_err()
        {
            return Err(self);
        }
        match self.cq.inner.inflight.take(self.key, self.epoch) {
            Some((completion, read_len, mut parked)) => {
                self.taken = true;
                if completion.status == WcStatus::Success {
                    let n = match completion.opcode {
                        WcOpcode::Recv => Some(completion.byte_len),
                        _ => read_len,
                    };
                    if let Some(n) = n {
                        parked.wrote(n as usize);
                    }
                }
                let buf = *parked
                    .into_any()
                    .downcast::<B>()
                    .expect("a slot holds the buffer type of its handle");
                Ok(Done { buf, completion })
            }
            None => Err(self),
        }
    }

    /// Wait (polling the CQ, then yielding) for at most `timeout` for the request to
    /// complete. The application's completions read meanwhile wait for its next
    /// [`Cq::poll`].
    ///
    /// # Errors
    /// [`Error::Timeout`] with the handle when it did not complete in time, or the poll's
    /// failure with the handle ([`WaitError`]).
    pub fn wait(self, timeout: Duration) -> std::result::Result<Done<B>, WaitError<B>> {
        let start = Instant::now();
        let mut me = self;
        loop {
            if let Err(error) = me.cq.pump() {
                return Err(WaitError { error, posted: me });
            }
            me = match me.take() {
                Ok(done) => return Ok(done),
                Err(me) => me,
            };
            if start.elapsed() > timeout {
                return Err(WaitError {
                    error: Error::Timeout(timeout),
                    posted: me,
                });
            }
            std::thread::yield_now();
        }
    }
}

#[cfg(feature = "tokio")]
impl<B: NicBuf> Posted<B> {
    /// Wait (feature `tokio`) until the request completed, without polling in a loop: the
    /// CQ's channel wakes the task ([`AsyncCq`](super::AsyncCq)). Cancel-safe: the handle is
    /// only borrowed; [`Posted::take`] then gives the buffer back.
    ///
    /// # Errors
    /// `InvalidArgument` when `cq` is not the CQ the request completes on; a poll or channel
    /// failure.
    pub async fn ready(&mut self, cq: &super::AsyncCq) -> Result<()> {
        if !std::sync::Arc::ptr_eq(&self.cq.inner, &cq.cq().inner) {
            return Err(Error::invalid(
                Verb::PollCq,
                "the request completes on another CQ",
            ));
        }
        let (key, epoch) = (self.key, self.epoch);
        cq.until(|c| {
            c.pump()?;
            Ok(c.inner.inflight.is_complete(key, epoch).then_some(()))
        })
        .await
    }

    /// Wait (feature `tokio`) for the completion and take the buffer back with it. Dropping
    /// the future drops the handle, which parks the buffer until the request completes (see
    /// [`Posted`]); use [`Posted::ready`] to keep the handle across a cancellation.
    ///
    /// # Errors
    /// As [`Posted::ready`], with the handle back.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma_pool::nic::{AsyncCq, Nic, QpCaps, WcStatus};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd()?;
    /// let cq = AsyncCq::new(&nic, 16)?;
    /// let (a, b) = (pd.create_qp(cq.cq(), cq.cq(), QpCaps::default())?, pd.create_qp(cq.cq(), cq.cq(), QpCaps::default())?);
    /// a.connect(&b.endpoint()?)?;
    /// b.connect(&a.endpoint()?)?;
    /// let pool: &'static _ = Box::leak(Box::new(rdma_pool::alloc::Pool::new(&pd)?));
    /// let rx = b.post_recv_owned(1, allocator_api2::vec![in pool; 0u8; 64])?;
    /// let tx = a.post_send_owned(2, allocator_api2::vec![in pool; 7u8; 16])?;
    /// assert_eq!(tx.wait_async(&cq).await?.completion.status, WcStatus::Success);
    /// let got = rx.wait_async(&cq).await?;
    /// assert_eq!(&got.buf[..16], &[7u8; 16]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait_async(
        mut self,
        cq: &super::AsyncCq,
    ) -> std::result::Result<Done<B>, WaitError<B>> {
        loop {
            if let Err(error) = self.ready(cq).await {
                return Err(WaitError {
                    error,
                    posted: self,
                });
            }
            match self.take() {
                Ok(done) => return Ok(done),
                // Not complete after all (a failed poll in `take`): wait again.
                Err(me) => self = me,
            }
        }
    }
}

impl<B> Drop for Posted<B> {
    fn drop(&mut self) {
        if !self.taken {
            self.cq.inner.inflight.abandon(self.key, self.epoch);
        }
    }
}

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
    /// let pool: &'static _ = Box::leak(Box::new(rdma_pool::alloc::Pool::new(&pd)?));
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

/// A buffer as a slot holds it: told what arrived, then unwrapped.
pub(super) trait Parked: Send {
    /// A receive or read into it succeeded with `n` bytes.
    fn wrote(&mut self, n: usize);
    /// The buffer itself.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// A buffer the NIC only reads.
struct ReadOnly<B>(B);

impl<B: NicBuf> Parked for ReadOnly<B> {
    fn wrote(&mut self, _: usize) {}
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        Box::new(self.0)
    }
}

/// A buffer the NIC may write.
pub(super) struct Writable<B>(pub(super) B);

impl<B: NicBufMut> Parked for Writable<B> {
    fn wrote(&mut self, n: usize) {
        self.0.nic_wrote(n.min(self.0.nic_len()));
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        Box::new(self.0)
    }
}
