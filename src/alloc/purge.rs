//! The purge policy: which freed slabs go back to the system, and when.
//!
//! Contract:
//! - a slab is *idle* when nothing in it is handed out: a freed large run (its first slab
//!   stands for it), an empty page of 2 MiB or more, or a slab of smaller pages that are all
//!   empty. `idle[slab]` holds the (coarse, monotonic) time it became idle, 0
//!   while it is in use, [`HANDLED`] once a purge dealt with it;
//! - a slab idle for at least ¾ of the pool's purge delay (the rest is the purge's own time:
//!   the memory is back when the delay has passed; [`START_LEAD`]) is purged by the purge
//!   clock (`purger.rs`) or the next slow-path call of
//!   [`PoolInner::maybe_purge`] (one load and a compare when nothing is due), or at once by
//!   `Core::purge`: it is taken out of its free list (so no thread can reuse it meanwhile),
//!   handed to [`Arena::purge`](crate::arena::Arena::purge) together with the adjacent due
//!   slabs (`sweep.rs`: a pinned region over all of them goes whole) — which removes pinned
//!   registrations before dropping pages and refuses what it must — and put back; reuse
//!   revives it (`Arena::revive`) before any block of it is handed out;
//! - a purge first collects the heaps no thread owns (their threads exited), so that pages
//!   emptied by frees from other threads since then can go idle;
//! - every purge pass also gives back the memory of empty pages listed inside slabs still in
//!   use, where nothing pins it (an ODP arena without rails, slabs of 4 KiB pages:
//!   `Arena::discard_free`): the page stays listed, marked `fresh` (zero), and is given back
//!   once per use. So a few live blocks keep their own pages, not a slab of pages freed around
//!   them; a pinned pool keeps such pages (its regions pin whole slabs);
//! - `small_free[slab]` counts the empty pages of a small-page slab that sit in the free list;
//!   it changes only under that list's lock, so a purge that finds it full under the lock and
//!   takes the slab's pages out of the list holds every page of the slab.
//!
//! Invariant: `small_free[s] <= SLAB >> shift` for a slab of pages of `1 << shift` bytes, with
//! equality iff all its pages are in the free list.

use super::class::GRANULE_SHIFT;
use super::heap::Heap;
use super::pool::PoolInner;
use crate::arena::{SLAB, SLAB_SHIFT, STEPS};
use crate::sys::atfork::ForkLock;
use crate::sys::os::MmapArray;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const R: Ordering = Ordering::Relaxed;

/// The owner token of a heap the purge holds (no thread's token: those are addresses).
const PURGER: u64 = u64::MAX;

/// `idle[slab]` of a slab a purge dealt with (purged, or refused by the arena).
pub(crate) const HANDLED: u64 = u64::MAX;

/// `idle[slab]` of a slab of small pages purged whole, for the moment before it is made spare.
pub(super) const PURGED_WHOLE: u64 = u64::MAX - 1;

/// `idle[slab]` of a slab in a unit a purge pass holds (`sweep.rs`).
pub(super) const TAKEN: u64 = u64::MAX - 2;

/// Now, in nanoseconds of `CLOCK_MONOTONIC_COARSE` (a vDSO read), never 0.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
        .max(1)
}

/// The purge state of a pool (see the module contract).
pub(crate) struct Idle {
    pub(super) idle: MmapArray<AtomicU64>,
    pub(crate) small_free: MmapArray<AtomicU32>,
    /// Per step of a stepped slab: pages of it a drop pass holds (`stepped.rs`; 0 between
    /// passes).
    pub(crate) step_taken: MmapArray<AtomicU32>,
    /// Per step of a stepped slab: when a heap last gave a page of it back, or when a pass
    /// found it wholly free with no such time; 0 once a page of it is handed out or it was
    /// dropped (`stepped.rs`).
    pub(crate) step_free_since: MmapArray<AtomicU64>,
    /// Earliest time a purge may be due (`u64::MAX`: nothing idle).
    next_due: AtomicU64,
    /// Nanoseconds a slab stays idle before its purge starts — the configured delay less its
    /// [`START_LEAD`]th, so that the purge has ended when the delay has passed — `None`: only on request.
    pub(super) delay: Option<u64>,
    pub(super) lock: ForkLock<()>,
    pub(crate) passes: AtomicU64,
    /// Due purges run on the process's purge clock (`purger.rs`).
    clock: bool,
    /// The purge clock's passes in this pool: `generation << 32 | count` (`purger.rs`).
    clock_users: AtomicU64,
    /// Passes that found heaps of exited threads still holding pages since a thread last
    /// exited: the next look waits `delay << min(rounds, COLLECT_BACKOFF)`.
    collect_rounds: AtomicU32,
    /// Bytes of free pages inside slabs in use given back (`discard_free_pages`; a swept
    /// heap's medium pages and blocks: `heap/trim.rs`).
    pub(crate) discarded: AtomicU64,
    /// Bytes of emptied thread caches of heaps no thread owns given back (`heap/unowned.rs`).
    pub(crate) heap_discarded: AtomicU64,
    /// Trims asked of live threads' heaps (`request_trims`), and trims their owners ran.
    pub(crate) trims_requested: AtomicU64,
    pub(crate) trims: AtomicU64,
}

/// A purge starts when memory has been idle for the delay less `1 / START_LEAD` of it: the
/// delay is when the memory is back, and giving back a GiB takes ~0.1–0.2 s of `madvise` and
/// NIC invalidations on a small VM (the `phases` workload's memory, read 1.1 s after a 1 s
/// delay, was still half there when the purge started at 1 s).
const START_LEAD: u64 = 4;

/// The most a look for pages of exited threads is put off: `max(delay, COLLECT_FLOOR) << 6`.
const COLLECT_BACKOFF: u32 = 6;

/// The shortest wait between two looks for pages of exited threads (a purge delay of 0 must
/// not make the clock walk every heap without pause while such a heap holds a live block).
const COLLECT_FLOOR: u64 = 250_000_000;

impl Idle {
    pub(crate) fn new(
        slabs: usize,
        delay: Option<std::time::Duration>,
        clock: bool,
    ) -> Result<Idle, i32> {
        // SAFETY: zero is "in use" / "no free page" for both arrays.
        let (idle, small_free) = unsafe { (MmapArray::zeroed(slabs)?, MmapArray::zeroed(slabs)?) };
        // SAFETY: zero is "no page held" / "not seen free"; no pointers (not scanned by the
        // leak checker).
        let (step_taken, step_free_since) = unsafe {
            (
                MmapArray::zeroed_unscanned(slabs * STEPS)?,
                MmapArray::zeroed_unscanned(slabs * STEPS)?,
            )
        };
        Ok(Idle {
            idle,
            small_free,
            step_taken,
            step_free_since,
            next_due: AtomicU64::new(u64::MAX),
            delay: delay.map(|d| {
                let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
                d - d / START_LEAD
            }),
            lock: ForkLock::new(()),
            passes: AtomicU64::new(0),
            clock,
            clock_users: AtomicU64::new(0),
            collect_rounds: AtomicU32::new(0),
            discarded: AtomicU64::new(0),
            heap_discarded: AtomicU64::new(0),
            trims_requested: AtomicU64::new(0),
            trims: AtomicU64::new(0),
        })
    }

    /// Whether the purge clock runs this pool's due purges.
    pub(crate) fn on_clock(&self) -> bool {
        self.clock && self.delay.is_some()
    }

    /// When the next purge is due (`u64::MAX`: nothing pending).
    pub(crate) fn due(&self) -> u64 {
        self.next_due.load(Ordering::SeqCst)
    }

    /// A purge is due at `due` at the latest (the clock is woken for it).
    fn due_by(&self, due: u64) {
        self.next_due.fetch_min(due, Ordering::SeqCst);
        if self.clock {
            super::purger::nudge(due);
        }
    }

    /// The purge clock of fork generation `gen` starts a pass in this pool.
    pub(crate) fn clock_enter(&self, generation: u64) {
        let g = (generation & 0xffff_ffff) << 32;
        let _ = self.clock_users.fetch_update(Ordering::AcqRel, R, |v| {
            Some(if v & !0xffff_ffff == g { v + 1 } else { g | 1 })
        });
    }

    /// The purge clock's pass in this pool is over.
    pub(crate) fn clock_leave(&self) {
        self.clock_users.fetch_sub(1, Ordering::Release);
    }

    /// Wait until no pass of this process's purge clock is in this pool (a count left by a
    /// parent's thread, in a child of `fork`, is not waited for).
    pub(crate) fn wait_for_clock(&self) {
        let g = crate::sys::atfork::generation() & 0xffff_ffff;
        loop {
            let v = self.clock_users.load(Ordering::Acquire);
            if v >> 32 != g || v & 0xffff_ffff == 0 {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// A thread left heaps in the pool: look for their pages a quarter of the delay later (the
    /// pages emptied by then go idle then, and back one delay after), and again, less often,
    /// while they hold some.
    pub(crate) fn thread_left(&self) {
        if let Some(d) = self.delay {
            self.collect_rounds.store(0, R);
            self.due_by(now_ns().saturating_add(d / 4));
        }
    }

    /// Slab `s` became idle now.
    pub(crate) fn mark_idle(&self, s: usize) {
        let now = self.stamp_idle(s);
        self.due_after(now);
    }

    /// The stamp half of [`Idle::mark_idle`]: slab `s` idle from now (returned).
    pub(crate) fn stamp_idle(&self, s: usize) -> u64 {
        let now = now_ns();
        // SeqCst with the purge's reset of `next_due` and its read of the stamps (Dekker): the
        // purge either sees this stamp or keeps the due time stored after it.
        if let Some(slot) = self.idle.get(s) {
            slot.store(now, Ordering::SeqCst);
        }
        now
    }

    /// The due half of [`Idle::mark_idle`]: a purge is due one delay after `stamp`.
    pub(crate) fn due_after(&self, stamp: u64) {
        if let Some(d) = self.delay {
            self.due_by(stamp.saturating_add(d));
        }
    }

    /// Slab `s` is in use again.
    pub(crate) fn mark_used(&self, s: usize) {
        if let Some(slot) = self.idle.get(s) {
            if slot.load(R) != 0 {
                slot.store(0, R);
            }
        }
    }
}

impl PoolInner {
    pub(super) fn slab_of(&self, addr: usize) -> usize {
        (addr - self.table.span().0) >> SLAB_SHIFT
    }

    /// A freed large run or an empty slab-sized page at `start` is idle.
    pub(crate) fn idle_from(&self, start: usize) {
        self.idle.mark_idle(self.slab_of(start));
    }

    /// The unit at `start` is reused: not idle, and committed again if it was purged; as
    /// pages of at most a step (`stepped`: its slab may stay, or become, registered in steps)
    /// or as anything else (one region then covers it).
    ///
    /// # Errors
    /// As [`Arena::revive`](crate::arena::Arena::revive); a window keeping a step of a slab
    /// that must become one region.
    pub(crate) fn reuse(
        &self,
        start: usize,
        len: usize,
        stepped: bool,
    ) -> Result<(), crate::arena::Error> {
        let slab = start & !(SLAB - 1);
        let slabs = (start + len).next_multiple_of(SLAB) - slab;
        self.idle.mark_used(self.slab_of(slab));
        self.arena.revive_as(slab as *mut u8, slabs, stepped)?;
        if stepped {
            return Ok(());
        }
        // Not pages of at most a step: one region must cover it (`arena/step.rs`).
        self.arena.make_whole(slab, slabs)
    }

    /// Purge what has been idle for the delay, if anything is due (slow paths only; never
    /// under a pool lock).
    pub(crate) fn maybe_purge(&self) {
        if self.idle.delay.is_none() {
            return;
        }
        let due = self.idle.next_due.load(R);
        if due == u64::MAX {
            return;
        }
        // With the clock running, the due purge is its work, not this thread's.
        if self.idle.clock && super::purger::ensure() {
            return;
        }
        if now_ns() < due {
            return;
        }
        self.purge_idle(false);
    }

    /// Purge every idle slab (`all`) or those idle for the delay; the bytes returned.
    pub(crate) fn purge_idle(&self, all: bool) -> usize {
        // A fork waits until the purge put back what it took out of the free lists.
        let _inside = crate::sys::atfork::inside();
        if crate::sys::provision::active() {
            return 0; // a free made by the NIC layer while the arena calls it: later
        }
        let Some(_one) = self.idle.lock.try_lock() else {
            return 0;
        };
        let now = now_ns();
        let delay = self.idle.delay.unwrap_or(0);
        let cutoff = if all {
            u64::MAX - 1
        } else {
            now.saturating_sub(delay)
        };
        self.idle.next_due.store(u64::MAX, Ordering::SeqCst);
        let mut next_due_collect = u64::MAX;
        self.idle.passes.fetch_add(1, R);
        if self.collect_abandoned() && self.idle.delay.is_some() {
            // Heaps of exited threads still hold pages that other threads' frees may empty.
            let rounds = self
                .idle
                .collect_rounds
                .fetch_add(1, R)
                .min(COLLECT_BACKOFF);
            next_due_collect =
                now.saturating_add(delay.max(COLLECT_FLOOR).saturating_mul(1 << rounds));
        }
        let mut purged = 0;
        let mut next_due = next_due_collect;
        if !all && self.idle.delay.is_some() && self.request_trims(None, now) {
            // A thread freed since the last look: look again, to find it quiet or not. An
            // idle program stops the looks after one round.
            next_due = next_due.min(now.saturating_add(delay.max(COLLECT_FLOOR)));
        }
        // Due units first, adjacent ones purged together (`sweep.rs`); then, per page size,
        // the free pages and steps of slabs still in use.
        let (swept, due) = self.sweep(cutoff, delay);
        purged += swept;
        next_due = next_due.min(due);
        for shift in GRANULE_SHIFT..SLAB_SHIFT {
            self.discard_free_pages(shift);
            self.drop_free_steps(shift, all, now);
        }
        if next_due != u64::MAX {
            self.idle.due_by(next_due);
        }
        purged
    }

    /// Hand the empty pages of heaps no thread owns (their threads exited while other
    /// threads still held blocks, freed since) back to the pool, so that their slabs can go
    /// idle. Each such heap is owned by the purge for the while (`PURGER`). True when one of
    /// them still holds pages afterwards.
    fn collect_abandoned(&self) -> bool {
        let mut holding = false;
        for h in self.heaps.iter() {
            // SeqCst: see `tls::release` (a heap given back after this pass reset the due time
            // is seen unowned here, or its request for a look stands).
            if !h.initialised.load(Ordering::Acquire) || h.owner.load(Ordering::SeqCst) != 0 {
                continue;
            }
            if h.owner
                .compare_exchange(0, PURGER, Ordering::Acquire, R)
                .is_ok()
            {
                h.release();
                holding |= h.holds_pages();
                let bytes = h.discard_cache();
                self.idle.heap_discarded.fetch_add(bytes as u64, R);
                h.owner.store(0, Ordering::Release);
            }
        }
        holding
    }

    /// Ask live threads' heaps to trim ([`Heap::request_trim`]): every one but `except`'s
    /// (`Some`: an explicit purge), or (`None`: a due purge) those whose thread freed nothing
    /// for the purge delay — a quiet thread's cached blocks and empty pages then go back at
    /// its next call, not at its next tick or never. True when a heap that no trim is pending
    /// for was not found quiet for the whole delay (a later look may find it quiet).
    pub(crate) fn request_trims(&self, except: Option<*const Heap>, now: u64) -> bool {
        let mut active = false;
        let me = super::tls::token();
        let delay_ms = self.idle.delay.unwrap_or(0) / 1_000_000;
        let now_ms = (now / 1_000_000) as u32;
        for h in self.heaps.iter() {
            let owner = h.owner.load(R);
            if !h.initialised.load(Ordering::Acquire)
                || owner == 0
                || owner == PURGER
                || owner == super::heap::PROVISIONING
                || owner == super::heap::SHARED
                || owner == me
                || h.orphaned()
                || except.is_some_and(|e| std::ptr::eq(e, h))
            {
                continue;
            }
            let quiet = except.is_some() || {
                let t = h.ticks();
                let seen = h.seen.load(R);
                if (seen >> 32) as u32 != t {
                    h.seen.store(u64::from(t) << 32 | u64::from(now_ms), R);
                    active |= !h.trim_pending();
                    false
                } else if u64::from(now_ms.wrapping_sub(seen as u32)) >= delay_ms {
                    true
                } else {
                    // Still, but not for the whole delay yet (this look came early, for a
                    // slab's due time): a later look decides.
                    active |= !h.trim_pending();
                    false
                }
            };
            if quiet && h.request_trim() {
                self.idle.trims_requested.fetch_add(1, R);
            }
        }
        active
    }

    /// A heap's owner ran a requested trim (statistics).
    pub(crate) fn count_trim(&self) {
        self.idle.trims.fetch_add(1, R);
    }

    /// Give back the memory of the listed pages of `1 << shift` bytes in slabs that are
    /// still in use (a slab with every page free goes whole, after the delay): in an ODP
    /// arena a few live blocks then keep their own 4 KiB pages, not a slab of pages freed
    /// around them (`Arena::discard_free`). A page given back is `fresh` (zero) again; one
    /// that is fresh already is left alone, so each is given back once per use.
    fn discard_free_pages(&self, shift: u32) {
        if cfg!(feature = "memcheck") || !self.arena.discards_free() {
            return;
        }
        let per_slab = 1u32 << (SLAB_SHIFT - shift);
        let list = self.page_list(shift);
        // Taken out of the list and out of their slabs' counts (under the list's lock), so
        // that no purge or steal finds their slab wholly listed while they are out; put back
        // as any empty page is (`list_page`: counted, and the slab idle if it is then whole).
        let chain = list.take_all_then(
            |p| {
                let start = p.start.load(R);
                let whole = self.small_free(p).is_some_and(|n| n.load(R) == per_slab);
                !p.fresh.load(R)
                    && !whole
                    && self.arena.is_sparse(start)
                    && self.arena.may_discard_in(start)
            },
            |p| {
                if let Some(n) = self.small_free(p) {
                    n.fetch_sub(1, R);
                }
            },
        );
        let mut p = chain;
        while !p.is_null() {
            // SAFETY: descriptors of the chain live in the page table.
            let page = unsafe { &*p };
            let next = page.next.load(R);
            if self.arena.discard_free(page.start.load(R), 1 << shift) {
                page.fresh.store(true, R);
                self.idle.discarded.fetch_add(1 << shift, R);
            }
            self.list_page(page);
            p = next;
        }
    }

    /// Slab `s`'s idle stamp or mark.
    pub(super) fn slab_mark(&self, s: usize) -> u64 {
        self.idle.idle.get(s).map_or(0, |t| t.load(R))
    }

    pub(super) fn mark_slab(&self, s: usize, mark: u64) {
        if let Some(t) = self.idle.idle.get(s) {
            t.store(mark, R);
        }
    }
}
