//! Returning slabs the caller no longer uses to the system, and committing them again.
//!
//! Contract:
//! - [`Arena::purge`] takes whole slabs the caller handed out and holds no live memory in;
//!   [`Arena::revive`] makes them usable again (committed, registered as the arena's mode says)
//!   before the caller reuses them. The arena keeps no list of its own: the pool decides what is
//!   free and when (its delay and `purge()`), the arena what that costs the registrations.
//! - ODP slabs are dropped with `MADV_DONTNEED` directly: the region stays, its keys keep
//!   their meaning, and the NIC faults the pages back in (zero-filled) on its next access.
//! - Pinned slabs are first taken out of their registration, and only then dropped, so no
//!   live pinned region ever covers a replaced page. A region wholly inside the purged range is
//!   deregistered (its keys stop working: they never come to mean other memory). A region that
//!   also covers live memory is split — its live parts registered anew, then it is
//!   deregistered; a refusal of either leaves it whole, so live memory never loses its
//!   registration (the parts are pinned twice meanwhile: under a memlock limit below that,
//!   the split is refused and the region goes once wholly idle) — only while its keys were
//!   never handed out (so no key anyone holds changes); a region whose keys
//!   were handed out, or that a window is bound to (`EBUSY`, rxe `EINVAL`), keeps its slabs:
//!   they stay committed and the purge of them is refused and counted.
//! - hugetlb slabs are dropped with `MADV_DONTNEED` (Linux ≥ 5.18), else by mapping fresh
//!   hugetlb memory over them; either way their huge pages return to the pool.
//! - Each slab's state is `LIVE → BUSY → PURGED → BUSY → LIVE`; `BUSY` is held by the one
//!   thread purging or reviving it, so concurrent revivals of one slab commit it once.
//!
//! Invariant: a `PURGED` slab is not committed, and no pinned region covers it; `LIVE` slabs a
//! region covers are committed.

use super::commit::Backing;
use super::commit::PageKind;
use super::stats::{add, sub};
use super::{Arena, Error, Hugepages, SLAB, SLAB_SHIFT};
use crate::sys::os;
use crate::sys::provision::{self, Provisioning};
use std::sync::atomic::{AtomicU8, Ordering};

pub(super) const LIVE: u8 = 0;
const PURGED: u8 = 1;
const BUSY: u8 = 2;

/// One slab's purge state and page kind (all-zero: live, kind unknown).
#[derive(Default)]
pub(crate) struct SlabInfo {
    pub(super) state: AtomicU8,
    pub(super) kind: AtomicU8,
    /// [`RUN_HEAD`], [`QUEUE`]: where runs start, what no region may cover (`rails/`).
    pub(super) flags: AtomicU8,
}

/// In [`SlabInfo::flags`]: the first slab of a run handed out.
pub(super) const RUN_HEAD: u8 = 1;
/// In [`SlabInfo::flags`]: queue memory, never registered as a region.
pub(super) const QUEUE: u8 = 2;
/// In [`SlabInfo::flags`]: committed for a run whose thread has not yet registered it on the
/// rails (`rails/regions.rs`); an attach leaves such slabs to that thread.
pub(super) const PENDING: u8 = 4;
/// In [`SlabInfo::flags`]: a slab of a sparse chunk (`commit.rs`, [`Backing::Sparse`]).
pub(super) const SPARSE: u8 = 8;

/// What happened to a group of slabs covered by one registration (or by none).
enum Unregistered {
    /// Registered as ODP (or not at all): nothing to undo before dropping the pages.
    Kept { registered: bool },
    /// Its pinned registration no longer covers it.
    Removed,
    /// Refused: the slabs stay live and committed.
    Refused,
}

impl Arena {
    pub(crate) fn set_kind(&self, addr: usize, slabs: usize, kind: PageKind) {
        let first = self.slab_index(addr);
        for i in first..first + slabs {
            if let Some(s) = self.slabs.get(i) {
                s.kind.store(kind.code(), Ordering::Relaxed);
            }
        }
    }

    /// Whether slab `i` is committed, live (not purged, not being purged or revived) and not
    /// queue memory: what every region of every device must cover.
    pub(super) fn slab_in_use(&self, i: usize) -> bool {
        self.slabs.get(i).is_some_and(|s| {
            s.state.load(Ordering::Acquire) == LIVE
                && s.kind.load(Ordering::Relaxed) != 0
                && s.flags.load(Ordering::Acquire) & (QUEUE | PENDING) == 0
        })
    }

    /// Whether slab `i` starts a run.
    pub(super) fn is_run_head(&self, i: usize) -> bool {
        self.slabs
            .get(i)
            .is_some_and(|s| s.flags.load(Ordering::Relaxed) & RUN_HEAD != 0)
    }

    /// Note the run `[addr, addr + slabs · SLAB)` about to be committed (`QUEUE`: queue
    /// memory; otherwise `PENDING` until [`Arena::rails_register`] clears it), of a sparse
    /// chunk or not.
    pub(super) fn mark_run(&self, addr: usize, slabs: usize, queue: bool, sparse: bool) {
        let first = self.slab_index(addr);
        let rest = if queue { QUEUE } else { PENDING } | if sparse { SPARSE } else { 0 };
        for i in first..first + slabs {
            if let Some(s) = self.slabs.get(i) {
                let head = if i == first { RUN_HEAD } else { 0 };
                s.flags.store(head | rest, Ordering::Relaxed);
            }
        }
    }

    /// Whether the slab holding `addr` lies in a sparse chunk: 4 KiB pages unless the policy
    /// is [`Hugepages::Require`](super::Hugepages::Require) (`commit.rs`).
    pub(crate) fn is_sparse(&self, addr: usize) -> bool {
        addr.checked_sub(self.base())
            .is_some_and(|o| self.slab_is_sparse(o >> super::SLAB_SHIFT))
    }

    /// Whether slab `i` lies in a sparse chunk.
    pub(super) fn slab_is_sparse(&self, i: usize) -> bool {
        self.slabs
            .get(i)
            .is_some_and(|s| s.flags.load(Ordering::Relaxed) & SPARSE != 0)
    }

    /// Clear `PENDING` on slabs `[first, first + n)`.
    pub(super) fn unpend(&self, first: usize, n: usize) {
        for i in first..first + n {
            if let Some(s) = self.slabs.get(i) {
                s.flags.fetch_and(!PENDING, Ordering::Release);
            }
        }
    }

    /// Slabs `[addr, addr + slabs · SLAB)` are no longer committed (a failed run).
    pub(super) fn forget_kind(&self, addr: usize, slabs: usize) {
        let first = self.slab_index(addr);
        for i in first..first + slabs {
            if let Some(s) = self.slabs.get(i) {
                s.kind.store(0, Ordering::Relaxed);
                s.flags.store(0, Ordering::Relaxed);
            }
        }
    }

    fn kind_at(&self, i: usize) -> PageKind {
        match self.slabs.get(i).map(|s| s.kind.load(Ordering::Relaxed)) {
            Some(1) => PageKind::Hugetlb,
            Some(2) => PageKind::Thp,
            _ => PageKind::Small,
        }
    }

    fn slab_range(&self, ptr: *const u8, len: usize) -> Result<(usize, usize), Error> {
        let addr = ptr as usize;
        if len == 0 || addr % SLAB != 0 || len % SLAB != 0 {
            return Err(Error::InvalidArgument("purge and revive take whole slabs"));
        }
        let end = addr.saturating_add(len);
        if addr < self.base || end > self.base + self.span() {
            return Err(Error::InvalidArgument(
                "range outside the arena's opened chunks",
            ));
        }
        Ok((self.slab_index(addr), len >> SLAB_SHIFT))
    }

    /// Whether the whole slabs `[ptr, ptr + len)` lie in one registration of this device, or
    /// in none (all purged out of their pinned regions): so that a run revived there is one
    /// SGE. False for a range outside the opened chunks.
    pub(crate) fn one_registration(&self, ptr: *const u8, len: usize) -> bool {
        let Ok((first, n)) = self.slab_range(ptr, len) else {
            return false;
        };
        let id = self.table.reg_at(first);
        (first + 1..first + n).all(|i| self.table.reg_at(i) == id)
    }

    /// Whether the slab holding `ptr` is purged (not committed).
    pub fn is_purged(&self, ptr: *const u8) -> bool {
        self.contains(ptr)
            && self
                .slabs
                .get(self.slab_index(ptr as usize))
                .is_some_and(|s| s.state.load(Ordering::Acquire) != LIVE)
    }

    /// Return the whole slabs `[ptr, ptr + len)` to the system (see the module contract);
    /// returns the bytes purged, which is less than `len` where a registration kept slabs.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range that is not whole slabs of opened chunks, or
    /// holds a slab already purged (or being purged or revived); [`Error::Reentrant`] from
    /// inside the arena's own provisioning. Nothing changes on error.
    ///
    /// # Safety
    /// The caller handed the range out and holds no live memory in it: its contents are lost.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&pd, cfg)?;
    /// let run = arena.alloc_run(4 << 20, 4096)?;
    /// // SAFETY: nothing lives in the run.
    /// assert_eq!(unsafe { arena.purge(run.as_ptr(), run.len()) }?, 4 << 20);
    /// assert_eq!(arena.keys_of(run.as_ptr()), None); // its pinned region is gone
    /// arena.revive(run.as_ptr(), run.len())?;
    /// assert!(arena.keys_of(run.as_ptr()).is_some());
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub unsafe fn purge(&self, ptr: *mut u8, len: usize) -> Result<usize, Error> {
        if provision::active() {
            return Err(Error::Reentrant);
        }
        let _mark = Provisioning::enter();
        let _inside = crate::sys::atfork::inside();
        let (first, n) = self.slab_range(ptr, len)?;
        self.claim(first, n, LIVE)?;
        let mut purged = 0;
        let mut i = first;
        while i < first + n {
            if self.table.is_stepped(i) {
                purged += self.purge_stepped(i);
                i += 1;
                continue;
            }
            let id = self.table.reg_at(i);
            let mut e = i + 1;
            while e < first + n && self.table.reg_at(e) == id && !self.table.is_stepped(e) {
                e += 1;
            }
            // Other devices first: their pinned regions must not outlive the pages either.
            let outcome = if !self.rails_unregister(i, e) {
                Unregistered::Refused
            } else {
                let o = match id {
                    None => Unregistered::Kept { registered: false },
                    Some(id) => self.unregister(id, i, e),
                };
                if matches!(o, Unregistered::Refused) {
                    self.rails_recover(i, e);
                }
                o
            };
            match outcome {
                Unregistered::Refused => {
                    add(&self.counters.purges_refused, 1);
                    self.set_state(i, e - i, LIVE);
                }
                Unregistered::Kept { registered } => {
                    self.drop_pages(i, e - i, registered, !registered);
                    purged += (e - i) * SLAB;
                }
                Unregistered::Removed => {
                    self.drop_pages(i, e - i, true, false);
                    purged += (e - i) * SLAB;
                }
            }
            i = e;
        }
        if purged > 0 {
            add(&self.counters.purges, 1);
            add(&self.counters.purged_bytes, purged as u64);
        }
        Ok(purged)
    }

    /// `BUSY` on slabs `[first, first + n)`, all of which must be in state `from`.
    fn claim(&self, first: usize, n: usize, from: u8) -> Result<(), Error> {
        for i in first..first + n {
            let ok = self.slabs.get(i).is_some_and(|s| {
                s.state
                    .compare_exchange(from, BUSY, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            });
            if !ok {
                self.set_state(first, i - first, from);
                return Err(Error::InvalidArgument(
                    "slab already purged, or being purged or revived",
                ));
            }
        }
        Ok(())
    }

    pub(super) fn set_state(&self, first: usize, n: usize, state: u8) {
        for i in first..first + n {
            if let Some(s) = self.slabs.get(i) {
                s.state.store(state, Ordering::Release);
            }
        }
    }

    /// Take slabs `[s, e)` out of registration `id` (see the module contract).
    fn unregister(&self, id: u32, s: usize, e: usize) -> Unregistered {
        let reg = self.table.reg(id);
        if reg.is_odp() {
            return Unregistered::Kept { registered: true };
        }
        let (start, len) = reg.range();
        let (rs, re) = (
            self.slab_index(start),
            self.slab_index(start) + (len >> SLAB_SHIFT),
        );
        if rs >= s && re <= e {
            // Wholly purged: deregister (no slot points at it during the call). A private
            // region may be growing meanwhile: hold REREG against the grower.
            let held = !reg.is_exposed();
            if held && !reg.begin_rereg() {
                return Unregistered::Refused;
            }
            self.forget_tail(start, id);
            self.table.publish(rs, re - rs, None);
            if self.release_region(id, held).is_some() {
                self.table.publish(rs, re - rs, Some(id));
                return Unregistered::Refused;
            }
            return Unregistered::Removed;
        }
        if reg.is_exposed() || !reg.begin_rereg() {
            return Unregistered::Refused;
        }
        self.split(id, (rs, re), (s, e))
    }

    /// Register the parts of private region `id` over slabs `[rs, re)` outside `[s, e)` anew,
    /// then deregister it. The caller holds `REREG` on it. The parts come first, while the
    /// region still covers them: a refused registration (or deregistration) leaves the region
    /// as it was, so live memory never loses its registration (under `Required` a block that
    /// was served registered stays so; before, a refused part and a refused re-registration of
    /// the whole left the live parts with no keys).
    fn split(&self, id: u32, (rs, re): (usize, usize), (s, e): (usize, usize)) -> Unregistered {
        let reg = self.table.reg(id);
        let huge = reg.is_huge();
        let at = |i: usize| self.base + (i << SLAB_SHIFT);
        // Each part registered and installed (an id of its own, published below) or, on any
        // refusal, what was made is released and the region stays whole.
        let mut made: [Option<(u32, usize, usize)>; 2] = [None, None];
        let undo = |made: [Option<(u32, usize, usize)>; 2]| {
            for (new, _, _) in made.into_iter().flatten() {
                self.release_region(new, false);
            }
        };
        for (k, (a, b)) in [(rs, s), (e, re)].into_iter().enumerate() {
            if a < b {
                let part = self
                    .reg_mr(at(a), (b - a) << SLAB_SHIFT, huge)
                    .ok()
                    .and_then(|mr| self.install_region(mr, huge).ok());
                match part {
                    Some(new) => made[k] = Some((new, a, b)),
                    None => {
                        undo(made);
                        reg.end_rereg();
                        return Unregistered::Refused;
                    }
                }
            }
        }
        // SAFETY: this thread holds REREG on a live registration.
        let mr = unsafe { reg.take() };
        if let Err(refused) = mr.dereg() {
            // SAFETY: taken out above; this thread still holds REREG.
            unsafe { reg.install(refused.mr, huge) };
            reg.end_rereg();
            undo(made);
            return Unregistered::Refused;
        }
        sub(&self.counters.mrs, 1);
        for (new, a, b) in made.into_iter().flatten() {
            self.table.publish(a, b - a, Some(new));
        }
        self.table.publish(s, e - s, None);
        self.forget_tail(at(rs), id);
        reg.end_rereg();
        self.table.release(id);
        Unregistered::Removed
    }

    /// Clear the chunk's growth tail if it was region `id` (released ids are reused).
    fn forget_tail(&self, addr: usize, id: u32) {
        let Some(c) = self.chunk_of(addr as *const u8) else {
            return;
        };
        if let Some(ch) = self.lock().chunks.get_mut(c) {
            if ch.tail == id + 1 {
                ch.tail = 0;
                ch.tail_end = 0;
            }
        }
    }

    /// Drop the pages of slabs `[first, first + n)` and mark them purged.
    pub(super) fn drop_pages(&self, first: usize, n: usize, registered: bool, unregistered: bool) {
        let bytes = n << SLAB_SHIFT;
        for i in first..first + n {
            let kind = self.kind_at(i);
            let at = (self.base + (i << SLAB_SHIFT)) as *mut u8;
            // SAFETY: the caller of `purge` holds no live memory here, and no pinned region
            // covers it any more.
            let dropped = unsafe { os::madvise(at, SLAB, libc::MADV_DONTNEED) };
            if dropped.is_err() && kind == PageKind::Hugetlb {
                // Before Linux 5.18 hugetlb memory cannot be dropped by madvise: map it anew.
                // SAFETY: as above; the slab is the arena's own mapping.
                let _ = unsafe { os::map_fixed(at, SLAB, true) };
                // A fresh mapping has no NUMA policy: the chunk's again.
                let node = self.chunk_of(at).map_or(0, |c| self.chunk_node_code(c));
                self.pages.bind(at, SLAB, node);
                let _ = self.pages.dontfork_range(at, SLAB);
            }
            sub(self.kind_counter(kind), 1);
        }
        sub(&self.counters.committed_bytes, bytes as u64);
        if registered {
            sub(&self.counters.registered_bytes, bytes as u64);
        }
        if unregistered {
            sub(&self.counters.unregistered_bytes, bytes as u64);
        }
        self.set_state(first, n, PURGED);
    }

    /// Make `[ptr, ptr + len)` usable again: commit and register its purged slabs (a no-op, one
    /// load per slab, when none is purged). Waits for a concurrent purge or revival of the
    /// same slabs.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range that is not whole slabs of opened chunks;
    /// [`Error::Os`]/[`Error::HugepagesUnavailable`] when memory cannot be committed; a refused
    /// registration under [`RegistrationPolicy::Required`](super::RegistrationPolicy). The
    /// slabs stay purged on error.
    pub fn revive(&self, ptr: *mut u8, len: usize) -> Result<(), Error> {
        self.revive_as(ptr, len, false)
    }

    /// [`Arena::revive`]; `stepped`: the slabs will be cut into pages of at most a step, so
    /// sparse ones of a pinned arena are registered in steps (`step.rs`), not whole.
    ///
    /// # Errors
    /// As [`Arena::revive`].
    pub(crate) fn revive_as(&self, ptr: *mut u8, len: usize, stepped: bool) -> Result<(), Error> {
        let (first, n) = self.slab_range(ptr, len)?;
        let all_live = (first..first + n).all(|i| {
            self.slabs
                .get(i)
                .is_some_and(|s| s.state.load(Ordering::Acquire) == LIVE)
        });
        if all_live {
            return Ok(());
        }
        self.revive_cold(first, n, stepped)
    }

    #[cold]
    fn revive_cold(&self, first: usize, n: usize, stepped: bool) -> Result<(), Error> {
        let _inside = crate::sys::atfork::inside();
        if provision::active() {
            return Err(Error::Reentrant);
        }
        let _mark = Provisioning::enter();
        let mut i = first;
        while i < first + n {
            // Claim a maximal group of purged slabs, waiting out BUSY ones.
            let Some(s) = self.slabs.get(i) else { break };
            match s
                .state
                .compare_exchange(PURGED, BUSY, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {}
                Err(LIVE) => {
                    i += 1;
                    continue;
                }
                Err(_) => {
                    std::thread::yield_now();
                    continue;
                }
            }
            let mut e = i + 1;
            while e < first + n
                && self.slabs.get(e).is_some_and(|s| {
                    s.state
                        .compare_exchange(PURGED, BUSY, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                })
            {
                e += 1;
            }
            if let Err(err) = self.recommit(i, e, stepped) {
                self.set_state(i, e - i, PURGED);
                return Err(err);
            }
            self.set_state(i, e - i, LIVE);
            // Live first, then the rails: an attach either sees the slabs live or is seen.
            self.rails_register(self.base + (i << SLAB_SHIFT), (e - i) << SLAB_SHIFT);
            i = e;
        }
        Ok(())
    }

    /// Commit and register slabs `[s, e)` (claimed `BUSY`); sparse ones in steps where
    /// `stepped` asks and the arena registers steps.
    fn recommit(&self, s: usize, e: usize, stepped: bool) -> Result<(), Error> {
        let addr = self.base + (s << SLAB_SHIFT);
        let len = (e - s) << SLAB_SHIFT;
        let mut kind = self.kind_at(s);
        let stepped = stepped
            && kind != PageKind::Hugetlb
            && (self.slab_is_sparse(s) || self.backings_alike())
            && self.table.reg_at(s).is_none()
            && self.steps_wanted()
            && self.set_stepped(s, e - s);
        let populated = if kind == PageKind::Hugetlb {
            os::populate_write(addr as *mut u8, len)
        } else if stepped {
            Ok(())
        } else {
            self.pages
                .populate_ordinary(addr as *mut u8, len)
                .map_err(|e| match e {
                    Error::Os { errno, .. } => errno,
                    _ => libc::ENOMEM,
                })
        };
        if let Err(errno) = populated {
            if kind != PageKind::Hugetlb {
                return Err(Error::Os {
                    what: "madvise(MADV_POPULATE_WRITE)",
                    errno,
                });
            }
            // Give back what the partial populate took.
            // SAFETY: the slabs are purged: nothing lives in them.
            let _ = unsafe { os::madvise(addr as *mut u8, len, libc::MADV_DONTNEED) };
            if self.pages.policy == Hugepages::Require {
                // Hugetlb pages or nothing, as for a fresh slab (`commit.rs`).
                return Err(Error::HugepagesUnavailable { errno });
            }
            // The hugetlb pool ran dry meanwhile: these slabs become ordinary memory.
            let node = self
                .chunk_of(addr as *const u8)
                .map_or(0, |c| self.chunk_node_code(c));
            let backing = if self.is_sparse(addr) {
                Backing::Sparse
            } else {
                Backing::Dense
            };
            kind = self
                .pages
                .remap_ordinary(addr as *mut u8, len, (node, backing))?;
            self.set_kind(addr, e - s, kind);
        }
        let registered = self.table.reg_at(s);
        add(&self.counters.committed_bytes, len as u64);
        // Per slab: a run revived whole may hold slabs of several kinds (runs committed apart,
        // purged into one spare range), each counted as what it is.
        (s..e).for_each(|i| add(self.kind_counter(self.kind_at(i)), 1));
        if stepped {
            // Its steps are registered as its pages are handed out.
            add(&self.counters.revived_bytes, len as u64);
            return Ok(());
        }
        if let Some(id) = registered {
            // An ODP region kept its slabs: the purge dropped their pages, fault them back.
            add(&self.counters.registered_bytes, len as u64);
            self.prefetch_fresh(Some(id), addr, len);
        } else {
            let c = self.chunk_of(addr as *const u8).unwrap_or(0);
            let spans = self.chunk_of((addr + len - 1) as *const u8) != Some(c);
            let huge = kind == PageKind::Hugetlb;
            let r = self.register_run(c, addr, len, spans, || self.register_new(addr, len, huge));
            if let Ok(id) = r {
                self.prefetch_fresh(id, addr, len);
            }
            if let Err(err) = r {
                // SAFETY: nothing lives in the slabs yet.
                let _ = unsafe { os::madvise(addr as *mut u8, len, libc::MADV_DONTNEED) };
                sub(&self.counters.committed_bytes, len as u64);
                (s..e).for_each(|i| sub(self.kind_counter(self.kind_at(i)), 1));
                return Err(err);
            }
        }
        add(&self.counters.revived_bytes, len as u64);
        Ok(())
    }
}
