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
//!
//! Files: this one holds the reserved `wr_id`s and the buffers a request may own ([`NicBuf`],
//! [`NicBufMut`], and the slot's view of them, [`Parked`]); `posted.rs` the handles
//! ([`Posted`], [`Done`], [`PostError`], [`WaitError`]); `inflight.rs` the slots of a CQ and
//! the routing of its completions; `owned_post.rs` the owned posts of a [`Qp`].
//!
//! [`Qp`]: super::Qp
//! [`Qp::post_send_owned`]: super::Qp::post_send_owned
//! [`Cq::poll`]: super::Cq::poll
//! [`Cq::parked`]: super::Cq::parked
//! [`WcStatus::WrFlushErr`]: super::WcStatus::WrFlushErr
//! [`Posted`]: super::Posted
//! [`Done`]: super::Done
//! [`PostError`]: super::PostError
//! [`WaitError`]: super::WaitError

use super::{Completion, Nic, Result, Sge};
use std::any::Any;

/// The top 16 bits of the `wr_id`s the crate posts for owned requests.
pub(super) const OWNED_TAG: u64 = 0x5251;

/// The top 16 bits of the `wr_id`s the crate's grants post ([`crate::grant`]).
pub(crate) const GRANT_TAG: u64 = 0x5250;

/// Where completions of the crate's grants go ([`set_grant_sink`]).
pub(super) static GRANT_SINK: std::sync::OnceLock<fn(&Completion, &super::Nic)> =
    std::sync::OnceLock::new();

/// Install the handler of the grants' completions (and of receives that report a peer's
/// SEND_WITH_INV): [`Cq::poll`] calls it, so no completion of the crate's is ever the
/// application's to hand over — nor to forge. The sink gets the NIC of the CQ: QP numbers are
/// per device.
///
/// [`Cq::poll`]: super::Cq::poll
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
    ///
    /// [`Error::InvalidArgument`]: super::Error::InvalidArgument
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

/// Bits of a slot's key in its `wr_id`: at most this many owned requests per CQ at once.
pub(super) const SLOT_BITS: u32 = 20;

/// Bits of the epoch: a slot's key comes back with another epoch.
pub(super) const EPOCH_MASK: u64 = (1 << (48 - SLOT_BITS)) - 1;

/// `OWNED_TAG (16) | epoch (28) | slot (20)`.
pub(super) fn owned_wr_id(epoch: u32, key: usize) -> u64 {
    OWNED_TAG << 48 | (epoch as u64 & EPOCH_MASK) << SLOT_BITS | key as u64
}

/// `(slot, epoch)` of an owned `wr_id`.
pub(super) fn parse_owned(wr_id: u64) -> (usize, u32) {
    (
        (wr_id & ((1 << SLOT_BITS) - 1)) as usize,
        ((wr_id >> SLOT_BITS) & EPOCH_MASK) as u32,
    )
}

/// A buffer as a slot holds it: told what arrived, then unwrapped.
pub(super) trait Parked: Send {
    /// A receive or read into it succeeded with `n` bytes.
    fn wrote(&mut self, n: usize);
    /// The buffer itself.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// A buffer the NIC only reads.
pub(super) struct ReadOnly<B>(pub(super) B);

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
