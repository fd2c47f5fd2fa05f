//! Work requests: the scatter/gather entry [`Sge`] and the send-queue requests of a batch
//! ([`SendOp`], [`SendWr`], [`SendFlags`]).

use super::{Lkey, Rkey};
use bitflags::bitflags;

/// A scatter/gather entry (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Key of the region that covers `[addr, addr + length)`.
    pub lkey: Lkey,
}

bitflags! {
    /// Flags of a send-queue request ([`SendWr::flags`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Report a completion when it succeeds (errors are always reported). An unsignaled
        /// request keeps its send-queue slot until a later signaled request of the same QP
        /// completes: post a signaled one at least every `max_send_wr` requests, or the queue
        /// fills and posting fails with `ENOMEM`.
        const SIGNALED = 1;
        /// Copy the payload into the request at post time (`IBV_SEND_INLINE`): the memory may
        /// be reused as soon as the post returns, and its lkey is not used. At most
        /// [`QpCaps::max_inline_data`] bytes; SEND and WRITE only.
        const INLINE = 1 << 1;
        /// Ask the responder for a solicited event (`IBV_SEND_SOLICITED`): a CQ armed with
        /// [`Cq::req_notify`](crate::nic::Cq::req_notify)`(true)` notifies only for these.
        const SOLICITED = 1 << 2;
    }
}

/// A send-queue operation of [`Qp::post_send_wrs`](crate::nic::Qp::post_send_wrs). Binds,
/// invalidations and atomics have their own calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND into the responder's next receive.
    Send,
    /// SEND with 32 bits of immediate data, delivered in the receive's completion.
    SendWithImm(u32),
    /// SEND that also invalidates this rkey at the responder.
    SendWithInv(Rkey),
    /// RDMA WRITE to `remote_addr` through `rkey`.
    Write {
        /// Where the bytes go, in the responder's address space.
        remote_addr: u64,
        /// The responder's key.
        rkey: Rkey,
    },
    /// RDMA WRITE that also consumes one receive at the responder, whose completion
    /// ([`WcOpcode::RecvRdmaWithImm`]) carries `imm` and the length written.
    ///
    /// [`WcOpcode::RecvRdmaWithImm`]: super::WcOpcode::RecvRdmaWithImm
    WriteWithImm {
        /// Where the bytes go, in the responder's address space.
        remote_addr: u64,
        /// The responder's key.
        rkey: Rkey,
        /// The immediate data.
        imm: u32,
    },
    /// RDMA READ from `remote_addr` through `rkey` into the local SGEs.
    Read {
        /// Where the bytes come from, in the responder's address space.
        remote_addr: u64,
        /// The responder's key.
        rkey: Rkey,
    },
}

/// One send-queue request of a batch ([`Qp::post_send_wrs`](crate::nic::Qp::post_send_wrs)).
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// The id its completion carries (not in the range [`is_reserved_wr_id`](crate::nic::is_reserved_wr_id)).
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// The local memory: gathered for SEND/WRITE, scattered into for READ.
    pub sges: &'a [Sge],
    /// Signaled, inline, solicited.
    pub flags: SendFlags,
}

impl<'a> SendWr<'a> {
    /// A signaled request.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{SendFlags, SendOp, SendWr};
    /// let wr = SendWr::new(7, SendOp::SendWithImm(42), &[]);
    /// assert_eq!(wr.flags, SendFlags::SIGNALED);
    /// ```
    pub fn new(wr_id: u64, op: SendOp, sges: &'a [Sge]) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            sges,
            flags: SendFlags::SIGNALED,
        }
    }

    /// The same request with `flags`.
    pub fn flags(self, flags: SendFlags) -> SendWr<'a> {
        SendWr { flags, ..self }
    }
}
