//! Work completions: [`Completion`] (`struct ibv_wc`), its [`WcStatus`] and [`WcOpcode`].

use super::Rkey;

/// Completion status (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    #[default]
    Success,
    /// `IBV_WC_LOC_LEN_ERR`: a receive buffer was too small.
    LocLenErr,
    /// `IBV_WC_LOC_QP_OP_ERR`: an internal QP consistency error (bad invalidate, …).
    LocQpOpErr,
    /// `IBV_WC_LOC_PROT_ERR`: a local key, bound or right was wrong.
    LocProtErr,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP was in the error state.
    WrFlushErr,
    /// `IBV_WC_MW_BIND_ERR`: a memory window bind failed.
    MwBindErr,
    /// `IBV_WC_LOC_ACCESS_ERR`: a local access fault (ODP page the process cannot reach).
    LocAccessErr,
    /// `IBV_WC_REM_INV_REQ_ERR`: the responder found the request invalid.
    RemInvReqErr,
    /// `IBV_WC_REM_ACCESS_ERR`: the remote key, bound or right was wrong.
    RemAccessErr,
    /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation.
    RemOpErr,
    /// `IBV_WC_RETRY_EXC_ERR`: transport retries exhausted.
    RetryExcErr,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: receiver-not-ready retries exhausted.
    RnrRetryExcErr,
    /// Any other `ibv_wc_status` value.
    Other(u32),
}

impl WcStatus {
    /// Map an `ibv_wc_status` value.
    pub fn from_raw(v: u32) -> WcStatus {
        match v {
            0 => WcStatus::Success,
            1 => WcStatus::LocLenErr,
            2 => WcStatus::LocQpOpErr,
            4 => WcStatus::LocProtErr,
            5 => WcStatus::WrFlushErr,
            6 => WcStatus::MwBindErr,
            8 => WcStatus::LocAccessErr,
            9 => WcStatus::RemInvReqErr,
            10 => WcStatus::RemAccessErr,
            11 => WcStatus::RemOpErr,
            12 => WcStatus::RetryExcErr,
            13 => WcStatus::RnrRetryExcErr,
            other => WcStatus::Other(other),
        }
    }
}

/// What a completion completes (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WcOpcode {
    /// SEND (or SEND_WITH_INV).
    #[default]
    Send,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// BIND_MW (type 1 or 2).
    BindMw,
    /// LOCAL_INV.
    LocalInv,
    /// ATOMIC_CMP_AND_SWP.
    CompareSwap,
    /// ATOMIC_FETCH_AND_ADD.
    FetchAdd,
    /// A receive (of a SEND, with or without immediate data).
    Recv,
    /// A receive consumed by an RDMA WRITE with immediate data (`IBV_WC_RECV_RDMA_WITH_IMM`):
    /// `byte_len` is the length written, `imm_data` the immediate.
    RecvRdmaWithImm,
    /// Anything else.
    Other(u32),
}

/// A work completion (`struct ibv_wc`), the fields rdma-pool uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Operation.
    pub opcode: WcOpcode,
    /// Bytes received (receives only).
    pub byte_len: u32,
    /// The local QP number.
    pub qp_num: u32,
    /// The rkey a SEND_WITH_INV invalidated (receives only).
    pub invalidated_rkey: Option<Rkey>,
    /// The immediate data of a SEND_WITH_IMM or RDMA_WRITE_WITH_IMM (receives only), in host
    /// byte order (the wire carries it big-endian; the conversion is done here).
    pub imm_data: Option<u32>,
}
