//! The slots of one CQ ([`Inflight`]): the buffers of its owned requests in flight, their
//! completions, the application's completions read while a handle waited (the backlog), and
//! the wake-ups of async waiters ([`Wake`]); and the routing of a CQ's completions to them
//! (the `impl Cq` block here: [`Cq::poll_routed`], [`Cq::pump`], ...). See the contract in
//! `owned.rs`.
//!
//! Invariant: `parked == |slots abandoned, in flight|`; a slot's key is reused only when no
//! completion for it can be in the device.

use super::owned::{EPOCH_MASK, GRANT_SINK, GRANT_TAG, OWNED_TAG, Parked, SLOT_BITS, parse_owned};
use super::{Completion, Cq, Result, WcStatus};
use slab::Slab;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

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

impl Inflight {
    /// Park `buf` for a request of QP `qpn`; returns `(slot, epoch)`, or the buffer when
    /// `2^SLOT_BITS` slots are taken.
    pub(super) fn insert(
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
    pub(super) fn unpost(&self, key: usize) -> Option<Box<dyn Parked>> {
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
    pub(super) fn take(
        &self,
        key: usize,
        epoch: u32,
    ) -> Option<(Completion, Option<u32>, Box<dyn Parked>)> {
        let mut slots = lock(&self.slots);
        let s = slots.get(key).filter(|s| s.epoch == epoch)?;
        let (wc, read_len) = (s.wc?, s.read_len);
        s.buf.as_ref()?;
        let buf = self.retire(&mut slots, key)?;
        Some((wc, read_len, buf))
    }

    pub(super) fn is_complete(&self, key: usize, epoch: u32) -> bool {
        lock(&self.slots)
            .get(key)
            .is_some_and(|s| s.epoch == epoch && s.wc.is_some() && s.buf.is_some())
    }

    /// Whether slot `key` holds a flush its QP's destruction gave it.
    pub(super) fn flushed(&self, key: usize, epoch: u32) -> bool {
        lock(&self.slots)
            .get(key)
            .is_some_and(|s| s.epoch == epoch && s.tomb.is_some())
    }

    /// The handle of slot `key` was dropped: drop the buffer now if the request finished, else
    /// park it.
    pub(super) fn abandon(&self, key: usize, epoch: u32) {
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
