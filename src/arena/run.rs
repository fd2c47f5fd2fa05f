//! Handing out runs: whole slabs inside one registration, from the open chunk or from fresh
//! chunks of their own, committed (`commit.rs`) and registered (`register.rs`, `grow.rs`)
//! before they are returned.
//!
//! Contract: the arena's lock is held only while slabs are reserved and chunk state changes,
//! never across a NIC call; a run that cannot be committed, or registered under
//! `RegistrationPolicy::Required`, gives its slabs back (`failed_runs`), and nothing of it stays
//! committed. A chunk is bound to its NUMA node (`numa.rs`) when it is opened, before any of
//! its pages is committed; under `NumaPlacement::Local` runs are cut from the open chunk of
//! the calling thread's node, and the reserve of ready slabs is not used.

use super::commit::{Backing, PageKind};
use super::grow::Grown;
use super::stats::MAX_STAT_NODES;
use super::stats::{add, sub};
use super::{Arena, ChunkState, Error, NumaPlacement, RegMode, Run, SLAB, State};
use crate::sys::{os, provision};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

impl Arena {
    /// Hand out at least `len` bytes of whole slabs aligned to `align`, committed and inside
    /// one registration.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `len == 0` or an alignment that is not a power of two;
    /// [`Error::TooLarge`] above `max_mr_size`; [`Error::ReservationFull`];
    /// [`Error::HugepagesUnavailable`] under [`Hugepages::Require`](super::Hugepages::Require); [`Error::Os`] when memory
    /// cannot be committed; [`Error::Nic`] when the NIC refuses the registration (the memlock
    /// limit, `max_mr`). On error nothing stays committed.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&pd, cfg)?;
    /// let a = arena.alloc_run(100, 64)?;
    /// assert_eq!(a.len(), 2 << 20); // whole slabs
    /// let big = arena.alloc_run(100 << 20, 4096)?; // larger than a chunk: a region of its own
    /// assert_eq!(arena.keys_of(big.as_ptr()).unwrap().len, 100 << 20);
    /// assert!(arena.alloc_run(0, 64).is_err());
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn alloc_run(&self, len: usize, align: usize) -> Result<Run, Error> {
        self.alloc_run_in(len, align, Backing::Dense)
    }

    /// [`Arena::alloc_run`] from a chunk mapped for `backing` (`commit.rs`): in an ODP arena a
    /// sparse run (a slab the pool cuts into size-class pages) comes from a chunk of 4 KiB
    /// pages and is not prefetched whole (its pages are touched a block at a time). Runs of
    /// more than a chunk, and every run of a pinned arena, are dense.
    ///
    /// # Errors
    /// As [`Arena::alloc_run`].
    pub(crate) fn alloc_run_in(
        &self,
        len: usize,
        align: usize,
        backing: Backing,
    ) -> Result<Run, Error> {
        let backing = self.backing_for(backing);
        if len != 0
            && backing == Backing::Dense
            && len <= SLAB
            && align.is_power_of_two()
            && align <= SLAB
            && self.numa != NumaPlacement::Local
        {
            if let Some(addr) = self.ahead.take() {
                add(&self.counters.runs, 1);
                return Ok(Run {
                    ptr: NonNull::new(addr as *mut u8).ok_or(Error::NotRegistered)?,
                    len: SLAB,
                });
            }
        }
        self.alloc_fresh(len, align, backing)
    }

    /// The backing a run asking for `backing` gets: sparse in a lazy (ODP) arena, and in a
    /// pinned one while its sparse runs are registered in steps (`step.rs`). Pinned memory
    /// registered whole slabs at a time is populated and pinned whole whatever its pages: on
    /// 4 KiB pages it would pin as much, fault 512 times a slab, and cost the NIC 512
    /// translations.
    pub(crate) fn backing_for(&self, backing: Backing) -> Backing {
        if self.pages.lazy || self.steps_wanted() {
            backing
        } else {
            Backing::Dense
        }
    }

    /// [`Arena::alloc_run_in`] without the reserve of ready slabs: commit and register now.
    pub(crate) fn alloc_fresh(
        &self,
        len: usize,
        align: usize,
        backing: Backing,
    ) -> Result<Run, Error> {
        if provision::active() {
            return Err(Error::Reentrant);
        }
        let _mark = provision::Provisioning::enter();
        // A fork waits for this growth to finish (`atfork.rs`).
        let _inside = crate::sys::atfork::inside();
        // The growth path reads the device's events: a dead device is not called again.
        if !self.device_dead() {
            self.poll_device_events();
        }
        if len == 0 {
            return Err(Error::InvalidArgument("zero-length run"));
        }
        if !align.is_power_of_two() {
            return Err(Error::InvalidArgument("alignment must be a power of two"));
        }
        let slabs = len
            .checked_next_multiple_of(SLAB)
            .ok_or(Error::InvalidArgument("length overflows"))?
            / SLAB;
        if slabs > self.slabs_per_chunk as usize || align > self.chunk_size() {
            return self.alloc_dedicated(slabs, align);
        }
        self.alloc_in_chunk(slabs as u32, (align / SLAB).max(1) as u32, backing)
    }

    fn alloc_in_chunk(&self, slabs: u32, align_slabs: u32, backing: Backing) -> Result<Run, Error> {
        let spc = self.slabs_per_chunk;
        let (node, slot) = self.wanted_node();
        let sparse = backing == Backing::Sparse;
        let want_steps = sparse && self.mode == RegMode::Pinned && self.steps_wanted();
        let b = usize::from(sparse);
        let (c, old_used, s, kind, tail, sparse) = {
            let mut st = self.lock();
            let fits = |ch: &ChunkState| {
                let s = ch.used.next_multiple_of(align_slabs);
                (s + slabs <= spc).then_some(s)
            };
            let open = st.open[b][slot].and_then(|c| Some((c, fits(st.chunks.get(c)?)?)));
            // The open chunk is too full for this run: a chunk left behind earlier (a run that
            // did not fit moved on to a fresh chunk) takes it, before any fresh chunk is opened.
            let open = open.or_else(|| {
                let c = (0..st.next_chunk).find(|&c| {
                    st.chunks.get(c).is_some_and(|ch| {
                        ch.used > 0
                            && ch.used < spc
                            && ch.node == node
                            && ch.sparse == sparse
                            && !ch.queue
                            && fits(ch).is_some()
                    })
                })?;
                st.open[b][slot] = Some(c);
                Some((c, fits(st.chunks.get(c)?)?))
            });
            let (c, s) = match open {
                Some(cs) => cs,
                None => match self.open_chunks(&mut st, 1, 1, (node, backing)) {
                    Ok(c) => {
                        st.open[b][slot] = Some(c);
                        (c, 0)
                    }
                    // No chunk of this backing can be opened: one of the other backing with
                    // room takes the run (the backing is a preference, never a failure).
                    Err(e @ Error::ReservationFull { .. }) => (0..st.next_chunk)
                        .find_map(|c| {
                            let ch = st.chunks.get(c)?;
                            (ch.used > 0 && ch.node == node && !ch.queue).then_some((c, fits(ch)?))
                        })
                        .ok_or(e)?,
                    Err(e) => return Err(e),
                },
            };
            let base = self.chunk_base(c) as *mut u8;
            let Some(ch) = st.chunks.get_mut(c) else {
                return Err(self.full());
            };
            // The chunk's own backing (another's when the reservation was full).
            let sparse = ch.sparse;
            let backing = if sparse {
                Backing::Sparse
            } else {
                Backing::Dense
            };
            let kind = self.pages.commit(
                base,
                spc,
                &mut ch.huge_until,
                (s, s + slabs),
                (ch.node, backing),
            )?;
            let old_used = ch.used;
            ch.used = s + slabs;
            let tail = (self.rereg.load(Ordering::Relaxed) && ch.tail != 0 && ch.tail_end == s)
                .then(|| ch.tail - 1)
                .filter(|&id| self.table.reg(id).is_huge() == (kind == PageKind::Hugetlb));
            (c, old_used, s, kind, tail, sparse)
        };
        let addr = self.chunk_base(c) + s as usize * SLAB;
        let len = slabs as usize * SLAB;
        self.mark_run(addr, slabs as usize, false, sparse);
        self.committed(c, kind, addr, slabs);
        let huge = kind == PageKind::Hugetlb;
        let mut pinned_id = None;
        // A run of small pages in a pinned arena: registered a step at a time as its pages
        // are handed out (`step.rs`); any other sparse run there is populated to be pinned.
        let stepped =
            want_steps && sparse && !huge && self.set_stepped(self.slab_index(addr), len / SLAB);
        let populated = if sparse && !stepped && self.mode == RegMode::Pinned {
            self.pages.populate_ordinary(addr as *mut u8, len)
        } else {
            Ok(())
        };
        let registered = populated.and_then(|()| {
            if stepped {
                return Ok(None);
            }
            self.register_run(c, addr, len, false, || {
                let id = match tail {
                    Some(id) => match self.extend(id, addr, addr + len) {
                        Ok(Grown::Extended) => Ok(id),
                        Ok(Grown::Refused) => {
                            add(&self.counters.fallbacks_to_new_mr, 1);
                            self.register_new(addr, len, huge)
                        }
                        Err(e) => Err(e),
                    },
                    None => {
                        if s > 0 {
                            add(&self.counters.fallbacks_to_new_mr, 1);
                        }
                        self.register_new(addr, len, huge)
                    }
                }?;
                pinned_id = Some(id);
                Ok(id)
            })
        });
        if let Ok(id) = registered {
            // Outside the lock: NIC calls.
            self.prefetch_fresh(id, addr, len);
            self.rails_register(addr, len);
        }
        let mut st = self.lock();
        let Some(ch) = st.chunks.get_mut(c) else {
            return Err(self.full());
        };
        match registered {
            Ok(_) => {
                if let Some(id) = pinned_id {
                    if s + slabs > ch.tail_end || ch.tail == 0 {
                        ch.tail = id + 1;
                        ch.tail_end = s + slabs;
                    }
                }
                add(&self.counters.runs, 1);
                Ok(Run {
                    ptr: NonNull::new(addr as *mut u8).ok_or(Error::NotRegistered)?,
                    len,
                })
            }
            Err(e) => {
                // Decommitted before its slabs are given back, under the lock: once `used` is
                // rolled back another run may take them, and a later MADV_DONTNEED would drop
                // that run's live pages under its pinned region.
                self.uncommitted(addr, kind, slabs);
                if ch.used == s + slabs {
                    ch.used = old_used;
                }
                drop(st);
                Err(e)
            }
        }
    }

    /// A run of more than one chunk (or aligned beyond one): whole fresh chunks, one region.
    fn alloc_dedicated(&self, slabs: usize, align: usize) -> Result<Run, Error> {
        let len = slabs * SLAB;
        if len as u64 > self.max_mr_size {
            return Err(Error::TooLarge {
                len,
                max: self.max_mr_size,
            });
        }
        let m = len.div_ceil(self.chunk_size());
        let total = m as u32 * self.slabs_per_chunk;
        let (node, _) = self.wanted_node();
        let (c, kind) = {
            let mut st = self.lock();
            let c = self.open_chunks(&mut st, m, align, (node, Backing::Dense))?;
            let node = st.chunks.get(c).map_or(0, |ch| ch.node);
            let base = self.chunk_base(c) as *mut u8;
            let mut huge_until = 0;
            let mapped = self
                .pages
                .map_range(base, total, Backing::Dense)
                .and_then(|hu| {
                    huge_until = hu;
                    self.pages.bind(base, total as usize * SLAB, node);
                    self.pages.commit(
                        base,
                        total,
                        &mut huge_until,
                        (0, slabs as u32),
                        (node, Backing::Dense),
                    )
                });
            let kind = match mapped {
                Ok(kind) => kind,
                Err(e) => {
                    self.close_chunks(&mut st, c, m);
                    return Err(e);
                }
            };
            for i in c..c + m {
                if let Some(ch) = st.chunks.get_mut(i) {
                    ch.used = self.slabs_per_chunk;
                }
            }
            (c, kind)
        };
        let addr = self.chunk_base(c);
        self.mark_run(addr, slabs, false, false);
        self.committed(c, kind, addr, slabs as u32);
        let huge = kind == PageKind::Hugetlb;
        match self.register_run(c, addr, len, true, || self.register_new(addr, len, huge)) {
            Ok(id) => {
                self.prefetch_fresh(id, addr, len);
                self.rails_register(addr, len);
                add(&self.counters.runs, 1);
                Ok(Run {
                    ptr: NonNull::new(addr as *mut u8).ok_or(Error::NotRegistered)?,
                    len,
                })
            }
            Err(e) => {
                self.uncommitted(addr, kind, slabs as u32);
                let mut st = self.lock();
                self.close_chunks(&mut st, c, m);
                Err(e)
            }
        }
    }

    /// Whole slabs, committed and **not registered** (no region covers them, and none ever
    /// will: for memory the device reaches another way, DEVX UMEMs), cut from a chunk of their
    /// own; never purged, kept until the arena goes. Returns the run and its page kind (what
    /// page sizes a UMEM over it may use).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero length or one above a chunk; otherwise as
    /// [`Arena::alloc_run`], without the registration errors. On error nothing stays
    /// committed, and a chunk opened for the run is given back.
    pub(crate) fn alloc_unregistered(&self, len: usize) -> Result<(Run, PageKind), Error> {
        if provision::active() {
            return Err(Error::Reentrant);
        }
        let _mark = provision::Provisioning::enter();
        let _inside = crate::sys::atfork::inside();
        let spc = self.slabs_per_chunk;
        if len == 0 || len > self.chunk_size() {
            return Err(Error::InvalidArgument(
                "queue memory runs hold 1 byte up to one chunk",
            ));
        }
        let slabs = len.div_ceil(SLAB) as u32;
        let (node, _) = self.wanted_node();
        let (addr, kind, c) = {
            let mut st = self.lock();
            let fits = st
                .queue
                .filter(|&c| st.chunks.get(c).is_some_and(|ch| ch.used + slabs <= spc));
            let (c, fresh) = match fits {
                Some(c) => (c, false),
                None => (
                    self.open_chunks(&mut st, 1, 1, (node, Backing::Dense))?,
                    true,
                ),
            };
            let base = self.chunk_base(c) as *mut u8;
            let Some(ch) = st.chunks.get_mut(c) else {
                return Err(self.full());
            };
            let s = ch.used;
            match self.pages.commit(
                base,
                spc,
                &mut ch.huge_until,
                (s, s + slabs),
                (ch.node, Backing::Dense),
            ) {
                Ok(kind) => {
                    ch.used = s + slabs;
                    ch.queue = true;
                    if fresh {
                        st.queue = Some(c);
                    }
                    (self.chunk_base(c) + s as usize * SLAB, kind, c)
                }
                Err(e) => {
                    if fresh {
                        self.close_chunks(&mut st, c, 1);
                    }
                    return Err(e);
                }
            }
        };
        self.mark_run(addr, slabs as usize, true, false);
        self.committed(c, kind, addr, slabs);
        add(&self.counters.queue_bytes, slabs as u64 * SLAB as u64);
        Ok((
            Run {
                ptr: NonNull::new(addr as *mut u8).ok_or(Error::NotRegistered)?,
                len: slabs as usize * SLAB,
            },
            kind,
        ))
    }

    /// Take `m` fresh chunks whose start is aligned to `align`, map them for `backing`, bind
    /// them to node code `node` (`n + 1`, 0 for none; the node in force is recorded in each
    /// chunk's state), and return the first.
    fn open_chunks(
        &self,
        st: &mut State,
        m: usize,
        align: usize,
        (node, backing): (u32, Backing),
    ) -> Result<usize, Error> {
        let c = match self.find_hole(st, m, align) {
            Some(c) => {
                st.holes -= m;
                c
            }
            None => {
                let mut c = st.next_chunk;
                while self.chunk_base(c) % align != 0 && c < self.window_chunks() {
                    c += 1;
                }
                if c + m > self.chunks() && !self.reserve_through(st, c, m) {
                    return Err(self.full());
                }
                // Chunks skipped for alignment stay blank: a later run may take them.
                st.holes += c - st.next_chunk;
                c
            }
        };
        let base = self.chunk_base(c) as *mut u8;
        let huge_until = self
            .pages
            .map_range(base, m as u32 * self.slabs_per_chunk, backing)?;
        // Before any page is touched: the policy decides where the first fault places it.
        let node = self.pages.bind(base, m << self.chunk_shift, node);
        if m == 1 {
            if let Some(ch) = st.chunks.get_mut(c) {
                ch.huge_until = huge_until;
            }
        }
        for i in c..c + m {
            if let Some(ch) = st.chunks.get_mut(i) {
                ch.node = node;
                ch.sparse = backing == Backing::Sparse;
            }
        }
        if let Some(bytes) = self.node_bytes(node) {
            add(bytes, (m << self.chunk_shift) as u64);
        }
        st.next_chunk = st.next_chunk.max(c + m);
        add(&self.counters.chunks, m as u64);
        Ok(c)
    }

    /// The first of `m` blank chunks (never opened: skipped for the alignment of an earlier
    /// run) below `next_chunk` whose start is aligned to `align`, if any were skipped.
    fn find_hole(&self, st: &State, m: usize, align: usize) -> Option<usize> {
        if st.holes < m {
            return None;
        }
        let blank = |i: usize| {
            st.chunks.get(i).is_some_and(|ch| {
                ch.used == 0
                    && ch.huge_until == 0
                    && ch.tail == 0
                    && ch.odp == 0
                    && !ch.fallback
                    && ch.node == 0
                    && !ch.sparse
                    && !ch.queue
            }) && !st.open.iter().flatten().any(|&o| o == Some(i))
                && st.queue != Some(i)
        };
        let step = (align >> self.chunk_shift).max(1);
        let first =
            (self.chunk_base(0).next_multiple_of(align) - self.chunk_base(0)) >> self.chunk_shift;
        (first..st.next_chunk.saturating_sub(m - 1))
            .step_by(step)
            .find(|&c| (c..c + m).all(blank))
    }

    /// The per-node chunk byte counter of node code `node`, if it has one.
    fn node_bytes(&self, node: u32) -> Option<&std::sync::atomic::AtomicU64> {
        let n = node.checked_sub(1)? as usize;
        (n < MAX_STAT_NODES).then(|| &self.counters.node_chunk_bytes[n])
    }

    /// Undo [`Arena::open_chunks`] when nothing was opened after it.
    fn close_chunks(&self, st: &mut State, c: usize, m: usize) {
        let len = m << self.chunk_shift;
        // SAFETY: the chunks hold nothing handed out.
        let _ = unsafe { os::unmap_to_reserved(self.chunk_base(c) as *mut u8, len) };
        let node = st.chunks.get(c).map_or(0, |ch| ch.node);
        if let Some(bytes) = self.node_bytes(node) {
            sub(bytes, len as u64);
        }
        for i in c..c + m {
            if let Some(ch) = st.chunks.get_mut(i) {
                ch.node = 0;
                ch.sparse = false;
                ch.queue = false;
                ch.huge_until = 0;
                ch.used = 0;
            }
        }
        if st.next_chunk == c + m {
            st.next_chunk = c;
        } else {
            // Blank again, below chunks still open: a hole.
            st.holes += m;
        }
        sub(&self.counters.chunks, m as u64);
    }

    pub(super) fn kind_counter(&self, kind: PageKind) -> &std::sync::atomic::AtomicU64 {
        match kind {
            PageKind::Hugetlb => &self.counters.slabs_hugetlb,
            PageKind::Thp => &self.counters.slabs_thp,
            PageKind::Small => &self.counters.slabs_small,
        }
    }

    pub(super) fn committed(&self, c: usize, kind: PageKind, addr: usize, slabs: u32) {
        add(&self.counters.committed_bytes, slabs as u64 * SLAB as u64);
        add(self.kind_counter(kind), slabs as u64);
        self.set_kind(addr, slabs as usize, kind);
        if self.is_sparse(addr) {
            // 4 KiB pages by design: the log below tells where huge pages ran out.
            return;
        }
        let prev = self.last_kind.swap(kind.code(), Ordering::Relaxed);
        if prev != kind.code() {
            tracing::info!(
                target: "rdma_pool::arena",
                kind = kind.as_str(),
                chunk = c as u64,
                "arena slabs now committed as this page kind"
            );
        }
    }

    fn uncommitted(&self, addr: usize, kind: PageKind, slabs: u32) {
        self.pages.decommit(addr as *mut u8, slabs as usize * SLAB);
        self.forget_kind(addr, slabs as usize);
        sub(&self.counters.committed_bytes, slabs as u64 * SLAB as u64);
        sub(self.kind_counter(kind), slabs as u64);
        add(&self.counters.failed_runs, 1);
    }
}
