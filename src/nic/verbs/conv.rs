//! Conversions shared by the verbs backend's files: handles to object pointers, C counts to
//! Rust ones, the port every QP uses, a region as the backend reports it ([`RawMr`]) and the
//! arguments `ibv_rereg_mr` is given.
//!
//! Contract: a backend handle is the address of the libibverbs object it names (never 0 for a
//! live object); a negative C count reads as 0.

use crate::nic::backend::RawMr;
use crate::nic::error::{Error, Result, Verb};
use crate::nic::types::{Access, Lkey, MrAttrs, ReregFlags, Rkey};
use rdma_sys as ffi;
use std::ffi::c_int;

/// The port every QP uses.
pub(super) const PORT: u8 = 1;

/// A handle as the object pointer it is (see the module contract).
pub(super) fn obj<T>(verb: Verb, handle: u64) -> Result<*mut T> {
    if handle == 0 {
        return Err(Error::invalid(verb, "null handle"));
    }
    Ok(handle as usize as *mut T)
}

/// A C count that should not be negative, as a `u32` (0 when it is).
pub(super) fn nonneg(v: c_int) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// What `ibv_rereg_mr` is given: libibverbs refuses a non-zero `access` without
/// `CHANGE_ACCESS`, so each argument is passed only with its flag (NULL/0 otherwise).
pub(super) fn rereg_args(
    flags: ReregFlags,
    pd: u64,
    addr: usize,
    len: usize,
    access: Access,
) -> MrAttrs {
    let requested = MrAttrs {
        pd,
        addr,
        len,
        access,
    };
    flags.resolve(MrAttrs::default(), requested)
}

/// # Safety
/// `mr` is a live `ibv_mr`.
pub(super) unsafe fn raw_mr(mr: *mut ffi::ibv_mr) -> RawMr {
    // SAFETY: `mr` is live (caller).
    let m = unsafe { &*mr };
    RawMr {
        handle: mr as u64,
        lkey: Lkey(m.lkey),
        rkey: Rkey(m.rkey),
        addr: m.addr as usize,
        len: m.length,
    }
}
