//! The pool's side of pinned steps (`arena/step.rs`): a slab of pages of at most a step in a
//! pinned arena is registered a step at a time, as its pages are handed out, and a step whose
//! pages are all free gives its memory back — region first — while its slab stays in use.
//!
//! Contract:
//! - every page handed out of a stepped slab lies in a registered step, or in one served
//!   unregistered (a refused registration under `Degrade`, counted): `take_page` readies
//!   the page's step ([`Arena::ready_steps`](crate::arena::Arena)) before it hands the page
//!   to a heap, and puts the page back when that fails;
//! - [`PoolInner::drop_free_steps`] (each purge pass) takes the listed pages of stepped slabs
//!   out of their free list under its lock (out of their slab's count too, so no purge or
//!   steal finds the slab wholly listed meanwhile), lists again at once those of steps it does
//!   not hold whole, drops each step all of whose pages it holds, marks those pages `fresh`
//!   (zero), and lists them again: so no thread can take a page of a step while its region
//!   goes, and the next taker registers it again. A step goes only on request (`purge()`)
//!   or once it has stayed free for the purge delay: `step_free_since` is stamped by every
//!   heap that gives a page of the step back (just before the page is listed; the pass is
//!   asked for just after, so a pass that took the list before the push cannot have reset
//!   the request), cleared when a page of it is handed out, and stamped by a pass that finds
//!   the step free with no stamp (a defensive case: a handed-out page comes back only
//!   through a give-back, which stamps). A step wholly free at a pass has been free since
//!   about its stamp — the give-back of its last page; earlier only by a give-back's stall
//!   between its stamp and its push, or a failed take's putting a page back — so it goes one
//!   delay after its last page came back, not one delay after a pass first noticed it (two
//!   delays and more: the memory a program freed came back late, in pinned mode above all).
//!   A drop a little early is safe (the pass holds every page of the step); a step freed and
//!   used again within the delay is not deregistered and registered again each time;
//! - the pass counts the pages it holds per step (`Idle::step_taken`, its own: one pass at a
//!   time, under the purge lock; nothing else reads it), which is how it tells that it holds
//!   every page of a step; the counts are 0 again when it returns.
//!
//! Invariant: between passes `step_taken` is all 0; a page no thread owns and no list holds
//! is one the pass holds, and it is listed again before the pass returns.

use super::page::Page;
use super::pool::PoolInner;
use crate::arena::{SLAB_SHIFT, STEP, STEP_SHIFT};
use std::sync::atomic::Ordering;

const R: Ordering = Ordering::Relaxed;

impl PoolInner {
    /// `page`, taken to be handed out, with its step registered (`None`: it could not be;
    /// the page is listed again and the failure counted).
    pub(super) fn ready<'a>(&self, page: &'a Page) -> Option<&'a Page> {
        let bytes = 1usize << page.shift.load(R);
        match self.arena.ready_steps(page.start.load(R), bytes) {
            Ok(()) => {
                if self.arena.is_stepped(page.start.load(R)) {
                    self.step_used(page.start.load(R));
                }
                Some(page)
            }
            Err(e) => {
                self.count_failure(&e);
                self.list_page(page);
                None
            }
        }
    }

    /// Whether the wholly free step at `start` goes back now: on request (`all`), or once
    /// it has stayed free for the purge delay since its stamp (the give-back of its last page:
    /// module contract). A free step without a stamp is stamped now, and a purge made due
    /// after the delay.
    fn step_due(&self, start: usize, all: bool, now: u64) -> bool {
        let Some(since) = self
            .idle
            .step_free_since
            .get((start - self.base) >> STEP_SHIFT)
        else {
            return all;
        };
        if all {
            return true;
        }
        let Some(delay) = self.idle.delay else {
            return false;
        };
        let t = since.load(R);
        if t == 0 {
            since.store(now, R);
            self.idle.due_after(now);
            return false;
        }
        if now.saturating_sub(t) >= delay {
            return true;
        }
        // Each pass recomputes when the next is due: this step's time counts again.
        self.idle.due_after(t);
        false
    }

    /// A heap gives back an empty page of a stepped slab (called just before the page is
    /// listed): its step is stamped now — if the page makes the step wholly free, it is free
    /// from about now (module contract). The time returned is for [`Self::listed_in_step`]
    /// once the page is listed; `None` for a page of no stepped slab.
    pub(super) fn stamp_step(&self, page: &Page) -> Option<u64> {
        let start = page.start.load(R);
        if !self.arena.has_steps() || !self.arena.is_stepped(start) {
            return None;
        }
        let now = super::purge::now_ns();
        if let Some(since) = self
            .idle
            .step_free_since
            .get((start - self.base) >> STEP_SHIFT)
        {
            since.store(now.max(1), R);
        }
        Some(now)
    }

    /// A heap gave back an empty page of a stepped slab, stamped at `stamp` and listed since:
    /// a pass is made due a delay after the stamp, so that a step freed while its slab stays
    /// in use goes back also in an idle program (not for pages a pass lists again itself: with
    /// no delay it would never stop). Asked after the push, so that a pass that resets the
    /// due time either finds the page listed or keeps this request (Dekker, as for the slabs'
    /// idle stamps).
    pub(super) fn listed_in_step(&self, stamp: u64) {
        self.idle.due_after(stamp);
    }

    /// The step holding `addr` is in use (again): its stamp is cleared.
    fn step_used(&self, addr: usize) {
        if let Some(since) = self
            .idle
            .step_free_since
            .get((addr - self.base) >> STEP_SHIFT)
        {
            if since.load(R) != 0 {
                since.store(0, R);
            }
        }
    }

    /// Give back the memory of every step of a stepped slab of `1 << shift`-byte pages all of
    /// whose pages are free (see the module contract).
    pub(super) fn drop_free_steps(&self, shift: u32, all: bool, now: u64) {
        if cfg!(feature = "memcheck") || shift > STEP_SHIFT || !self.arena.has_steps() {
            return;
        }
        let per_slab = 1u32 << (SLAB_SHIFT - shift);
        let per_step = 1usize << (STEP_SHIFT - shift);
        let chain = self.page_list(shift).take_all_then(
            |p| {
                // Pages of used steps only (registered, or served unregistered): a step no
                // page was handed out of has no region and no memory to give back.
                let whole = self.small_free(p).is_some_and(|n| n.load(R) == per_slab);
                let start = p.start.load(R);
                !whole && self.arena.is_stepped(start) && self.arena.step_used(start)
            },
            |p| {
                if let Some(n) = self.small_free(p) {
                    n.fetch_sub(1, R);
                }
                self.step_taken(p.start.load(R), 1);
            },
        );
        let whole = per_step as u32;
        // Pages of steps not wholly held go back at once (before any NIC call: threads may
        // want them meanwhile); the others are kept on a chain of their own.
        let mut kept: *mut Page = std::ptr::null_mut();
        let mut p = chain;
        while !p.is_null() {
            // SAFETY: descriptors of the chain live in the page table.
            let page = unsafe { &*p };
            let next = page.next.load(R);
            let start = page.start.load(R);
            if self.taken_in(start) == whole {
                page.next.store(kept, R);
                kept = p;
            } else {
                self.clear_taken(start);
                self.list_page(page);
            }
            p = next;
        }
        let mut p = kept;
        while !p.is_null() {
            // SAFETY: as above.
            let page = unsafe { &*p };
            let start = page.start.load(R);
            if start % STEP == 0 && self.step_due(start, all, now) && self.arena.drop_step(start) {
                (0..per_step).for_each(|k| self.desc(start + (k << shift)).fresh.store(true, R));
                self.idle.discarded.fetch_add(STEP as u64, R);
                self.step_used(start);
            }
            p = page.next.load(R);
        }
        let mut p = kept;
        while !p.is_null() {
            // SAFETY: as above.
            let page: &Page = unsafe { &*p };
            let next = page.next.load(R);
            self.clear_taken(page.start.load(R));
            self.list_page(page);
            p = next;
        }
    }

    /// The pass holds `n` more pages of the step holding `addr`.
    fn step_taken(&self, addr: usize, n: u32) {
        if let Some(c) = self.idle.step_taken.get((addr - self.base) >> STEP_SHIFT) {
            c.fetch_add(n, R);
        }
    }

    /// Pages of the step holding `addr` the pass holds.
    fn taken_in(&self, addr: usize) -> u32 {
        self.idle
            .step_taken
            .get((addr - self.base) >> STEP_SHIFT)
            .map_or(0, |c| c.load(R))
    }

    /// The pass holds no page of the step holding `addr` any more.
    fn clear_taken(&self, addr: usize) {
        if let Some(c) = self.idle.step_taken.get((addr - self.base) >> STEP_SHIFT) {
            c.store(0, R);
        }
    }
}
