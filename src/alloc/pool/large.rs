//! Large runs: blocks above the small classes take whole slabs from the arena — a cached freed
//! run that fits, a slab the purge left spare, else a fresh run — and go back to the pool's
//! large lists when freed (the purge returns idle ones to the system). See the contract of
//! `pool.rs`.

use super::*;

impl PoolInner {
    /// A large block: a whole slab run aligned to `align`, zeroed when `zero`.
    pub(crate) fn alloc_large(&self, size: usize, align: usize, zero: bool) -> *mut u8 {
        let _inside = changing_hands();
        // Memory-checker mode keeps a guard page after the usable bytes (`memcheck.rs`).
        let Some(len) = size
            .checked_add(memcheck::LARGE_GUARD)
            .and_then(|s| s.checked_next_multiple_of(SLAB))
        else {
            return null_mut();
        };
        let slabs = len / SLAB;
        let fits = |p: &Page| {
            let l = p.large_len.load(R);
            l >= len && l <= 2 * len && p.start.load(R) % align == 0
        };
        // A cached run of up to twice the length will do: look in the lists of those lengths.
        let lists = slabs.min(LARGE_LISTS)..=(2 * slabs).min(LARGE_LISTS);
        let cached = self.large_free[lists]
            .iter()
            .find_map(|list| list.pop_if(fits));
        let cached = cached.filter(|page| {
            let (start, run_len) = (page.start.load(R), page.large_len.load(R));
            match self.reuse(start, run_len, false) {
                Ok(()) => true,
                Err(e) => {
                    self.count_failure(&e);
                    self.large_list(run_len).push(page);
                    false
                }
            }
        });
        if let Some(page) = cached {
            let run_len = page.large_len.load(R);
            self.large_cached.fetch_sub(run_len, R);
            self.large_live.fetch_add(run_len, R);
            page.kind.store(LARGE, Ordering::Release);
            let p = page.start.load(R) as *mut u8;
            memcheck::guard(p, run_len - memcheck::LARGE_GUARD);
            if zero {
                memcheck::unpoison(p, size);
                if !self.arena.zero_by_discard(p as usize, size) {
                    // SAFETY: the run is ours again and `size <= run_len`.
                    unsafe { std::ptr::write_bytes(p, 0, size) };
                }
            }
            return p;
        }
        let Some((start, run_len, clean)) = self.fresh_run(len, align.max(SLAB), Backing::Dense)
        else {
            return null_mut();
        };
        let p = start as *mut u8;
        memcheck::unpoison(p, run_len);
        memcheck::guard(p, run_len - memcheck::LARGE_GUARD);
        let head = self.desc(start);
        head.start.store(start, R);
        head.large_len.store(run_len, R);
        head.kind.store(LARGE, Ordering::Release);
        self.large_live.fetch_add(run_len, R);
        if zero && !clean && !self.arena.zero_by_discard(start, size) {
            // SAFETY: the run is ours and `size <= run_len`.
            unsafe { std::ptr::write_bytes(p, 0, size) };
        }
        p
    }

    /// Count a failed arena run, unless it was a re-entrant request or one made while
    /// provisioning (both served elsewhere: the bootstrap region).
    pub(in crate::alloc) fn count_failure(&self, e: &crate::arena::Error) {
        if !matches!(e, crate::arena::Error::Reentrant) && !crate::sys::provision::active() {
            self.failed.fetch_add(1, R);
        }
    }

    /// `(start, len, zero)` of a run of `len` bytes aligned to `align` (both multiples of a
    /// slab) that nothing uses — a slab of another size's empty pages (dirty: `zero` false;
    /// already resident, so whatever its backing), spare slabs revived (`spare.rs`; purged, so
    /// zero; of `backing` where there are such), else a fresh arena run of `backing` (zero);
    /// `None` (the failure counted) when none can be had.
    pub(super) fn fresh_run(
        &self,
        len: usize,
        align: usize,
        backing: Backing,
    ) -> Option<(usize, usize, bool)> {
        self.fresh_run_once(len, align, backing, false)
    }

    /// [`PoolInner::fresh_run`]; on a full arena, purge everything idle and try once more
    /// (unless `retried`).
    pub(super) fn fresh_run_once(
        &self,
        len: usize,
        align: usize,
        backing: Backing,
        retried: bool,
    ) -> Option<(usize, usize, bool)> {
        let chunk = self.arena.chunk_size() / SLAB;
        let (n, a) = (len / SLAB, align / SLAB);
        if n == 1 && a == 1 {
            if let Some(start) = self.steal_free_slab() {
                match self.reuse(start, SLAB, backing == Backing::Sparse) {
                    Ok(()) => return Some((start, SLAB, false)),
                    // Its pages are gone from their list: spare now, purged by nobody but
                    // revived by the next taker (the arena still has it committed or purged).
                    Err(e) => {
                        self.count_failure(&e);
                        self.make_spare(start, SLAB);
                    }
                }
            }
        }
        // A run of more than a chunk (or aligned beyond one) takes spare slabs too — a purged
        // dedicated run's space, or part of it — where they lie in one registration (or none).
        let one_reg = |s: usize| {
            n <= chunk
                || self
                    .arena
                    .one_registration((self.base + s * SLAB) as *const u8, len)
        };
        // Purged spare slabs fault in anew, so their backing matters: the backing asked for
        // first (a sparse run on a slab of huge pages would fault in 2 MiB at its first
        // block), then a fresh run of it, and spare slabs of the other backing only when the
        // arena is full. A range of spare slabs is taken only where its chunks share one
        // backing.
        let backing = self.arena.backing_for(backing);
        let sparse_at = |i: usize| self.arena.is_sparse(self.base + i * SLAB);
        let uniform = |s: usize, want: Option<bool>| {
            let first = sparse_at(s);
            want.is_none_or(|w| w == first)
                && (s..s + n)
                    .step_by(chunk.max(1))
                    .chain([s + n - 1])
                    .all(|i| sparse_at(i) == first)
        };
        let revive_spare = |want: Option<bool>| {
            let s = self
                .spare
                .take_if(n, a, chunk, |s| one_reg(s) && uniform(s, want))?;
            let start = self.base + s * SLAB;
            match self.reuse(start, len, backing == Backing::Sparse) {
                Ok(()) => Some((start, len, true)),
                Err(e) => {
                    self.count_failure(&e);
                    self.spare.put(s, n);
                    None
                }
            }
        };
        let want = (!self.arena.backings_alike()).then_some(backing == Backing::Sparse);
        if let Some(run) = revive_spare(want) {
            return Some(run);
        }
        match self.arena.alloc_run_in(len, align, backing) {
            Ok(run) => Some((run.as_ptr() as usize, run.len(), true)),
            Err(crate::arena::Error::ReservationFull { .. }) => {
                if let Some(run) = revive_spare(None) {
                    return Some(run);
                }
                if retried {
                    self.failed
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return None;
                }
                // Every reservation is used: freed slabs the purge delay still keeps become
                // spare (purged now), and may hold the run.
                self.purge_idle(true);
                self.fresh_run_once(len, align, backing, true)
            }
            Err(e) => {
                self.count_failure(&e);
                None
            }
        }
    }

    /// A slab nothing uses, taken out of the free list of another page size (all its pages
    /// empty) or off the front of a freed large run: so a workload that moves from one block size to
    /// another reuses the memory of the previous one at once, not only after a purge. Its
    /// descriptors are reset; the caller revives it (`reuse`) and cuts it anew.
    pub(super) fn steal_free_slab(&self) -> Option<usize> {
        for shift in GRANULE_SHIFT..=crate::alloc::class::MAX_PAGE_SHIFT {
            let per_slab = 1u32 << (SLAB_SHIFT - shift);
            let chosen = std::cell::Cell::new(0usize);
            let chain = self.page_list(shift).take_all_if(|p| {
                let slab = p.start.load(R) & !(SLAB - 1);
                match chosen.get() {
                    0 => {
                        let whole = self.small_free(p).is_none_or(|n| n.load(R) == per_slab);
                        if whole {
                            chosen.set(slab);
                        }
                        whole
                    }
                    c => c == slab,
                }
            });
            if !chain.is_null() {
                let slab = chosen.get();
                self.forget(slab, SLAB, false);
                return Some(slab);
            }
        }
        // A freed large run: its first slab; the rest stays listed as a shorter run.
        let run = (1..=LARGE_LISTS)
            .find_map(|i| self.large_free[i].pop_if(|p| p.large_len.load(R) >= SLAB))?;
        let (start, len) = (run.start.load(R), run.large_len.load(R));
        self.large_cached.fetch_sub(SLAB, R);
        self.forget(start, SLAB, false);
        if len > SLAB {
            let rest = self.desc(start + SLAB);
            rest.start.store(start + SLAB, R);
            rest.large_len.store(len - SLAB, R);
            rest.kind.store(LARGE_FREE, Ordering::Release);
            self.idle_from(start + SLAB);
            self.large_list(len - SLAB).push(rest);
        }
        Some(start)
    }

    /// Reset the descriptors of `[start, start + len)` (whole slabs out of every list).
    pub(super) fn forget(&self, start: usize, len: usize, spare: bool) {
        // A spare slab's descriptors (64 KiB of table per slab of 4 KiB granules) go back to
        // the OS, zero (`UNUSED`) again: a purged slab keeps no resident table behind. A slab
        // reused at once (stolen) is reset in place: it is cut anew right away.
        // SAFETY: the slabs are out of every list and nothing in them is handed out, so
        // nothing writes their descriptors meanwhile (a grant counter is 0: a granted block
        // is live or parked, never in a spare slab); all-zero descriptors are `UNUSED`.
        // Nothing of the range is on a list any more (a descriptor reset under a list would
        // be handed out zeroed): the pages of a slab, or a run's head.
        #[cfg(debug_assertions)]
        for at in (start..start + len.min(SLAB)).step_by(1 << GRANULE_SHIFT) {
            let d = self.desc(at);
            assert!(
                !d.listed.load(R),
                "a listed page in a forgotten range: {at:#x}"
            );
        }
        let discarded = spare
            && unsafe {
                self.pages
                    .discard((start - self.base) >> GRANULE_SHIFT, len >> GRANULE_SHIFT)
            };
        if let Some(n) = self.idle.small_free.get((start - self.base) / SLAB) {
            n.store(0, R);
        }
        if discarded {
            return;
        }
        for at in (start..start + len).step_by(1 << GRANULE_SHIFT) {
            let d = self.desc(at);
            // Descriptors nothing ever wrote (the inside of a large run) stay untouched: a
            // store would make their page of the table resident (2 MiB per GiB of run).
            if d.kind.load(R) == UNUSED
                && d.heap.load(R).is_null()
                && d.back.load(R) == 0
                && d.start.load(R) == 0
                && d.large_len.load(R) == 0
                && d.shift.load(R) == 0
            {
                continue;
            }
            d.kind.store(UNUSED, Ordering::Release);
            d.heap.store(null_mut(), R);
            d.back.store(0, R);
            d.start.store(0, R);
            d.large_len.store(0, R);
            d.shift.store(0, R);
        }
        if let Some(n) = self.idle.small_free.get((start - self.base) / SLAB) {
            n.store(0, R);
        }
    }

    /// Make `[start, start + len)` (whole slabs a purge returned, out of every list) spare:
    /// its descriptors forget what it was cut into.
    pub(in crate::alloc) fn make_spare(&self, start: usize, len: usize) {
        self.forget(start, len, true);
        self.spare.put((start - self.base) / SLAB, len / SLAB);
    }

    /// Keep a freed large run for reuse.
    pub(crate) fn free_large(&self, page: &Page) {
        let inside = changing_hands();
        let len = page.large_len.load(R);
        page.kind.store(LARGE_FREE, Ordering::Release);
        self.large_live.fetch_sub(len, R);
        self.large_cached.fetch_add(len, R);
        // Idle before it is listed: once listed, another thread may take it (and reset its
        // descriptor) at once.
        self.idle_from(page.start.load(R));
        self.large_list(len).push(page);
        // Out of the gate: a purge takes it itself, and the purge clock is started only by a
        // thread outside it.
        drop(inside);
        self.maybe_purge();
    }
}
