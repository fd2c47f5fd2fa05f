//! Conversions shared by the verbs backend's files: handles to object pointers, C counts to
//! Rust ones, and the port every QP uses.
//!
//! Contract: a backend handle is the address of the libibverbs object it names (never 0 for a
//! live object); a negative C count reads as 0.

use crate::nic::error::{Error, Result, Verb};
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
