//! Retiring a revoked region grant's key: its index stays held — by the region itself,
//! without remote rights and pointed at one dummy page, or by a placeholder window — so that
//! the device does not hand it to a later region or window whose key could equal the stale one.
//!
//! Contract: [`Grants::retire_region`] kills the key first, then holds the index:
//! - `ibv_rereg_mr(CHANGE_ACCESS | CHANGE_TRANSLATION)` onto [`DUMMY`] with `LOCAL_WRITE`
//!   only (an ODP region keeps its translation: moving it would change its keys on mlx5, and
//!   it pins nothing). A remote access with the old key is then refused (no remote right, and
//!   on the dummy page nothing of the pool's). The region itself holds the index.
//! - Where the device has no `rereg_mr` (`Quirk::ReregUnsupported`, kernel rxe), refuses it,
//!   or answers with an index of its own (it rebuilt the region), the region is deregistered,
//!   which kills the key, and a placeholder window takes the index straight back where the
//!   device hands it out again at once (the soft NIC recycles lowest first; rxe allocates
//!   indices cyclically over `max_mr`, with a random variant, so it does not).
//! - A deregistration the device refuses leaves the key possibly alive: the region comes back
//!   to the caller, which keeps the grant open (fail closed).
//!
//! Regions are scarce (they count against `max_mr` with the arena's own): at most a quarter of
//! `max_mr` indices stay held, oldest first; beyond that, and once the key horizon passed, the
//! oldest is released. So a revoked region key is refused for at least that many later region
//! grants of the pool (4096 on the soft NIC's default device) and for as long as the horizon
//! where fewer are made; after, which key the device gives that index next is its driver's
//! choice. That is the weaker bound of region grants (the module contract).
//!
//! Invariant: `held` is ordered by the grant count each entry retired at, and
//! `|held| <= retired_max(max_mr)`.

use super::Grants;
use crate::nic::quirks::{self, Quirk};
use crate::nic::{Access, Mr, Mw, MwType, ReregFlags};
use std::cell::UnsafeCell;
use std::collections::VecDeque;

/// The page retired regions point at: never read or written through them (no remote rights,
/// and their lkeys are never posted).
#[repr(C, align(4096))]
struct DummyPage(UnsafeCell<[u8; 4096]>);

// SAFETY: nothing reads or writes the page through Rust; it is only an address to register.
unsafe impl Sync for DummyPage {}

static DUMMY: DummyPage = DummyPage(UnsafeCell::new([0; 4096]));

/// What holds a revoked region grant's index.
enum Held {
    /// The region, moved onto the dummy page without remote rights.
    Region(Mr),
    /// A window that took the index back after the region was deregistered.
    Placeholder(Mw),
}

/// A held index: what holds it, the key the peer had, and the grant count it retired at.
struct Entry {
    held: Held,
    key: crate::nic::Rkey,
    nic: crate::nic::Nic,
    at: u64,
}

/// The held indices of a pool's revoked region grants, oldest first, with the grant count
/// they retired at.
#[derive(Default)]
pub(super) struct Retired {
    held: VecDeque<Entry>,
    placeholders: usize,
}

impl Retired {
    /// `(revoked regions still registered on the dummy page, placeholder windows)`.
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.held.len() - self.placeholders, self.placeholders)
    }

    /// The pool is going, and its held indices with it: each stale key is tainted for the
    /// other pools of the process, for the horizon.
    pub(super) fn taint_all(&self, horizon: u64) {
        if horizon > 0 {
            for e in &self.held {
                super::windows::taint(&e.nic, e.key, false, horizon);
            }
        }
    }
}

/// Most retired region indices held on any device.
const RETIRED_MAX: usize = 1 << 16;

/// Most retired region indices held on a device with `max_mr` regions.
fn retired_max(max_mr: u32) -> usize {
    (max_mr as usize / 4).clamp(1, RETIRED_MAX)
}

impl Grants {
    /// Kill a revoked region grant's key and hold its index (see the module contract). `Err`
    /// gives the region back when its key may still work.
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
        let held = if moved && mr.rkey().index() == old.index() {
            Some(Held::Region(mr))
        } else {
            // Deregistered (or rebuilt by the driver): the old index went back to the device.
            if let Err(e) = mr.dereg() {
                tracing::warn!(error = %e.error, "rdma_pool: a revoked region grant refused dereg");
                return Err(e.mr);
            }
            let ty = match (caps.max_mw > 0, caps.mw_type2, caps.mw_type1) {
                (true, true, _) => Some(MwType::Type2),
                (true, false, true) => Some(MwType::Type1),
                _ => None,
            };
            // Placeholders take windows from the pool's grants: at most a quarter of max_mw.
            let room = super::lock(&self.retired).placeholders < (caps.max_mw as usize / 4);
            let windows = &self.windows;
            ty.filter(|_| horizon > 0 && room)
                .and_then(|ty| super::lock(windows).placeholder(&pd, ty, old, now))
                .map(Held::Placeholder)
        };
        let mut r = super::lock(&self.retired);
        if let Some(held) = held {
            r.placeholders += matches!(held, Held::Placeholder(_)) as usize;
            let nic = pd.nic().clone();
            r.held.push_back(Entry {
                held,
                key: old,
                nic,
                at: now,
            });
        }
        // Beyond the bound the oldest goes early; past the horizon, all that passed it.
        let early = r.held.len().saturating_sub(retired_max(caps.max_mr));
        let late = r
            .held
            .iter()
            .skip(early)
            .take_while(|e| now.saturating_sub(e.at) >= horizon)
            .count();
        let released: Vec<Entry> = r.held.drain(..early + late).collect();
        r.placeholders -= released
            .iter()
            .filter(|e| matches!(e.held, Held::Placeholder(_)))
            .count();
        drop(r);
        for (i, e) in released.into_iter().enumerate() {
            // Released before its horizon, the index goes back to the device: no window of the
            // process's pools binds the stale variant there until then (a region may: the
            // driver's choice).
            if i < early {
                let left = horizon.saturating_sub(now.saturating_sub(e.at));
                super::windows::taint(&e.nic, e.key, false, left);
            }
            release(e.held);
        }
        Ok(())
    }
}

/// Give a held index back to the device (a refusal only logs: the object stays allocated,
/// and its key, without remote rights, reaches nothing).
fn release(h: Held) {
    let r = match h {
        Held::Region(mr) => mr.dereg().map_err(|e| e.error),
        Held::Placeholder(mw) => mw.dealloc().map_err(|(_, e)| e),
    };
    if let Err(e) = r {
        tracing::warn!(error = %e, "rdma_pool: a retired region's index could not be released");
    }
}
