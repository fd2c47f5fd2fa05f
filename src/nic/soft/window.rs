//! Memory-window binds and invalidations on the soft NIC: the checks of `rxe_check_bind_mw` and
//! `rxe_check_invalidate_mw` (IB spec C10-72..75, o10-36.2.2, o10-37.2.26/30/40).
//!
//! Contract: a bind or invalidation either happens whole (the window's binding, its key variant
//! and its region's window count change together, under the window's slot lock) or fails with
//! a [`WindowFault`] and changes nothing. Lock order: window slot, then region slot.
//!
//! Invariant: `region.num_mw == |{ windows bound to it }|` (the key table's `validate`).

use super::counters::{AtomicCounters, bump};
use super::keys::{KeyObj, KeyTable, MwBinding, Requester};
use crate::nic::backend::RawBind;
use crate::nic::types::*;
use std::sync::atomic::Ordering;

/// Why a bind or an invalidation failed (it completes with `MW_BIND_ERR` / `LOC_QP_OP_ERR`;
/// the reason is logged at debug level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WindowFault {
    /// The window's key is not its current one, or names no window.
    StaleWindowKey,
    /// The window's type does not match the verb (type 1: `ibv_bind_mw`; type 2: BIND_MW).
    WrongType,
    /// Window, region and QP are not in one PD.
    WrongPd,
    /// A type 2 window is bound only from the free state, and never to nothing.
    NotFree,
    /// The region is gone, re-registered, or poisoned by a failed re-registration.
    NoRegion,
    /// The region lacks `MW_BIND` (C10-73).
    NoMwBind,
    /// A writable window over a region without `LOCAL_WRITE` (C10-74).
    WritesBeyondRegion,
    /// The window's range leaves the region.
    OutOfRegion,
    /// Only a bound type 2 window can be invalidated (o10-37.2.26), and SEND_WITH_INV only
    /// through the QP it is bound to.
    NotInvalidatable,
}

/// The longest window a bind accepts: mlx5 describes windows with KLMs of at most 2 GiB and
/// refuses longer ones with `EOPNOTSUPP` at post time (providers/mlx5 `set_bind_wr`).
pub(super) const MAX_WINDOW: usize = 1 << 31;

pub(super) fn bind_status(r: Result<(), WindowFault>, status: WcStatus) -> WcStatus {
    match r {
        Ok(()) => WcStatus::Success,
        Err(fault) => {
            tracing::debug!(?fault, "soft NIC: window operation failed");
            status
        }
    }
}

/// A bind to execute: which window, its current and next key, what it binds, and the verb
/// that binds it (type 1: `ibv_bind_mw`; type 2: a BIND_MW work request).
#[derive(Debug, Clone, Copy)]
pub(super) struct WindowBind {
    pub(super) mw: u64,
    pub(super) mw_rkey: Rkey,
    pub(super) new_rkey: Rkey,
    pub(super) bind: RawBind,
    pub(super) via: MwType,
}

/// The checks `ibv_bind_mw` (type 1) makes before posting, as libibverbs and the providers
/// do: `ZERO_BASED` → `EINVAL` (type 1 windows are never zero-based), a region of another PD
/// than the window's → `EPERM` (libibverbs), a window above 2 GiB → `EOPNOTSUPP` (mlx5).
/// Everything else, the QP's PD included, is checked when the bind executes ([`bind`]).
pub(super) fn check_type1_call(table: &KeyTable, mw: u64, bind: &RawBind) -> Result<(), i32> {
    if bind.access.contains(Access::ZERO_BASED) {
        return Err(libc::EINVAL);
    }
    if bind.len > MAX_WINDOW {
        return Err(libc::EOPNOTSUPP);
    }
    // libibverbs compares PDs whenever a region is given, unbinding (length 0) included.
    let mr_pd = match table.read(bind.mr as u32).obj.as_ref() {
        Some(KeyObj::Mr(mr)) => Some(mr.pd),
        _ => None,
    };
    let mw_pd = match table.read(mw as u32).obj.as_ref() {
        Some(KeyObj::Mw(w)) => Some(w.pd),
        _ => None,
    };
    if mr_pd.is_some() && mw_pd.is_some() && mr_pd != mw_pd {
        return Err(libc::EPERM);
    }
    Ok(())
}

/// Bind (or, with a zero length, unbind) a window for the QP `by` (its PD and QP number).
pub(super) fn bind(
    table: &KeyTable,
    counters: &AtomicCounters,
    by: Requester,
    req: &WindowBind,
) -> Result<(), WindowFault> {
    let WindowBind {
        mw,
        mw_rkey,
        new_rkey,
        ref bind,
        via,
    } = *req;
    let mut wslot = table.write(mw as u32);
    if wslot.variant != mw_rkey.variant() || new_rkey.index() != mw_rkey.index() {
        return Err(WindowFault::StaleWindowKey);
    }
    let Some(KeyObj::Mw(w)) = wslot.obj.as_mut() else {
        return Err(WindowFault::StaleWindowKey);
    };
    if w.ty != via {
        return Err(WindowFault::WrongType);
    }
    if w.pd != by.pd {
        return Err(WindowFault::WrongPd);
    }
    if w.ty == MwType::Type2 && (w.binding.is_some() || bind.len == 0) {
        return Err(WindowFault::NotFree);
    }
    let new_binding = if bind.len == 0 {
        None
    } else {
        let mslot = table.read(bind.mr as u32);
        let Some(KeyObj::Mr(mr)) = mslot.obj.as_ref() else {
            return Err(WindowFault::NoRegion);
        };
        if mslot.variant != bind.mr_lkey.variant() || !mr.usable {
            return Err(WindowFault::NoRegion);
        }
        if mr.pd != w.pd {
            return Err(WindowFault::WrongPd);
        }
        if !mr.access.contains(Access::MW_BIND) {
            return Err(WindowFault::NoMwBind);
        }
        // C10-74: a window cannot grant writes the region does not allow locally. (The
        // region needs no remote rights of its own: granting them is what windows are for.)
        if bind
            .access
            .intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !mr.access.contains(Access::LOCAL_WRITE)
        {
            return Err(WindowFault::WritesBeyondRegion);
        }
        if !mr.contains(bind.addr as u64, bind.len as u64) {
            return Err(WindowFault::OutOfRegion);
        }
        mr.num_mw.fetch_add(1, Ordering::AcqRel);
        Some(MwBinding {
            mr_key: (bind.mr as u32) << 8 | mslot.variant as u32,
            addr: bind.addr,
            len: bind.len,
            access: bind.access,
            qpn: (w.ty == MwType::Type2).then_some(by.qpn),
        })
    };
    if let Some(old) = w.binding.take() {
        release_binding(table, old);
    }
    w.binding = new_binding;
    wslot.variant = new_rkey.variant();
    bump(&counters.mw_binds, 1);
    Ok(())
}

/// Drop a binding's hold on its region.
pub(super) fn release_binding(table: &KeyTable, b: MwBinding) {
    let slot = table.read(b.mr_key >> 8);
    if let Some(KeyObj::Mr(mr)) = slot.obj.as_ref().filter(|_| slot.variant == b.mr_key as u8) {
        mr.num_mw.fetch_sub(1, Ordering::AcqRel);
    }
}

/// LOCAL_INV / SEND_WITH_INV: only a valid type 2 window of the QP's PD can be invalidated
/// (rxe_check_invalidate_mw; o10-37.2.26 forbids type 1); SEND_WITH_INV (`qpn` given) further
/// needs the window bound through the receiving QP.
pub(super) fn invalidate(
    table: &KeyTable,
    counters: &AtomicCounters,
    rkey: Rkey,
    pd: u64,
    qpn: Option<u32>,
) -> Result<(), WindowFault> {
    let mut slot = table.write(rkey.index());
    if slot.variant != rkey.variant() {
        return Err(WindowFault::StaleWindowKey);
    }
    let Some(KeyObj::Mw(w)) = slot.obj.as_mut() else {
        return Err(WindowFault::StaleWindowKey);
    };
    if w.pd != pd {
        return Err(WindowFault::WrongPd);
    }
    match w.binding {
        Some(b) if w.ty == MwType::Type2 && qpn.is_none_or(|q| b.qpn == Some(q)) => {
            w.binding = None;
            release_binding(table, b);
            bump(&counters.invalidations, 1);
            Ok(())
        }
        _ => Err(WindowFault::NotInvalidatable),
    }
}
