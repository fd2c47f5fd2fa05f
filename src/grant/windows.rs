//! The pool's memory windows: allocated once per PD and reused; no key a window gave a peer
//! comes back within the key horizon.
//!
//! Contract: a window is handed out with the number of keys it has used; every bind or unbind
//! uses one. A type 2 window's keys follow its own random order of the 8-bit variants (drawn
//! from `getrandom` when it is allocated: a peer that saw its earlier keys cannot predict the
//! next), a type 1 window's the driver's (`ibv_inc_rkey`: the next variant). Either way no key
//! repeats within a window's life, and no bind uses a key the process's key book
//! (`keybook.rs`) says a peer may still hold: a type 2 window skips such variants, a type 1
//! window (whose next variant the driver picks) is retired instead ([`Lent::next_key`],
//! under the book's lock: `keybook::claim`).
//! A window returns to the cache only unbound and with a key to spare for both a bind and an
//! unbind; otherwise it is *retired*: kept allocated, so that the device cannot give its index
//! to a new window or region, until `horizon` more grants of the pool
//! ([`GrantLimits::key_horizon`], 2^20 by default) were issued; only then is it deallocated.
//! A window deallocated early (its invalidation failed: deallocation is what kills its key),
//! or with its pool, gives its index back to the device, but not its keys: they stay in the
//! key book for the horizon, so whichever window or region of the process gets the index next
//! skips or holds them. Where the device hands the index out again at once (the soft NIC,
//! recycling lowest first), the pool takes it straight back as a placeholder window.
//! Windows the device refuses (`max_mw`) refuse the grant: a small `max_mw` bounds how many
//! grants the horizon lets through rather than weakening it.
//!
//! Invariant: `allocated == |free1| + |free2| + |retired| + lent`, every cached window has a
//! key to spare (`used + 2 <= cap`), and `retired` is ordered by the grant count it retired at.
//!
//! [`GrantLimits::key_horizon`]: super::GrantLimits::key_horizon

use super::keybook;
use crate::nic::{Mw, MwType, Pd, Rkey};
use std::collections::VecDeque;

/// A window lent out, with the keys it has used since allocation.
pub(crate) struct Lent {
    pub(crate) mw: Mw,
    pub(crate) used: u16,
    /// How many keys the window may use in all: 255 (every variant but the one it was
    /// allocated with), less the stale variants of its index it must skip.
    cap: u16,
    /// A type 2 window's order of variants (`order[used]` is its next key's; the stale ones
    /// sit past `cap`); `None` for type 1, whose driver picks the next variant.
    order: Option<Box<[u8; 256]>>,
    /// The variants of its index a peer may still hold (the key book's when the window was
    /// allocated: the index is the window's alone since).
    stale: [u64; 4],
    /// The book entry of its index the window holds, and the keys it gave to peers.
    book: Hold,
}

/// A window's hold on its index's key-book entry (`keybook::hold`): the keys it gave to peers
/// (a bit per variant), published when it is deallocated, the horizon they take, and the
/// process's grant clock when the last of them died (the window came back unbound).
#[derive(Debug, Clone, Copy)]
struct Hold {
    given: [u64; 4],
    horizon: u64,
    died: u64,
}

impl Hold {
    /// The window is unbound again: every key it gave out is dead from now.
    fn dead_now(&mut self, horizon: u64) {
        self.horizon = self.horizon.max(horizon);
        self.died = keybook::CLOCK.load(std::sync::atomic::Ordering::Relaxed);
    }

    /// Publish the keys given out to the book: the window's index goes back to the device.
    fn release(self, mw: &Mw) {
        let until = self.died.saturating_add(self.horizon);
        keybook::unhold(mw.pd().nic(), mw.rkey().index(), self.given, until);
    }
}

/// A window kept allocated (spent, or on an index with no fresh key, or a placeholder), with
/// the grant count it retired at.
struct Retiree {
    mw: Mw,
    at: u64,
    /// `None` for a placeholder, which gave no key and holds no entry.
    book: Option<Hold>,
}

impl Lent {
    /// A fresh window, or the window back when its index has too few variants a peer cannot
    /// hold (the key book's).
    fn fresh(mw: Mw, stale: [u64; 4], book: Hold) -> Result<Lent, Box<(Mw, Hold)>> {
        let first = mw.rkey().variant();
        let is_stale = |v: u8| v != first && stale[v as usize / 64] & 1 << (v % 64) != 0;
        let n_stale = (0..=255u8).filter(|&v| is_stale(v)).count() as u16;
        if n_stale > 250 {
            return Err(Box::new((mw, book)));
        }
        // A type 1 window cannot skip variants (the driver picks the next): its stale ones are
        // met at bind time ([`Lent::next_key`]), where the window is retired.
        let n_stale = if mw.mw_type() == MwType::Type1 {
            0
        } else {
            n_stale
        };
        let order = (mw.mw_type() == MwType::Type2).then(|| {
            let mut o = random_order(first);
            // The stale variants go last (before `first`), past `cap`: never used.
            o[..255].sort_by_key(|&v| is_stale(v));
            o
        });
        Ok(Lent {
            mw,
            used: 0,
            cap: 255 - n_stale,
            order,
            stale,
            book,
        })
    }

    /// A bind through the window gave `key` to a peer.
    pub(crate) fn gave(&mut self, key: Rkey) {
        let v = key.variant() as usize;
        self.book.given[v / 64] |= 1 << (v % 64);
    }

    /// Whether the window has a key to spare for another grant (a bind and, for type 1, an
    /// unbind).
    fn spare(&self) -> bool {
        self.used + 2 <= self.cap
    }

    /// The variant of a type 2 window's next bind.
    pub(crate) fn next_variant(&self) -> u8 {
        match &self.order {
            Some(o) => o[self.used as usize],
            None => self.mw.rkey().next_variant().variant(),
        }
    }

    /// The key of the window's next bind, past every variant a peer may still hold (the key
    /// book's when the window was allocated: a type 2 window skips them, a type 1 window,
    /// whose next variant the driver picks, cannot); `None` when the window has no such key
    /// to spare: retire it.
    pub(crate) fn next_key(&mut self) -> Option<Rkey> {
        let stale = self.stale;
        let is_stale = |v: u8| stale[v as usize / 64] & 1 << (v % 64) != 0;
        while self.spare() {
            let v = self.next_variant();
            if !is_stale(v) {
                return Some(Rkey(self.mw.rkey().index() << 8 | v as u32));
            }
            // A type 1 window (no order of its own) cannot skip it.
            self.order.as_ref()?;
            self.used += 1;
        }
        None
    }
}

/// A random order of the 256 variants with `first` (the window's key when allocated, never
/// handed out) last: a Fisher–Yates shuffle driven by `getrandom` bytes.
fn random_order(first: u8) -> Box<[u8; 256]> {
    let mut o = Box::new([0u8; 256]);
    let mut rest = (0..=255u8).filter(|&v| v != first);
    for slot in o.iter_mut().take(255) {
        *slot = rest.next().unwrap_or(first);
    }
    o[255] = first;
    let mut seed = [0u8; 16];
    // SAFETY: `seed` is a writable buffer of its length.
    let got = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
    if got != seed.len() as isize {
        // No entropy source: still a permutation (never repeats), less unpredictable.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        seed = (t ^ (o.as_ptr() as u128) << 64).to_le_bytes();
    }
    let mut x = u128::from_le_bytes(seed) | 1;
    for i in (1..255usize).rev() {
        // xorshift128 on the seed; the modulo bias over 128 bits is negligible.
        x ^= x << 35;
        x ^= x >> 41;
        x ^= x << 17;
        let j = (x % (i as u128 + 1)) as usize;
        o.swap(i, j);
    }
    o
}

/// See the module contract.
#[derive(Default)]
pub(crate) struct Windows {
    free: [Vec<Lent>; 2],
    /// Windows kept allocated, oldest first.
    retired: VecDeque<Retiree>,
    allocated: u64,
    lent: u64,
    /// Retired windows deallocated after the horizon.
    recycled: u64,
}

/// Why no window could be taken.
#[derive(Debug)]
pub(crate) enum Take {
    /// `ibv_alloc_mw` failed (`Limit` above `max_mw`).
    Nic(crate::nic::Error),
    /// The key book is full (its capacity).
    Full(usize),
}

fn slot(ty: MwType) -> usize {
    match ty {
        MwType::Type1 => 0,
        MwType::Type2 => 1,
    }
}

impl Windows {
    /// A window of type `ty` in `pd`: a cached one, or a fresh one whose index has keys to
    /// spare; `now` is the pool's grant count.
    ///
    /// # Errors
    /// `ibv_alloc_mw`'s failure (`Limit` above `max_mw`); a full key book (the fresh window
    /// could not hold its index's entry: it is deallocated, never used).
    pub(crate) fn take(
        &mut self,
        pd: &Pd,
        ty: MwType,
        now: u64,
        horizon: u64,
    ) -> Result<Lent, Take> {
        // Windows past the horizon go before a new one is asked of the device (`max_mw`).
        drop(self.expired(now, horizon));
        let free = &mut self.free[slot(ty)];
        // The newest window of `pd` (the pool's own PD, or a rail's).
        let mine = free.iter().rposition(|l| l.mw.pd() == pd);
        let lent = match mine.map(|i| free.swap_remove(i)) {
            Some(l) => l,
            None => loop {
                let mw = pd.alloc_mw(ty).map_err(Take::Nic)?;
                if let Some(l) = self.adopt(mw, now, horizon)? {
                    break l;
                }
            },
        };
        self.lent += 1;
        Ok(lent)
    }

    /// A window fresh from the device: it holds its index's book entry, and is `Some` when it
    /// has keys to give; else it is retired (held), `None`.
    fn adopt(&mut self, mw: Mw, now: u64, horizon: u64) -> Result<Option<Lent>, Take> {
        let stale = keybook::hold(mw.pd().nic(), mw.rkey().index()).map_err(|f| Take::Full(f.0))?;
        self.allocated += 1;
        let book = Hold {
            given: [0; 4],
            horizon,
            died: 0,
        };
        match Lent::fresh(mw, stale, book) {
            Ok(l) => Ok(Some(l)),
            // The device handed back an index with no fresh key: hold it.
            Err(held) => {
                let (mw, book) = *held;
                self.retired.push_back(Retiree {
                    mw,
                    at: now,
                    book: Some(book),
                });
                Ok(None)
            }
        }
    }

    /// Return an unbound window after a grant used `keys` more of its keys. Returns the
    /// retired windows past the horizon, to deallocate (the caller drops them, outside any
    /// lock of its own it cares about).
    pub(crate) fn give_back(&mut self, mut l: Lent, keys: u16, now: u64, horizon: u64) -> Vec<Mw> {
        self.lent -= 1;
        l.used += keys;
        l.book.dead_now(horizon);
        // Each grant needs a key for its bind and, for type 1, one for its unbind.
        if l.spare() {
            self.free[slot(l.mw.mw_type())].push(l);
        } else {
            self.retired.push_back(Retiree {
                mw: l.mw,
                at: now,
                book: Some(l.book),
            });
        }
        self.expired(now, horizon)
    }

    /// Retire a lent window that has no key to spare ([`Lent::next_key`]): kept allocated
    /// until the horizon, like a spent one.
    pub(crate) fn retire(&mut self, mut l: Lent, now: u64) {
        self.lent -= 1;
        l.book.dead_now(0);
        self.retired.push_back(Retiree {
            mw: l.mw,
            at: now,
            book: Some(l.book),
        });
    }

    /// Retired windows whose horizon passed, taken out of the count, their keys published to
    /// the book (the caller deallocates them by dropping).
    fn expired(&mut self, now: u64, horizon: u64) -> Vec<Mw> {
        let mut out = Vec::new();
        while self
            .retired
            .front()
            .is_some_and(|r| now.saturating_sub(r.at) >= horizon)
        {
            if let Some(r) = self.retired.pop_front() {
                if let Some(h) = r.book {
                    h.release(&r.mw);
                }
                out.push(r.mw);
            }
        }
        self.allocated -= out.len() as u64;
        self.recycled += out.len() as u64;
        out
    }

    /// Deallocate a lent window now (its invalidation failed: this kills its key; the key book
    /// keeps its keys refused), and take the index straight back as a placeholder if the device hands it out
    /// again. Gives the window back when the device refuses to deallocate it.
    pub(crate) fn dealloc_early(
        &mut self,
        l: Lent,
        now: u64,
        horizon: u64,
    ) -> Result<(), Box<(Lent, crate::nic::Error)>> {
        let (pd, ty, key) = (l.mw.pd().clone(), l.mw.mw_type(), l.mw.rkey());
        let Lent {
            mw,
            used,
            cap,
            order,
            stale,
            mut book,
        } = l;
        book.dead_now(horizon);
        // Published first (nothing is forgotten: the entry lives on for the horizon).
        book.release(&mw);
        if let Err((mw, e)) = mw.dealloc() {
            // Still allocated: it holds the entry again (never full: the entry exists).
            let _ = keybook::hold(mw.pd().nic(), mw.rkey().index());
            let book = Hold {
                given: [0; 4],
                ..book
            };
            let l = Lent {
                mw,
                used,
                cap,
                order,
                stale,
                book,
            };
            return Err(Box::new((l, e)));
        }
        self.lent -= 1;
        self.allocated -= 1;
        if horizon > 0 {
            // The key book keeps every key the window gave out refused; the index is also
            // taken straight back if the device hands it out again at once.
            if let Some(mw) = self.placeholder(&pd, ty, key, now, horizon) {
                self.allocated += 1;
                self.retired.push_back(Retiree {
                    mw,
                    at: now,
                    book: None,
                });
            }
        }
        Ok(())
    }

    /// A window of type `ty` in `pd` allocated to take `key`'s index back from the device:
    /// `Some` when it landed there (the caller holds it); otherwise it joins the cache as a
    /// fresh window and `None` is returned (as when the device refuses a window).
    pub(crate) fn placeholder(
        &mut self,
        pd: &Pd,
        ty: MwType,
        key: Rkey,
        now: u64,
        horizon: u64,
    ) -> Option<Mw> {
        let mw = pd.alloc_mw(ty).ok()?;
        if mw.rkey().index() == key.index() {
            return Some(mw);
        }
        // Another index: a fresh window for the cache (a full book: deallocated, unused).
        if let Ok(Some(l)) = self.adopt(mw, now, horizon) {
            self.free[slot(ty)].push(l);
        }
        None
    }

    /// The pool is going: every window's keys are published to the book (their indices go
    /// back to the device as the windows are deallocated, by dropping).
    pub(crate) fn release_all(&mut self) {
        for l in self.free.iter().flatten() {
            l.book.release(&l.mw);
        }
        for r in &self.retired {
            if let Some(h) = r.book {
                h.release(&r.mw);
            }
        }
    }

    /// `(allocated, retired, recycled)`.
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        (self.allocated, self.retired.len() as u64, self.recycled)
    }

    /// Check the invariant of the module contract.
    pub(crate) fn validate(&self) -> bool {
        let cached = (self.free[0].len() + self.free[1].len()) as u64;
        self.allocated == cached + self.retired.len() as u64 + self.lent
            && self.free.iter().flatten().all(Lent::spare)
            && self
                .retired
                .iter()
                .zip(self.retired.iter().skip(1))
                .all(|(a, b)| a.at <= b.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::Nic;

    #[test]
    fn spent_windows_retire_and_are_deallocated_only_after_the_horizon() {
        let pd = Nic::soft().alloc_pd().unwrap();
        let mut w = Windows::default();
        let first = w.take(&pd, MwType::Type2, 0, 100).unwrap();
        let first_key = first.mw.rkey();
        assert!(w.give_back(first, 1, 0, 100).is_empty(), "cached");
        let again = w.take(&pd, MwType::Type2, 1, 100).unwrap();
        assert_eq!((again.mw.rkey(), again.used), (first_key, 1), "lent again");
        assert!(w.give_back(again, 253, 1, 100).is_empty(), "retired");
        assert_eq!(w.counts(), (1, 1, 0));
        // Retirements do not push it out; grants do.
        for now in 2..5 {
            let l = w.take(&pd, MwType::Type2, now, 100).unwrap();
            assert!(w.give_back(l, 254, now, 100).is_empty());
        }
        assert_eq!(w.counts(), (4, 4, 0));
        let l = w.take(&pd, MwType::Type2, 100, 100).unwrap();
        let out = w.give_back(l, 1, 101, 100);
        assert_eq!(out.len(), 1, "only the window retired 100 grants ago");
        assert_eq!(out[0].rkey().index(), first_key.index());
        assert!(w.validate());
    }

    #[test]
    fn a_type2_windows_variants_never_repeat_and_follow_no_fixed_step() {
        let pd = Nic::soft().alloc_pd().unwrap();
        let mut w = Windows::default();
        let mut l = w.take(&pd, MwType::Type2, 0, 1 << 20).unwrap();
        let first = l.mw.rkey().variant();
        let mut seen = std::collections::HashSet::new();
        let mut steps = std::collections::HashSet::new();
        let mut prev = first;
        while l.spare() {
            let v = l.next_variant();
            assert!(seen.insert(v), "variant {v} twice");
            assert_ne!(v, first, "the unbound key is never a grant's");
            steps.insert(v.wrapping_sub(prev));
            prev = v;
            l.used += 1;
        }
        assert!(steps.len() > 16, "a shuffled order, not a fixed step");
        let o1 = random_order(0);
        let o2 = random_order(0);
        assert_ne!(o1[..8], o2[..8], "each window draws its own order");
    }

    #[test]
    fn an_index_deallocated_early_is_held_when_the_device_hands_it_back() {
        let pd = Nic::soft().alloc_pd().unwrap();
        let mut w = Windows::default();
        let l = w.take(&pd, MwType::Type2, 0, 1 << 20).unwrap();
        let index = l.mw.rkey().index();
        w.dealloc_early(l, 0, 1 << 20).map_err(|b| b.1).unwrap();
        // The soft NIC recycles lowest first: the placeholder took the index back.
        assert_eq!(w.counts(), (1, 1, 0));
        let next = w.take(&pd, MwType::Type2, 1, 1 << 20).unwrap();
        assert_ne!(next.mw.rkey().index(), index);
        assert!(w.validate());
    }
}
