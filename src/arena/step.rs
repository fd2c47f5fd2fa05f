//! Pinned memory registered in steps: a slab the pool cuts into pages of at most a step is
//! pinned where pages are in use, not whole.
//!
//! Contract:
//! - only in a pinned arena, on 4 KiB pages (sparse chunks: pinning part of a transparent huge
//!   page would pin all of it), without rails, on a device of at least 4,096 regions, one
//!   slab at a time, and while fewer than `step_slabs` slabs are stepped *on the device*, by
//!   every arena of the process together (`table/budget.rs`): a quarter of the device's
//!   `max_mr` over [`STEPS`] (the soft NIC's 16,384 regions give 512 slabs, 1 GiB; rxe's
//!   524,287 give 16,383 slabs, 32 GiB; past it, slabs are registered whole as before). So
//!   step regions never outnumber a quarter of `max_mr` (grants keep another quarter),
//!   whatever the number of pools, by construction. Such a slab is *stepped*: no region covers it whole; each
//!   [`STEP`]-byte step of it is registered as a region of its own when the pool first hands
//!   out a page in it ([`Arena::ready_steps`]), and taken out before its memory is dropped
//!   ([`Arena::drop_step`]: every page in it is free), or when the slab is purged whole or
//!   reused for something else ([`Arena::unstep`]);
//! - pages of a stepped slab are powers of two of at most a step, aligned to their size, so
//!   no page — and no block, window or grant inside one — crosses a step: every buffer the
//!   pool hands out lies in one region, and `keys_of` stays O(1) and lock-free (one more load,
//!   `table.rs`);
//! - a step is registered or deregistered by the one thread holding it busy (`table.rs`):
//!   concurrent first pages of one step register it once; a step some window is bound to
//!   (`EBUSY`, rxe `EINVAL`) refuses to go and stays registered, its memory kept;
//! - a refused step registration degrades as any pinned registration does (`register.rs`):
//!   the pages are served unregistered (the degradation counted and recorded) under
//!   `Degrade`, an error under `Required`.
//!
//! Invariant: a page the pool hands out of a stepped slab lies in a registered step (or was
//! served unregistered, counted); a step no live page lies in may be registered or not;
//! `step_regions == |steps pointing at a region|`.

use super::purge::LIVE;
use super::stats::{add, sub};
use super::table::{STEP, STEP_SHIFT, STEPS, StepState};
use super::{Arena, Backing, Error, Hugepages, RegMode, SLAB, SLAB_SHIFT};
use crate::sys::os;
use crate::sys::provision::{self, Provisioning};
use std::sync::atomic::Ordering;

impl Arena {
    /// Whether a run of small pages (a sparse run) is registered in steps here now.
    pub(crate) fn steps_wanted(&self) -> bool {
        self.mode == RegMode::Pinned
            && self.pages.policy != Hugepages::Require
            && !self.device_dead()
            && !self.rails.any()
            && self.table.step_room()
    }

    /// The backing for a run cut into pages of `1 << shift` bytes: sparse in an ODP arena,
    /// and for pages of at most a step, which a pinned arena registers in steps (while it
    /// does: [`Arena::backing_for`]).
    pub(crate) fn page_backing(&self, shift: u32) -> Backing {
        if self.pages.lazy || shift <= STEP_SHIFT {
            Backing::Sparse
        } else {
            Backing::Dense
        }
    }

    /// Whether sparse and dense chunks are mapped alike here (4 KiB pages both: no huge
    /// pages): a purged slab of either then serves a run of the other as well.
    pub(crate) fn backings_alike(&self) -> bool {
        self.pages.policy == Hugepages::Off
    }

    /// Whether any slab may be registered in steps here (a pinned arena).
    pub(crate) fn has_steps(&self) -> bool {
        self.table.steps_allowed()
    }

    /// Whether the pool handed out pages of the step holding `addr` of a stepped slab since
    /// it was last given back: the step is registered, or was served unregistered.
    pub(crate) fn step_used(&self, addr: usize) -> bool {
        addr.checked_sub(self.base())
            .is_some_and(|o| self.table.step_used(o >> STEP_SHIFT))
    }

    /// Whether the slab holding `addr` is registered in steps.
    pub(crate) fn is_stepped(&self, addr: usize) -> bool {
        addr.checked_sub(self.base())
            .is_some_and(|o| self.table.is_stepped(o >> SLAB_SHIFT))
    }

    /// Make the pages `[addr, addr + len)` of a stepped slab usable by the NIC: register the
    /// steps they lie in that are not registered (waiting for a thread registering one of
    /// them). A no-op, one load, where the slab is not stepped or its steps are registered.
    ///
    /// # Errors
    /// A refused registration under [`RegistrationPolicy::Required`](super::RegistrationPolicy)
    /// (under `Degrade` the step is served unregistered and counted).
    #[inline]
    pub(crate) fn ready_steps(&self, addr: usize, len: usize) -> Result<(), Error> {
        if !self.is_stepped(addr) {
            return Ok(());
        }
        let first = (addr - self.base()) >> STEP_SHIFT;
        let last = (addr + len.max(1) - 1 - self.base()) >> STEP_SHIFT;
        if (first..=last).all(|j| self.table.step_reg(j).is_some()) {
            return Ok(());
        }
        self.ready_steps_cold(first, last)
    }

    #[cold]
    fn ready_steps_cold(&self, first: usize, last: usize) -> Result<(), Error> {
        // A NIC call: an allocation it makes is served elsewhere, not by a page of this step
        // (which would wait for this thread).
        if provision::active() {
            return Err(Error::Reentrant);
        }
        let _mark = Provisioning::enter();
        for j in first..=last {
            let mut spins = 0u32;
            loop {
                match self.table.claim_unregistered(j) {
                    None => backoff(&mut spins),
                    Some(None) => break,
                    Some(Some(was_unregistered)) => {
                        let r = self.register_step(j);
                        let unregistered = matches!(r, Ok(None));
                        self.count_unregistered(was_unregistered, unregistered);
                        let id = r.as_ref().ok().copied().flatten();
                        self.table.end_step(j, StepState::after(id, unregistered));
                        r?;
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// A step goes from served unregistered (or not) to served unregistered (or not): its
    /// bytes are counted unregistered while it is, and each step that becomes so is counted
    /// in `unregistered_runs` (once, not at every page that retries its registration).
    fn count_unregistered(&self, was: bool, now: bool) {
        if was && !now {
            sub(&self.counters.unregistered_bytes, STEP as u64);
        } else if now && !was {
            add(&self.counters.unregistered_bytes, STEP as u64);
            add(&self.counters.unregistered_runs, 1);
        }
    }

    /// Register step `j` (held busy) pinned: `Ok(None)` where it was refused and is served
    /// unregistered (the caller counts it).
    fn register_step(&self, j: usize) -> Result<Option<u32>, Error> {
        if self.device_dead() {
            return self.dead_device().map(|()| None);
        }
        let addr = self.base() + (j << STEP_SHIFT);
        let registered = self
            .reg_mr(addr, STEP, false)
            .and_then(|mr| self.install_region(mr, false));
        match registered {
            Ok(id) => {
                add(&self.counters.step_regions, 1);
                add(&self.counters.registered_bytes, STEP as u64);
                Ok(Some(id))
            }
            Err(e) => {
                // The chunk's ODP region where ODP can carry the traffic, as for a run
                // (`register.rs`).
                let c = self.chunk_of(addr as *const u8).unwrap_or(0);
                if self.odp_usable {
                    if let Ok(id) = self.odp_region(c) {
                        self.record(super::register::Degradation {
                            cause: super::register::cause_of(&e),
                            odp_fallback: true,
                        });
                        add(&self.counters.odp_fallbacks, 1);
                        add(&self.counters.registered_bytes, STEP as u64);
                        return Ok(Some(id));
                    }
                }
                self.note_refusal(&e);
                if self.policy == super::RegistrationPolicy::Required {
                    return Err(e);
                }
                tracing::warn!(
                    target: "rdma_pool::arena",
                    error = %e,
                    "step registration refused: serving its pages unregistered"
                );
                Ok(None)
            }
        }
    }

    /// Take step `j` out of its region (held busy by the caller, in state `st`); false
    /// (registered still) where the NIC refused. Counts a step that was served unregistered
    /// as such no more.
    fn deregister_step(&self, st: StepState) -> bool {
        let id = match st {
            StepState::Free => return true,
            StepState::Unregistered => {
                self.count_unregistered(true, false);
                return true;
            }
            StepState::Registered(id) => id,
        };
        if self.table.reg(id).is_odp() {
            // The chunk's ODP region stands in for the step: it stays, for the chunk.
            sub(&self.counters.registered_bytes, STEP as u64);
            return true;
        }
        if self.release_region(id, false).is_some() {
            return false;
        }
        sub(&self.counters.step_regions, 1);
        sub(&self.counters.registered_bytes, STEP as u64);
        true
    }

    /// Give back the memory of the step holding `addr` of a live stepped slab, every page of
    /// which is free and held by the caller (no thread can hand one out meanwhile): its region
    /// is taken out first, then its pages dropped (they read as zero at the next use, which
    /// registers the step again: [`Arena::ready_steps`]). False where nothing was done: the
    /// slab is not stepped or not live, a rail is attached, or the NIC kept the region.
    pub(crate) fn drop_step(&self, addr: usize) -> bool {
        if !self.is_stepped(addr) || !self.may_drop_in(addr) || provision::active() {
            return false;
        }
        let _mark = Provisioning::enter();
        let j = (addr - self.base()) >> STEP_SHIFT;
        let at = self.base() + (j << STEP_SHIFT);
        self.rails.without_rails(|| {
            let Some(st) = self.take_step(j) else {
                return false;
            };
            if !self.deregister_step(st) {
                self.table.end_step(j, st);
                add(&self.counters.purges_refused, 1);
                return false;
            }
            self.table.end_step(j, StepState::Free);
            // SAFETY: the caller's free pages of a live slab; no region covers them now, and
            // no rail pins them (`without_rails`).
            unsafe { os::madvise(at as *mut u8, STEP, libc::MADV_DONTNEED).is_ok() }
        })
    }

    /// Step `j` held busy: `Some(its state)`, waiting out another thread holding it.
    fn take_step(&self, j: usize) -> Option<StepState> {
        let mut spins = 0u32;
        loop {
            if let Some(id) = self.table.begin_step(j) {
                return Some(id);
            }
            backoff(&mut spins);
        }
    }

    fn may_drop_in(&self, addr: usize) -> bool {
        self.slabs
            .get((addr - self.base()) >> SLAB_SHIFT)
            .is_some_and(|s| s.state.load(Ordering::Acquire) == LIVE)
    }

    /// Take every step of stepped slab `i`, which holds nothing live, out of its region (for
    /// a purge of the slab, or its reuse as something else). False where the NIC kept a step:
    /// the slab stays stepped, the steps taken out so far registered again at their next use.
    pub(crate) fn unstep(&self, i: usize) -> bool {
        let mut all = true;
        for j in i * STEPS..(i + 1) * STEPS {
            let Some(st) = self.take_step(j) else {
                continue;
            };
            if self.deregister_step(st) {
                self.table.end_step(j, StepState::Free);
            } else {
                self.table.end_step(j, st);
                all = false;
            }
        }
        all
    }

    /// Purge stepped slab `i` (claimed `BUSY` by [`Arena::purge`]): its steps' regions first,
    /// as a pinned region's, then its pages. The bytes purged: 0 where a region was kept (the
    /// slab stays live, counted refused).
    pub(super) fn purge_stepped(&self, i: usize) -> usize {
        let out = self.rails_unregister(i, i + 1)
            && (self.unstep(i) || {
                self.rails_recover(i, i + 1);
                false
            });
        if !out {
            add(&self.counters.purges_refused, 1);
            self.set_state(i, 1, LIVE);
            return 0;
        }
        // Not stepped while purged: the next use chooses (`revive_as`), and a purged slab
        // holds no place among the arena's stepped slabs.
        self.table.publish(i, 1, None);
        self.drop_pages(i, 1, false, false);
        SLAB
    }

    /// Make live slabs `[addr, addr + len)`, which hold nothing live, one region's if stepped
    /// (for a run that is not cut into pages of at most a step): their steps are taken out and
    /// the run registered whole, then published over them; on error they stay stepped, valid.
    ///
    /// # Errors
    /// [`Error::Busy`] where a window keeps a step, or the run mixes stepped slabs with slabs
    /// registered apart (nothing changes then); [`Error::Reentrant`] from inside the arena's
    /// own provisioning; a refused registration as [`Arena::alloc_run`]'s.
    pub(crate) fn make_whole(&self, addr: usize, len: usize) -> Result<(), Error> {
        let first = self.slab_index(addr);
        let n = len.div_ceil(SLAB);
        let stepped = (first..first + n)
            .filter(|&i| self.table.is_stepped(i))
            .count();
        if stepped == 0 {
            return Ok(());
        }
        if stepped < n {
            return Err(Error::Busy(
                "a run over stepped slabs and slabs registered apart",
            ));
        }
        if provision::active() {
            return Err(Error::Reentrant);
        }
        let _mark = Provisioning::enter();
        if !(first..first + n).all(|i| self.unstep(i)) {
            return Err(Error::Busy("a window is bound to a step of the run"));
        }
        let c = self.chunk_of(addr as *const u8).unwrap_or(0);
        let spans = self.chunk_of((addr + len - 1) as *const u8) != Some(c);
        self.pages.populate_ordinary(addr as *mut u8, n * SLAB)?;
        // Published over the slabs (no longer stepped) once registered. Served unregistered
        // (`Degrade`: counted whole), they are stepped no more either (no step registered):
        // an unregistered run like any other, whose bytes its purge takes off the count;
        // left stepped, its pages larger than a step would register steps under blocks that
        // cross them, and a sibling page's `make_whole` take them out under live memory.
        let id = self.register_run(c, addr, n * SLAB, spans, || {
            self.register_new(addr, n * SLAB, false)
        })?;
        if id.is_none() {
            self.table.publish(first, n, None);
        }
        Ok(())
    }

    /// Mark the one slab `[first, first + n)`, which no region covers, stepped; false (nothing
    /// done) for a run of several slabs, or where the arena has its most stepped slabs.
    pub(crate) fn set_stepped(&self, first: usize, n: usize) -> bool {
        n == 1 && self.table.set_stepped(first)
    }
}

/// Wait for a thread holding a step (a NIC call: microseconds to milliseconds): a few yields,
/// then short sleeps, so hundreds of waiting threads do not take the cores from it.
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 16 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}
