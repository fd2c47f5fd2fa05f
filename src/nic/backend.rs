//! The one narrow boundary to the NIC: the [`Backend`] trait, implemented by the soft NIC and by
//! the verbs backend. Everything above it (`Nic`, `Pd`, `Mr`, …, and the pool) is
//! backend-agnostic.
//!
//! Contract: objects are named by opaque `u64` handles that the backend hands out and that the
//! public RAII types own; a handle is passed back only while its owner is alive, and exactly once
//! to its destroy verb. Argument checks that lose nothing (`ERR_INPUT`-class) happen above this
//! trait, in `nic/mod.rs`, so both backends see only well-formed requests.
//!
//! `rereg_mr` receives every requested attribute; which of them take effect is decided by
//! [`ReregFlags::resolve`] (in `types/access.rs`), the one rule the public layer and the
//! backends share.

use super::error::{ReregError, Result};
use super::types::*;
use std::any::Any;

/// Re-exported from `types/access.rs`, where it lives so that `error.rs` need not import this
/// module.
pub(crate) use super::types::RawMr;

/// A bind request: which region, which range, which rights.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBind {
    pub(crate) wr_id: u64,
    pub(crate) signaled: bool,
    pub(crate) mr: u64,
    pub(crate) mr_lkey: Lkey,
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) access: Access,
}

/// Send-queue operations.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RawSendOp {
    Send,
    SendWithImm(u32),
    SendWithInv(Rkey),
    Write {
        remote_addr: u64,
        rkey: Rkey,
    },
    WriteWithImm {
        remote_addr: u64,
        rkey: Rkey,
        imm: u32,
    },
    Read {
        remote_addr: u64,
        rkey: Rkey,
    },
    /// Type 2 bind: `mw_rkey` is the window's current key, `new_rkey` the one it gets.
    BindMw {
        mw: u64,
        mw_rkey: Rkey,
        new_rkey: Rkey,
        bind: RawBind,
    },
    LocalInv(Rkey),
    /// ATOMIC_CMP_AND_SWP: the 8 bytes at `remote_addr` become `swap` if they equal `compare`;
    /// the original value lands in the local SGE.
    CompareSwap {
        remote_addr: u64,
        rkey: Rkey,
        compare: u64,
        swap: u64,
    },
    /// ATOMIC_FETCH_AND_ADD: `add` is added to the 8 bytes at `remote_addr`; the original
    /// value lands in the local SGE.
    FetchAdd {
        remote_addr: u64,
        rkey: Rkey,
        add: u64,
    },
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawSendWr<'a> {
    pub(crate) wr_id: u64,
    pub(crate) signaled: bool,
    /// `IBV_SEND_INLINE`: the SGEs' bytes are copied at post time, their lkeys unused.
    pub(crate) inline: bool,
    /// `IBV_SEND_SOLICITED`.
    pub(crate) solicited: bool,
    pub(crate) sges: &'a [Sge],
    pub(crate) op: RawSendOp,
}

impl RawSendOp {
    /// The public operation as a raw one.
    pub(crate) fn from_public(op: SendOp) -> RawSendOp {
        match op {
            SendOp::Send => RawSendOp::Send,
            SendOp::SendWithImm(imm) => RawSendOp::SendWithImm(imm),
            SendOp::SendWithInv(k) => RawSendOp::SendWithInv(k),
            SendOp::Write { remote_addr, rkey } => RawSendOp::Write { remote_addr, rkey },
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => RawSendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            SendOp::Read { remote_addr, rkey } => RawSendOp::Read { remote_addr, rkey },
        }
    }
}

/// The NIC boundary. See the module contract.
pub(crate) trait Backend: Send + Sync + 'static {
    fn caps(&self) -> &Caps;
    fn kind(&self) -> NicKind;
    fn as_any(&self) -> &dyn Any;
    fn fork_status(&self) -> ForkStatus;
    /// The next asynchronous event, without blocking (`None`: none pending).
    fn poll_async_event(&self) -> Result<Option<AsyncEvent>>;

    fn alloc_pd(&self) -> Result<u64>;
    fn dealloc_pd(&self, pd: u64) -> Result<()>;

    fn reg_mr(&self, pd: u64, addr: usize, len: usize, access: Access) -> Result<RawMr>;
    #[allow(clippy::too_many_arguments)]
    fn rereg_mr(
        &self,
        mr: u64,
        flags: ReregFlags,
        pd: u64,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<RawMr, ReregError>;
    fn dereg_mr(&self, mr: u64) -> Result<()>;
    fn advise_mr(&self, pd: u64, advice: Advice, flags: AdviseFlags, sges: &[Sge]) -> Result<()>;

    fn alloc_mw(&self, pd: u64, ty: MwType) -> Result<(u64, Rkey)>;
    /// Type 1 bind (`ibv_bind_mw`); returns the window's new rkey.
    fn bind_mw(&self, qp: u64, mw: u64, mw_rkey: Rkey, bind: &RawBind) -> Result<Rkey>;
    fn dealloc_mw(&self, mw: u64) -> Result<()>;

    /// A CQ, signalling `channel` (a handle of `create_comp_channel`) when armed.
    fn create_cq(&self, depth: u32, channel: Option<u64>) -> Result<u64>;
    /// Returns (handle, its file descriptor, non-blocking).
    fn create_comp_channel(&self) -> Result<(u64, std::os::fd::RawFd)>;
    fn destroy_comp_channel(&self, channel: u64) -> Result<()>;
    /// Take (and acknowledge) every pending event of `channel` without blocking; how many.
    fn get_cq_events(&self, channel: u64) -> Result<u64>;
    fn req_notify_cq(&self, cq: u64, solicited_only: bool) -> Result<()>;
    fn destroy_cq(&self, cq: u64) -> Result<()>;
    fn poll_cq(&self, cq: u64, out: &mut [Completion]) -> Result<usize>;

    /// Returns (handle, qp number, the sizes granted: at least those asked). With `srq`, the
    /// QP receives through that shared receive queue.
    fn create_qp(
        &self,
        pd: u64,
        send_cq: u64,
        recv_cq: u64,
        srq: Option<u64>,
        caps: &QpCaps,
    ) -> Result<(u64, u32, QpCaps)>;
    /// A shared receive queue of `max_wr` receives of up to `max_sge` entries each.
    fn create_srq(&self, pd: u64, max_wr: u32, max_sge: u32) -> Result<u64>;
    fn destroy_srq(&self, srq: u64) -> Result<()>;
    fn post_srq_recv(&self, srq: u64, wr_id: u64, sges: &[Sge]) -> Result<()>;
    fn endpoint(&self, qp: u64, gid_index: u8) -> Result<Endpoint>;
    fn connect_qp(&self, qp: u64, remote: &Endpoint, opts: &ConnectOptions) -> Result<()>;
    fn qp_state(&self, qp: u64) -> Result<QpState>;
    fn destroy_qp(&self, qp: u64) -> Result<()>;
    fn post_send(&self, qp: u64, wr: &RawSendWr<'_>) -> Result<()>;
    /// Post a chain of requests (no binds) in one call; on failure, how many were posted.
    fn post_send_list(
        &self,
        qp: u64,
        wrs: &[RawSendWr<'_>],
    ) -> std::result::Result<(), (usize, crate::nic::error::Error)> {
        for (i, wr) in wrs.iter().enumerate() {
            self.post_send(qp, wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }
    fn post_recv(&self, qp: u64, wr_id: u64, sges: &[Sge]) -> Result<()>;

    /// Returns (handle, umem id).
    fn umem_reg(
        &self,
        addr: usize,
        len: usize,
        access: Access,
        pgsz_bitmap: u64,
    ) -> Result<(u64, u32)>;
    fn umem_dereg(&self, umem: u64) -> Result<()>;
}
