//! A purge pass's sweep: every due unit is taken out of its free list, the units are purged in
//! runs of adjacent slabs, and what the arena kept is listed again.
//!
//! Contract:
//! - a *unit* is what a free list holds whole: a slab of small pages that are all listed (its
//!   pages, taken under the list's lock: `small_free` full), an empty page of a slab, or a
//!   cached large run (its first slab's idle stamp stands for it). It is *due* once idle for
//!   the delay (`cutoff`);
//! - due units are taken first, all of them, then purged: adjacent ones in one call, so that
//!   the arena takes a pinned region out whole when every slab it covers is due — also one
//!   whose keys were handed out, which a purge of one slab at a time must refuse (the region
//!   covers memory the call does not hold), and which would then stay pinned for good;
//! - a unit is held (in no list: no thread can take it) from its take until it is listed
//!   again or made spare; a unit the arena purged whole is made spare, any other listed again
//!   (a large run partly purged is revived at its reuse, `PoolInner::reuse`).
//!
//! Invariant: between a sweep's take and its end, `idle[s] == TAKEN` iff slab `s` lies in a
//! unit the sweep holds; after it no slab is `TAKEN`: a held unit's first slab is `HANDLED`
//! (purged, or refused by the arena: tried again once it is idle anew), its other slabs 0.

use super::class::GRANULE_SHIFT;
use super::page::{LARGE_FREE, Page, SMALL};
use super::pool::{List, PoolInner};
use super::purge::{HANDLED, PURGED_WHOLE, TAKEN};
use crate::arena::{SLAB, SLAB_SHIFT};
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

const R: Ordering = Ordering::Relaxed;

/// Page sizes below a slab: their pages are taken a slab at a time.
const SMALL_SIZES: usize = (SLAB_SHIFT - GRANULE_SHIFT) as usize;

/// The slabs a sweep holds: `lo..=hi` (slab indexes), empty while `lo > hi`.
struct Held {
    lo: usize,
    hi: usize,
}

impl Held {
    fn add(&mut self, first: usize, n: usize) {
        self.lo = self.lo.min(first);
        self.hi = self.hi.max(first + n - 1);
    }
}

impl PoolInner {
    /// Purge every unit idle since `cutoff` or before (see the module contract): the bytes
    /// purged, and when the first unit not yet due will be (`u64::MAX`: none), with `delay`.
    pub(super) fn sweep(&self, cutoff: u64, delay: u64) -> (usize, u64) {
        let mut held = Held {
            lo: usize::MAX,
            hi: 0,
        };
        let mut chains = [null_mut::<Page>(); SMALL_SIZES];
        for (i, chain) in chains.iter_mut().enumerate() {
            *chain = self.take_due_pages(GRANULE_SHIFT + i as u32, cutoff, &mut held);
        }
        let (big, next_due) = self.take_due_units(cutoff, delay, &mut held);
        let mut purged = 0;
        if held.lo <= held.hi {
            purged = self.purge_held(&held);
        }
        for (i, &chain) in chains.iter().enumerate() {
            self.put_back_pages(chain, GRANULE_SHIFT + i as u32);
        }
        self.put_back_units(big);
        // Slabs of small pages purged whole leave their page size: any later run may take
        // them. Found by their marks, not through the chains: making a slab spare resets (zeroes)
        // all its descriptors, the chains' links among them.
        for s in held.lo..held.hi.saturating_add(1) {
            if self.slab_mark(s) == PURGED_WHOLE {
                self.make_spare(self.slab_addr(s), SLAB);
                self.mark_slab(s, HANDLED);
            }
        }
        (purged, next_due)
    }

    fn slab_addr(&self, s: usize) -> usize {
        self.table.span().0 + (s << SLAB_SHIFT)
    }

    /// Take out of the list of pages of `1 << shift` bytes, under its lock, every page of a
    /// due slab whose pages are all there; mark those slabs `TAKEN`.
    fn take_due_pages(&self, shift: u32, cutoff: u64, held: &mut Held) -> *mut Page {
        let per_slab = 1u32 << (SLAB_SHIFT - shift);
        let chain = self.page_list(shift).take_all_if(|p| {
            let s = self.slab_of(p.start.load(R));
            let full = self
                .idle
                .small_free
                .get(s)
                .is_some_and(|n| n.load(R) == per_slab);
            let t = self.slab_mark(s);
            full && t != 0 && t < TAKEN && t <= cutoff
        });
        let mut p = chain;
        while !p.is_null() {
            // SAFETY: descriptors of the chain live in the page table.
            let page = unsafe { &*p };
            let s = self.slab_of(page.start.load(R));
            if self.slab_mark(s) != TAKEN {
                self.mark_slab(s, TAKEN);
                held.add(s, 1);
            }
            p = page.next.load(R);
        }
        chain
    }

    /// The list and length of the unit heading slab `s` (a cached large run, an empty page of
    /// a slab or more), if one does.
    fn unit_at(&self, s: usize) -> Option<(&Page, &List, usize)> {
        let head = self.desc(self.slab_addr(s));
        match head.kind.load(Ordering::Acquire) {
            LARGE_FREE => {
                let len = head.large_len.load(R);
                Some((head, self.large_list(len), len))
            }
            SMALL if u32::from(head.shift.load(R)) >= SLAB_SHIFT => {
                let shift = u32::from(head.shift.load(R));
                Some((head, self.page_list(shift), 1 << shift))
            }
            _ => None,
        }
    }

    /// Take out every due large run and empty big page still listed, marking their slabs
    /// `TAKEN`: a chain of them through `next`, and when the first one not yet due will be.
    fn take_due_units(&self, cutoff: u64, delay: u64, held: &mut Held) -> (*mut Page, u64) {
        let slabs = self.arena.span() >> SLAB_SHIFT;
        let (mut chain, mut next_due) = (null_mut::<Page>(), u64::MAX);
        for s in 0..slabs {
            let t = self.slab_mark(s);
            if t == 0 || t >= TAKEN {
                continue;
            }
            if t > cutoff {
                next_due = next_due.min(t.saturating_add(delay));
                continue;
            }
            let Some((head, list, len)) = self.unit_at(s) else {
                continue;
            };
            if list.pop_if(|p| std::ptr::eq(p, head)).is_none() {
                continue;
            }
            let n = len.div_ceil(SLAB);
            for i in s..s + n {
                self.mark_slab(i, TAKEN);
            }
            held.add(s, n);
            head.next.store(chain, R);
            chain = head as *const Page as *mut Page;
        }
        (chain, next_due)
    }

    /// Purge the held slabs in runs of adjacent ones the arena has live (a large run may hold
    /// slabs purged before); mark each held slab `PURGED_WHOLE` if it is purged now, else
    /// `HANDLED`.
    fn purge_held(&self, held: &Held) -> usize {
        let live = |s: usize| {
            self.slab_mark(s) == TAKEN && !self.arena.is_purged(self.slab_addr(s) as *const u8)
        };
        let mut purged = 0;
        let mut s = held.lo;
        while s <= held.hi {
            if !live(s) {
                s += 1;
                continue;
            }
            let mut e = s + 1;
            while e <= held.hi && live(e) {
                e += 1;
            }
            // SAFETY: the held units are out of every free list and nothing in them is
            // handed out.
            let at = self.slab_addr(s) as *mut u8;
            purged += unsafe { self.arena.purge(at, (e - s) << SLAB_SHIFT) }.unwrap_or(0);
            s = e;
        }
        for s in held.lo..=held.hi {
            if self.slab_mark(s) == TAKEN {
                let gone = self.arena.is_purged(self.slab_addr(s) as *const u8);
                self.mark_slab(s, if gone { PURGED_WHOLE } else { HANDLED });
            }
        }
        purged
    }

    /// List again the pages of `chain` (of `1 << shift` bytes) whose slab was not purged.
    fn put_back_pages(&self, chain: *mut Page, shift: u32) {
        let mut p = chain;
        while !p.is_null() {
            // SAFETY: descriptors of the chain live in the page table.
            let page = unsafe { &*p };
            let next = page.next.load(R);
            if self.slab_mark(self.slab_of(page.start.load(R))) != PURGED_WHOLE {
                self.page_list(shift).push(page);
            }
            p = next;
        }
    }

    /// Make spare the units of `chain` purged whole; list the others again. Their first slab
    /// ends `HANDLED`, the others 0.
    fn put_back_units(&self, chain: *mut Page) {
        let mut p = chain;
        while !p.is_null() {
            // SAFETY: descriptors of the chain live in the page table.
            let head = unsafe { &*p };
            let next = head.next.load(R);
            let start = head.start.load(R);
            let large = head.kind.load(R) == LARGE_FREE;
            let len = if large {
                head.large_len.load(R)
            } else {
                1 << head.shift.load(R)
            };
            let s = self.slab_of(start);
            let n = len.div_ceil(SLAB);
            let whole = (s..s + n).all(|i| self.slab_mark(i) == PURGED_WHOLE);
            for i in s..s + n {
                self.mark_slab(i, if i == s { HANDLED } else { 0 });
            }
            if whole {
                if large {
                    self.large_cached.fetch_sub(len, R);
                }
                // Purged whole: any later run may take its slabs (`spare.rs`).
                self.make_spare(start, len);
            } else if large {
                self.large_list(len).push(head);
            } else {
                self.page_list(u32::from(head.shift.load(R))).push(head);
            }
            p = next;
        }
    }
}
