//! The C work requests the posting inlines (`inlines.rs`) hand to the provider, built from the
//! backend's: `struct ibv_send_wr` ([`build_send_wr`]), `struct ibv_mw_bind_info`
//! ([`bind_info`]), and the checked SGE count ([`num_sge`]).
//!
//! Contract: only builds; no object is dereferenced and nothing is allocated.

use crate::nic::backend::{RawBind, RawSendOp, RawSendWr};
use crate::nic::error::{Error, Result, Verb};
use rdma_sys as ffi;
use std::ffi::c_int;
use std::ptr;

pub(super) fn num_sge(verb: Verb, n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| Error::invalid(verb, "too many scatter/gather entries"))
}

/// The `struct ibv_send_wr` for `wr`, with `sg_list`/`num_sge` as given. Only builds: no object
/// is dereferenced.
pub(super) fn build_send_wr(
    wr: &RawSendWr<'_>,
    sg_list: *mut ffi::ibv_sge,
    num_sge: c_int,
) -> ffi::ibv_send_wr {
    use ffi::ibv_wr_opcode as op;
    // SAFETY: all-zero is a valid ibv_send_wr (null pointers, zero integers, unions of those).
    let mut s: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
    s.wr_id = wr.wr_id;
    s.next = ptr::null_mut();
    s.sg_list = sg_list;
    s.num_sge = num_sge;
    let flag = |on: bool, f: ffi::ibv_send_flags| if on { f.0 } else { 0 };
    s.send_flags = flag(wr.signaled, ffi::ibv_send_flags::IBV_SEND_SIGNALED)
        | flag(wr.inline, ffi::ibv_send_flags::IBV_SEND_INLINE)
        | flag(wr.solicited, ffi::ibv_send_flags::IBV_SEND_SOLICITED);
    match wr.op {
        RawSendOp::Send => s.opcode = op::IBV_WR_SEND,
        RawSendOp::SendWithImm(imm) => {
            s.opcode = op::IBV_WR_SEND_WITH_IMM;
            // The wire (and `ibv_send_wr::imm_data`) is big-endian.
            s.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        RawSendOp::WriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            s.opcode = op::IBV_WR_RDMA_WRITE_WITH_IMM;
            s.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            s.wr.rdma = ffi::rdma_t {
                remote_addr,
                rkey: rkey.0,
            };
        }
        RawSendOp::SendWithInv(rkey) => {
            s.opcode = op::IBV_WR_SEND_WITH_INV;
            s.imm_data_invalidated_rkey_union.invalidated_rkey = rkey.0;
        }
        RawSendOp::Write { remote_addr, rkey } => {
            s.opcode = op::IBV_WR_RDMA_WRITE;
            s.wr.rdma = ffi::rdma_t {
                remote_addr,
                rkey: rkey.0,
            };
        }
        RawSendOp::Read { remote_addr, rkey } => {
            s.opcode = op::IBV_WR_RDMA_READ;
            s.wr.rdma = ffi::rdma_t {
                remote_addr,
                rkey: rkey.0,
            };
        }
        RawSendOp::BindMw {
            mw,
            mw_rkey: _,
            new_rkey,
            bind,
        } => {
            s.opcode = op::IBV_WR_BIND_MW;
            s.bind_mw_tso_union.bind_mw = ffi::bind_mw_t {
                mw: mw as usize as *mut ffi::ibv_mw,
                rkey: new_rkey.0,
                bind_info: bind_info(&bind),
            };
        }
        RawSendOp::LocalInv(rkey) => {
            s.opcode = op::IBV_WR_LOCAL_INV;
            s.imm_data_invalidated_rkey_union.invalidated_rkey = rkey.0;
        }
        RawSendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            s.opcode = op::IBV_WR_ATOMIC_CMP_AND_SWP;
            s.wr.atomic = ffi::atomic_t {
                remote_addr,
                compare_add: compare,
                swap,
                rkey: rkey.0,
            };
        }
        RawSendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            s.opcode = op::IBV_WR_ATOMIC_FETCH_AND_ADD;
            s.wr.atomic = ffi::atomic_t {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey: rkey.0,
            };
        }
    }
    s
}

/// `struct ibv_mw_bind_info` for `bind`: always with the MR (rxe dereferences it even to unbind).
pub(super) fn bind_info(bind: &RawBind) -> ffi::ibv_mw_bind_info {
    ffi::ibv_mw_bind_info {
        mr: bind.mr as usize as *mut ffi::ibv_mr,
        addr: bind.addr as u64,
        length: bind.len as u64,
        mw_access_flags: bind.access.bits(),
    }
}
