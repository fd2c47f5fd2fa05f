//! Retiring a revoked region grant's key: the region stays registered, without remote rights
//! and pointed at one dummy page, until the key horizon passes, so that its key index is not
//! handed to a later region or window whose key could equal the stale one.
//!
//! Contract: [`Grants::retire_region`] kills the key first, then keeps the index:
//! - `ibv_rereg_mr(CHANGE_ACCESS | CHANGE_TRANSLATION)` onto [`DUMMY`] with `LOCAL_WRITE`
//!   only (an ODP region keeps its translation: moving it would change its keys on mlx5, and
//!   it pins nothing). A remote access with the old key is then refused (no remote right, and
//!   on the dummy page nothing of the pool's). If the driver answers with new keys (it rebuilt
//!   the region), the old index went back to the device: it is tainted as a window's
//!   deallocated early is (`windows.rs`), and the rebuilt region, whose key no peer saw, is
//!   deregistered.
//! - Where the device has no `rereg_mr` (`Quirk::ReregUnsupported`, kernel rxe) or refuses
//!   it, the region is deregistered and its index tainted: how soon the device hands that
//!   index out again, and with which variant, is the driver's choice (rxe allocates indices
//!   cyclically over `max_mr` and draws the variant at random).
//! - A deregistration the device refuses leaves the key possibly alive: the region comes back
//!   to the caller, which keeps the grant open (fail closed).
//!
//! Retired regions count against `max_mr` with the arena's own: at most a quarter of
//! `max_mr` (and [`RETIRED_MAX`]) are kept. Beyond that the oldest is deregistered before its
//! horizon and its exact key tainted: this pool never gives a later grant that key within the
//! horizon, but the device may hand the index to another pool's or the application's region
//! (with the variant its driver picks): the weaker bound of region grants, documented in the
//! module contract.
//!
//! Invariant: `list` is ordered by the grant count each region retired at, and
//! `|list| <= retired_max(max_mr)`.

use super::Grants;
use crate::nic::quirks::{self, Quirk};
use crate::nic::{Access, Mr, ReregFlags};
use std::cell::UnsafeCell;
use std::collections::VecDeque;

/// The page retired regions point at: never read or written through them (no remote rights,
/// and their lkeys are never posted).
#[repr(C, align(4096))]
struct DummyPage(UnsafeCell<[u8; 4096]>);

// SAFETY: nothing reads or writes the page through Rust; it is only an address to register.
unsafe impl Sync for DummyPage {}

static DUMMY: DummyPage = DummyPage(UnsafeCell::new([0; 4096]));

/// The retired regions of a pool, oldest first, with the grant count they retired at.
#[derive(Default)]
pub(super) struct Retired {
    list: VecDeque<(Mr, u64)>,
}

impl Retired {
    pub(super) fn len(&self) -> usize {
        self.list.len()
    }
}

/// Most retired regions kept on any device.
pub(super) const RETIRED_MAX: usize = 1 << 16;

/// Most retired regions kept on a device with `max_mr` regions.
pub(super) fn retired_max(max_mr: u32) -> usize {
    (max_mr as usize / 4).clamp(1, RETIRED_MAX)
}

impl Grants {
    /// Kill a revoked region grant's key and keep its index until the horizon (see the
    /// module contract). `Err` gives the region back when its key may still work.
    pub(super) fn retire_region(&self, mut mr: Mr) -> Result<(), Mr> {
        let (now, horizon) = self.clock();
        let (pd, old) = (mr.pd().clone(), mr.rkey());
        let caps = pd.nic().caps();
        let moved = !quirks::applies(caps, Quirk::ReregUnsupported) && horizon > 0 && {
            let odp = mr.is_odp();
            let (flags, access) = if odp {
                (
                    ReregFlags::CHANGE_ACCESS,
                    Access::LOCAL_WRITE | Access::ON_DEMAND,
                )
            } else {
                (
                    ReregFlags::CHANGE_ACCESS | ReregFlags::CHANGE_TRANSLATION,
                    Access::LOCAL_WRITE,
                )
            };
            // SAFETY: the dummy page is static and writable; no lkey of a retired region is
            // ever posted, and without remote rights no peer reaches it.
            unsafe { mr.rereg(flags, None, DUMMY.0.get().cast(), 4096, access) }.is_ok()
        };
        if moved && mr.rkey().index() == old.index() {
            let mut r = super::lock(&self.retired);
            r.list.push_back((mr, now));
            let mut expired = expire(&mut r, now, horizon);
            // Beyond the bound the oldest goes early: its key is tainted, not forgotten.
            let early = r.list.len().saturating_sub(retired_max(caps.max_mr));
            let early: Vec<Mr> = r.list.drain(..early).map(|(mr, _)| mr).collect();
            drop(r);
            for mr in &early {
                super::lock(&self.windows).taint(mr.pd(), mr.rkey(), false, None, now);
            }
            expired.extend(early);
            self.dereg_expired(expired);
            return Ok(());
        }
        // Deregistered (or rebuilt by the driver): the old index went back to the device.
        if let Err(e) = mr.dereg() {
            tracing::warn!(error = %e.error, "rdma_pool: a revoked region grant refused dereg");
            return Err(e.mr);
        }
        if horizon > 0 {
            super::lock(&self.windows).taint(&pd, old, false, None, now);
        }
        Ok(())
    }

    fn dereg_expired(&self, expired: Vec<Mr>) {
        for mr in expired {
            if let Err(e) = mr.dereg() {
                tracing::warn!(error = %e.error, "rdma_pool: a retired region refused dereg; kept");
                super::lock(&self.retired).list.push_front((e.mr, 0));
            }
        }
    }
}

/// Take the retired regions whose horizon passed out of `r`.
fn expire(r: &mut Retired, now: u64, horizon: u64) -> Vec<Mr> {
    let mut out = Vec::new();
    while r
        .list
        .front()
        .is_some_and(|&(_, at)| now.saturating_sub(at) >= horizon)
    {
        out.extend(r.list.pop_front().map(|(mr, _)| mr));
    }
    out
}
