//! The pool's memory windows: allocated once per PD and reused, each retired before its 8-bit
//! key variant could wrap.
//!
//! Contract: a window is handed out with the number of keys it has used; every bind or unbind
//! uses one (the key's variant advances: `Rkey::next_variant`). A window returns to the cache
//! only unbound and with a key to spare for both a bind and an unbind; otherwise it is
//! *retired*: kept allocated for the pool's life, so that the device cannot give its index to
//! a new window whose keys could meet a stale key of the old one. Windows whose invalidation
//! failed are deallocated instead (that kills their key; see `mod.rs`).
//!
//! Invariant: `allocated == |free1| + |free2| + |retired| + lent`, and every cached window
//! has `used + 2 <= VARIANTS - 1`.

use crate::nic::{Mw, MwType, Pd};
use slab::Slab;

/// Distinct keys per window index: the 8-bit variant.
pub(crate) const VARIANTS: u16 = 256;

/// A window lent out, with the keys it has used since allocation.
pub(crate) struct Lent {
    pub(crate) mw: Mw,
    pub(crate) used: u16,
}

/// See the module contract.
#[derive(Default)]
pub(crate) struct Windows {
    free: [Vec<Lent>; 2],
    /// Windows whose variants are spent, kept allocated (handles in a `slab`).
    retired: Slab<Mw>,
    allocated: u64,
    lent: u64,
}

fn slot(ty: MwType) -> usize {
    match ty {
        MwType::Type1 => 0,
        MwType::Type2 => 1,
    }
}

impl Windows {
    /// A window of type `ty`: a cached one, or a fresh one from `pd`.
    ///
    /// # Errors
    /// `ibv_alloc_mw`'s failure (`Limit` above `max_mw`).
    pub(crate) fn take(&mut self, pd: &Pd, ty: MwType) -> Result<Lent, crate::nic::Error> {
        let lent = match self.free[slot(ty)].pop() {
            Some(l) => l,
            None => {
                let mw = pd.alloc_mw(ty)?;
                self.allocated += 1;
                Lent { mw, used: 0 }
            }
        };
        self.lent += 1;
        Ok(lent)
    }

    /// Return an unbound window after a grant used `keys` more of its keys.
    pub(crate) fn give_back(&mut self, mut l: Lent, keys: u16) {
        self.lent -= 1;
        l.used += keys;
        // Each grant needs a key for its bind and, for type 1, one for its unbind.
        if l.used + 2 < VARIANTS {
            self.free[slot(l.mw.mw_type())].push(l);
        } else {
            self.retired.insert(l.mw);
        }
    }

    /// Forget a window that was deallocated (its `Mw` dropped) by the caller.
    pub(crate) fn dropped(&mut self) {
        self.lent -= 1;
        self.allocated -= 1;
    }

    /// `(allocated, retired, lent)`.
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        (self.allocated, self.retired.len() as u64, self.lent)
    }

    /// Check the invariant of the module contract.
    pub(crate) fn validate(&self) -> bool {
        let cached = (self.free[0].len() + self.free[1].len()) as u64;
        self.allocated == cached + self.retired.len() as u64 + self.lent
            && self.free.iter().flatten().all(|l| l.used + 2 < VARIANTS)
    }
}
