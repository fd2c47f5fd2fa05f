//! The pool's memory windows: allocated once per PD and reused, each retired before its 8-bit
//! key variant could wrap.
//!
//! Contract: a window is handed out with the number of keys it has used; every bind or unbind
//! uses one (the key's variant advances: `Rkey::next_variant`). A window returns to the cache
//! only unbound and with a key to spare for both a bind and an unbind; otherwise it is
//! *retired*: kept allocated, so that the device cannot give its index to a new window whose
//! keys could meet a stale key of the old one. Retired windows are kept in the order they
//! retired, at most [`RETIRED_MAX`] (or half of `max_mw`): beyond that the oldest is
//! deallocated. Keeping them all would exhaust `max_mw` after `max_mw · 254` grants and stop
//! every grant; bounded, a key can come back only after at least `retired_max · 254` later
//! grants, long after any honest peer let go of it. Windows whose invalidation failed are
//! deallocated at once (that kills their key; see `mod.rs`).
//!
//! Invariant: `allocated == |free1| + |free2| + |retired| + lent`, `|retired| <= retired_max`,
//! and every cached window has `used + 2 <= VARIANTS - 1`.

use crate::nic::{Mw, MwType, Pd};
use std::collections::VecDeque;

/// Distinct keys per window index: the 8-bit variant.
pub(crate) const VARIANTS: u16 = 256;

/// Most retired windows kept allocated.
pub(crate) const RETIRED_MAX: usize = 4096;

/// A window lent out, with the keys it has used since allocation.
pub(crate) struct Lent {
    pub(crate) mw: Mw,
    pub(crate) used: u16,
}

/// See the module contract.
#[derive(Default)]
pub(crate) struct Windows {
    free: [Vec<Lent>; 2],
    /// Windows whose variants are spent, oldest first, kept allocated.
    retired: VecDeque<Mw>,
    allocated: u64,
    lent: u64,
    /// Retired windows deallocated to stay within the bound.
    recycled: u64,
}

fn slot(ty: MwType) -> usize {
    match ty {
        MwType::Type1 => 0,
        MwType::Type2 => 1,
    }
}

impl Windows {
    /// A window of type `ty` in `pd`: a cached one, or a fresh one.
    ///
    /// # Errors
    /// `ibv_alloc_mw`'s failure (`Limit` above `max_mw`).
    pub(crate) fn take(&mut self, pd: &Pd, ty: MwType) -> Result<Lent, crate::nic::Error> {
        let free = &mut self.free[slot(ty)];
        // The newest window of `pd` (the pool's own PD, or a rail's).
        let mine = free.iter().rposition(|l| l.mw.pd() == pd);
        let lent = match mine.map(|i| free.swap_remove(i)) {
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

    /// Return an unbound window after a grant used `keys` more of its keys; windows of `pd`'s
    /// device (for its `max_mw`). Returns the window to deallocate, if the retired bound was
    /// reached (the caller drops it, outside any lock of its own it cares about).
    pub(crate) fn give_back(&mut self, mut l: Lent, keys: u16, max_mw: u32) -> Option<Mw> {
        self.lent -= 1;
        l.used += keys;
        // Each grant needs a key for its bind and, for type 1, one for its unbind.
        if l.used + 2 < VARIANTS {
            self.free[slot(l.mw.mw_type())].push(l);
            return None;
        }
        self.retired.push_back(l.mw);
        if self.retired.len() <= retired_max(max_mw) {
            return None;
        }
        self.allocated -= 1;
        self.recycled += 1;
        self.retired.pop_front()
    }

    /// Forget a window that was deallocated (its `Mw` dropped) by the caller.
    pub(crate) fn dropped(&mut self) {
        self.lent -= 1;
        self.allocated -= 1;
    }

    /// `(allocated, retired, recycled)`.
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        (self.allocated, self.retired.len() as u64, self.recycled)
    }

    /// Check the invariant of the module contract.
    pub(crate) fn validate(&self) -> bool {
        let cached = (self.free[0].len() + self.free[1].len()) as u64;
        self.allocated == cached + self.retired.len() as u64 + self.lent
            && self.retired.len() <= RETIRED_MAX
            && self.free.iter().flatten().all(|l| l.used + 2 < VARIANTS)
    }
}

/// How many retired windows are kept on a device with `max_mw` windows.
fn retired_max(max_mw: u32) -> usize {
    RETIRED_MAX.min(max_mw as usize / 2).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::Nic;

    #[test]
    fn spent_windows_retire_and_the_oldest_beyond_the_bound_is_deallocated() {
        let pd = Nic::soft().alloc_pd().unwrap();
        let mut w = Windows::default();
        let first = w.take(&pd, MwType::Type2).unwrap();
        let first_key = first.mw.rkey();
        assert!(
            w.give_back(first, 1, 8).is_none(),
            "a fresh window is cached"
        );
        let again = w.take(&pd, MwType::Type2).unwrap();
        assert_eq!(
            (again.mw.rkey(), again.used),
            (first_key, 1),
            "and lent again"
        );
        assert!(
            w.give_back(again, 253, 8).is_none(),
            "254 keys used: retired"
        );
        assert_eq!(w.counts(), (1, 1, 0));
        // On a device with 8 windows, 4 are kept retired; the fifth retirement frees the first.
        let mut out = Vec::new();
        for _ in 0..4 {
            let l = w.take(&pd, MwType::Type2).unwrap();
            out.extend(w.give_back(l, 254, 8));
        }
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0].rkey(),
            first_key,
            "the oldest retired window goes first"
        );
        assert_eq!(w.counts(), (4, 4, 1));
        assert!(w.validate());
    }
}
