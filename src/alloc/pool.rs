//! The pool's shared state: the arena, the page table, empty pages by size, freed large runs,
//! and the heaps of the threads using the pool. Everything here is the slow path; the fast
//! paths live in `heap.rs`.
//!
//! Contract: pages are carved from arena runs (so every block lies inside one registration) and
//! never leave the pool; an empty page goes back to the free list of its size and may then
//! serve any class of that page size. Large blocks (above `MAX_SMALL`, or aligned above
//! it) are whole slab runs; freed ones are kept by slab count for reuse. All metadata lives
//! in memory mapped from the kernel, never in the global allocator.
//!
//! Invariant: a granule's descriptor is `UNUSED` until its page or run is carved; `TAIL`
//! granules of a page point back to its head; `LARGE`/`LARGE_FREE` heads hold the run length.
//! Large runs (taking, caching, freeing) are in `pool/large.rs`.

use super::class::{GRANULE_SHIFT, page_shift_for};
use super::heap::Heap;
use super::heaps::Heaps;
use super::memcheck;
use super::page::{LARGE, LARGE_FREE, Page, SMALL, TAIL, UNUSED};
use super::purge::Idle;
use crate::arena::{Arena, Backing, SLAB, SLAB_SHIFT, STEP_SHIFT};
use crate::sys::atfork::{ForkGuard, ForkLock};
use crate::sys::futex;
use crate::sys::os::MmapArray;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

mod large;

const R: Ordering = Ordering::Relaxed;

/// Distinct page sizes: 4 KiB .. 2 MiB.
const PAGE_SIZES: usize = (super::class::MAX_PAGE_SHIFT - GRANULE_SHIFT + 1) as usize;

/// Freed large runs are kept in lists by slab count up to this; longer runs share one list.
const LARGE_LISTS: usize = 64;

/// An intrusive list of descriptors (through `next`), under a lock.
pub(crate) struct List(ForkLock<usize>);

impl List {
    const fn new() -> List {
        List(ForkLock::new(0))
    }

    fn lock(&self) -> ForkGuard<'_, usize> {
        self.0.lock()
    }

    pub(crate) fn push(&self, page: &Page) {
        self.push_then(page, |_| ());
    }

    /// Push `page` and run `then` on it under the list's lock.
    pub(crate) fn push_then<T>(&self, page: &Page, then: impl FnOnce(&Page) -> T) -> T {
        let mut head = self.lock();
        let twice = page.listed.swap(true, R);
        debug_assert!(!twice, "a page listed twice: {:#x}", page.start.load(R));
        page.next.store(*head as *mut Page, R);
        *head = page as *const Page as usize;
        then(page)
    }

    /// Take out every page for which `take` holds (only the first, with `first`) under one
    /// lock, running `then` on each there: a chain through `next`, last taken first.
    fn unlink(
        &self,
        take: impl Fn(&Page) -> bool,
        first: bool,
        mut then: impl FnMut(&Page),
    ) -> *mut Page {
        let mut head = self.lock();
        let mut chain: *mut Page = null_mut();
        let mut prev: *const Page = null_mut();
        let mut p = *head as *mut Page;
        while !p.is_null() {
            // SAFETY: descriptors on the list live in the pool's page table.
            let page = unsafe { &*p };
            let next = page.next.load(R);
            if take(page) {
                if prev.is_null() {
                    *head = next as usize;
                } else {
                    // SAFETY: as above.
                    unsafe { (*prev).next.store(next, R) };
                }
                then(page);
                page.listed.store(false, R);
                page.next.store(chain, R);
                chain = p;
                if first {
                    break;
                }
            } else {
                prev = p;
            }
            p = next;
        }
        chain
    }

    /// Take out every page for which `take` holds, under one lock: a chain through `next`.
    pub(crate) fn take_all_if(&self, take: impl Fn(&Page) -> bool) -> *mut Page {
        self.unlink(take, false, |_| ())
    }

    /// [`List::take_all_if`], running `then` on each page taken, under the lock.
    pub(crate) fn take_all_then(
        &self,
        take: impl Fn(&Page) -> bool,
        then: impl FnMut(&Page),
    ) -> *mut Page {
        self.unlink(take, false, then)
    }

    /// Pop the first page for which `fits` holds.
    pub(crate) fn pop_if(&self, fits: impl Fn(&Page) -> bool) -> Option<&Page> {
        self.pop_if_then(fits, |_| ())
    }

    /// Pop the first page for which `fits` holds and run `then` on it under the lock.
    fn pop_if_then(&self, fits: impl Fn(&Page) -> bool, then: impl FnOnce(&Page)) -> Option<&Page> {
        let mut then = Some(then);
        let p = self.unlink(fits, true, |page| {
            if let Some(f) = then.take() {
                f(page)
            }
        });
        // SAFETY: a descriptor of the pool's page table (null when none was taken).
        unsafe { p.as_ref() }
    }
}

/// Enter the fork gate for a page or run changing hands (taken, carved, stolen, retired,
/// freed): a fork waits until it is done (`sys/atfork.rs`), so a child never finds a page
/// half-listed or half-owned.
fn changing_hands() -> crate::sys::atfork::Inside {
    crate::sys::atfork::inside()
}

/// Where the page descriptors are: copied into the `Core` handle so `free` reaches a
/// descriptor with one dependent load.
#[derive(Clone, Copy)]
pub(crate) struct PageTable {
    pub(super) base: usize,
    reserve: usize,
    descs: *const Page,
}

// SAFETY: a read-only view of descriptors that live (in the pool's mapping) as long as the
// pool; descriptors are atomics.
unsafe impl Send for PageTable {}
// SAFETY: as above.
unsafe impl Sync for PageTable {}

impl PageTable {
    /// `(base, window)`: the first address and length of the address space the arena holds.
    pub(crate) fn span(&self) -> (usize, usize) {
        (self.base, self.reserve)
    }

    /// Whether `p` lies in the pool's reservation.
    #[inline(always)]
    pub(crate) fn contains(&self, p: *const u8) -> bool {
        (p as usize).wrapping_sub(self.base) < self.reserve
    }

    /// The head descriptor of the page or run holding `p`, if `p` is in the pool.
    #[inline(always)]
    pub(crate) fn page_of(&self, p: *const u8) -> Option<&Page> {
        if !self.contains(p) {
            return None;
        }
        // SAFETY: just checked.
        Some(unsafe { self.page_of_unchecked(p) })
    }

    /// Whether a grant is open on a block starting in `p`'s granule (`grant/ledger.rs`): one
    /// relaxed load.
    ///
    /// # Safety
    /// `self.contains(p)`.
    #[inline(always)]
    pub(crate) unsafe fn granted(&self, p: *const u8) -> bool {
        let i = (p as usize).wrapping_sub(self.base) >> GRANULE_SHIFT;
        // SAFETY: `p` is in the reservation; the table has an entry per granule.
        unsafe { &*self.descs.add(i) }.granted.load(R) != 0
    }

    /// The descriptor of the granule at offset `off` in the reservation (not hopping to the
    /// page's head: the fields recorded in every granule, `heap` and `granted`, are right).
    ///
    /// # Safety
    /// `off < reserve`.
    #[inline(always)]
    pub(crate) unsafe fn desc_at(&self, off: usize) -> &Page {
        // SAFETY: the table has an entry per granule of the reservation (the caller's
        // contract), alive as long as the pool this view was taken from.
        unsafe { &*self.descs.add(off >> GRANULE_SHIFT) }
    }

    /// [`PageTable::page_of`] of a pointer known to be in the reservation.
    ///
    /// # Safety
    /// `self.contains(p)`.
    #[inline(always)]
    pub(crate) unsafe fn page_of_unchecked(&self, p: *const u8) -> &Page {
        let i = (p as usize).wrapping_sub(self.base) >> GRANULE_SHIFT;
        // SAFETY: `p` is in the reservation and the table has `reserve >> GRANULE_SHIFT`
        // entries, alive as long as the pool this view was taken from.
        let d = unsafe { &*self.descs.add(i) };
        if d.kind.load(R) != TAIL {
            return d;
        }
        // SAFETY: a tail's `back` leads to its head in the same table.
        unsafe { &*self.descs.add(i - d.back.load(R) as usize) }
    }
}

/// The longest a thread waits for another to cut a slab of the page size it needs.
const CARVE_WAIT_NS: u128 = 50_000_000;

/// A thread's turn to cut slabs of one page size (its carving lock). However it ends — a
/// slab cut, pages found listed meanwhile, an error — the lock goes first and then the
/// waiters are woken: one of them, finding the list empty, takes the next turn.
struct Turn<'a> {
    lock: Option<ForkGuard<'a, ()>>,
    turns: &'a AtomicU32,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.lock.take());
        turn_ended(self.turns);
    }
}

/// Count the end of a carving turn (or a cut) and wake every thread waiting on it.
fn turn_ended(turns: &AtomicU32) {
    turns.fetch_add(1, Ordering::SeqCst);
    futex::wake(turns, i32::MAX);
}

/// The shared state of a [`Core`](super::Core).
pub(crate) struct PoolInner {
    /// The free path's quarantine (`quarantine.rs`), installed by the pool's features.
    pub(crate) quarantine: super::quarantine::Hook,
    /// The refill thread (`prefetch/refill.rs`), stopped by the pool's drop.
    pub(crate) refill: crate::arena::prefetch::Refill,
    pub(crate) id: u64,
    pub(crate) arena: Arena,
    pub(crate) table: PageTable,
    pub(super) base: usize,
    reserve: usize,
    pages: MmapArray<Page>,
    free_pages: [List; PAGE_SIZES],
    /// One carver per page size at a time: threads whose list was empty wait for the slab
    /// the first one cuts instead of each cutting one (600 threads starting at once would
    /// commit a slab each).
    carving: [ForkLock<()>; PAGE_SIZES],
    /// Carving turns ended (a slab cut, or pages found listed) and slabs cut by threads that
    /// gave up waiting, per page size (wrapping): a waiter sleeps on its size's count until
    /// it changes (`futex`), and takes that as the sign that carvers make progress.
    cuts: [AtomicU32; PAGE_SIZES],
    large_free: [List; LARGE_LISTS + 1],
    pub(crate) heaps: Heaps,
    pub(crate) large_live: AtomicUsize,
    pub(crate) large_cached: AtomicUsize,
    pub(crate) failed: AtomicU64,
    pub(crate) idle: Idle,
    pub(super) spare: super::spare::Spare,
    /// Environment variables with values the pool did not know (`arena/env.rs`).
    pub(crate) env_ignored: u32,
}

impl PoolInner {
    pub(crate) fn new(id: u64, arena: Arena, env_ignored: u32) -> Result<PoolInner, i32> {
        let base = arena.base();
        let reserve = arena.window();
        // SAFETY: all-zero descriptors are UNUSED granules; all-zero heaps are unclaimed and
        // uninitialised. Descriptors point only at pool memory and heaps (never at a block of
        // the system allocator): the leak checker need not scan them.
        let pages = unsafe { MmapArray::zeroed_unscanned(reserve >> GRANULE_SHIFT)? };
        let heaps = Heaps::new()?;
        let table = PageTable {
            base,
            reserve,
            descs: pages.get(0).map_or(std::ptr::null(), |d| d as *const Page),
        };
        let idle = Idle::new(reserve / SLAB, arena.purge_delay(), arena.purge_thread())?;
        let spare = super::spare::Spare::new(reserve / SLAB, base / SLAB)?;
        Ok(PoolInner {
            quarantine: super::quarantine::Hook::default(),
            refill: crate::arena::prefetch::Refill::default(),
            id,
            arena,
            table,
            base,
            reserve,
            pages,
            free_pages: [const { List::new() }; PAGE_SIZES],
            carving: [const { ForkLock::new(()) }; PAGE_SIZES],
            cuts: [const { AtomicU32::new(0) }; PAGE_SIZES],
            large_free: [const { List::new() }; LARGE_LISTS + 1],
            heaps,
            large_live: AtomicUsize::new(0),
            large_cached: AtomicUsize::new(0),
            failed: AtomicU64::new(0),
            idle,
            spare,
            env_ignored,
        })
    }

    /// The head descriptor of the page or run holding `p`, if `p` is in the pool.
    pub(crate) fn page_of(&self, p: *const u8) -> Option<&Page> {
        self.table.page_of(p)
    }

    pub(super) fn desc(&self, addr: usize) -> &Page {
        self.pages
            .get((addr - self.base) >> GRANULE_SHIFT)
            .expect("arena addresses lie in the page table")
    }

    /// The free list of pages of `1 << shift` bytes.
    pub(super) fn page_list(&self, shift: u32) -> &List {
        &self.free_pages[(shift - GRANULE_SHIFT) as usize]
    }

    /// The free list for large runs of `len` bytes.
    pub(super) fn large_list(&self, len: usize) -> &List {
        &self.large_free[(len / SLAB).min(LARGE_LISTS)]
    }

    /// The free-page counter of the small-page slab holding `page` (`purge.rs`), for pages
    /// smaller than a slab.
    pub(super) fn small_free(&self, page: &Page) -> Option<&AtomicU32> {
        if u32::from(page.shift.load(R)) >= SLAB_SHIFT {
            return None;
        }
        self.idle
            .small_free
            .get((page.start.load(R) - self.base) >> SLAB_SHIFT)
    }

    /// An empty page for class `c`, owned by `heap`, which holds `held` pages of the class
    /// (the page is sized to that demand: `class.rs`): from the free list of its size
    /// (revived if it was purged), or carved from a fresh arena run.
    pub(crate) fn take_page(&self, c: usize, heap: *mut Heap, held: u32) -> Option<&Page> {
        let _inside = changing_hands();
        let shift = page_shift_for(c, held);
        let mut carver = None;
        let mut waited: Option<(std::time::Instant, u32)> = None;
        let i = (shift - GRANULE_SHIFT) as usize;
        let page = loop {
            // Read before the list is looked at: a carver that lists pages after the look
            // has changed it by the wait below, which then returns at once (no lost wake).
            let cuts = self.cuts[i].load(Ordering::SeqCst);
            let listed = self.page_list(shift).pop_if_then(
                |_| true,
                |p| {
                    if let Some(n) = self.small_free(p) {
                        n.fetch_sub(1, R);
                    }
                },
            );
            if let Some(p) = listed {
                if let Err(e) = self.reuse(p.start.load(R), 1 << shift, shift <= STEP_SHIFT) {
                    self.count_failure(&e);
                    self.list_page(p);
                    return None;
                }
                break p;
            }
            // Become the carver of this size, or sleep until the one there is has cut a slab
            // and look again. Not for a re-entrant allocation (it may come from inside the
            // carver: it cuts on its own, and the arena refuses it growth), and never without
            // bound (a thread that holds a NIC lock the carver needs, allocating through the
            // pool, would wait forever): past `CARVE_WAIT_NS` it cuts on its own, as before.
            if carver.is_none() && !crate::sys::provision::active() {
                if let Some(g) = self.carving[i].try_lock() {
                    carver = Some(Turn {
                        lock: Some(g),
                        turns: &self.cuts[i],
                    });
                    continue;
                }
                // The wait restarts whenever a carving turn of this size ended: only a carver
                // that makes no progress for `CARVE_WAIT_NS` is given up on. Asleep in the
                // kernel, not polling: on a few cores 600 waiters would starve the carver.
                let (t, seen) = *waited.get_or_insert_with(|| (std::time::Instant::now(), cuts));
                let t = if seen == cuts {
                    t
                } else {
                    waited = Some((std::time::Instant::now(), cuts));
                    std::time::Instant::now()
                };
                let left = CARVE_WAIT_NS.saturating_sub(t.elapsed().as_nanos());
                if left > 0 {
                    futex::wait(&self.cuts[i], cuts, left as u64);
                    continue;
                }
            }
            let cut = self.carve(shift);
            match carver.take() {
                Some(turn) => drop(turn),
                None => turn_ended(&self.cuts[i]),
            }
            break cut?;
        };
        drop(carver);
        let page = self.ready(page)?;
        // SAFETY: an empty page nobody uses.
        unsafe {
            memcheck::recycled(
                page.start.load(R) as *mut u8,
                1 << shift,
                page.fresh.load(R),
            )
        };
        page.init(c, heap);
        self.set_owner(page, heap);
        Some(page)
    }

    /// Put an empty page on the free list of its size; a slab whose pages are then all listed
    /// (or a page of a slab or more) becomes idle.
    pub(super) fn list_page(&self, page: &Page) {
        let shift = u32::from(page.shift.load(R));
        let slab = self.slab_of(page.start.load(R));
        // The idle stamp is written under the list's lock, with the count that makes the slab
        // whole: a purge scanning the list sees one stamp for all its pages (written after,
        // it could take some pages, leave the others listed and give the slab back).
        let stamped = self
            .page_list(shift)
            .push_then(page, |p| match self.small_free(p) {
                Some(n) if n.fetch_add(1, R) + 1 != 1 << (SLAB_SHIFT - shift) => None,
                _ => Some(self.idle.stamp_idle(slab)),
            });
        if let Some(now) = stamped {
            self.idle.due_after(now);
        }
    }

    /// Cut a fresh arena run into pages of `1 << shift` bytes; keep one, list the others.
    #[cold]
    fn carve(&self, shift: u32) -> Option<&Page> {
        let bytes = 1usize << shift;
        // Pages are shared by heaps that each touch a few of their blocks, and a heap's page
        // of large blocks (up to a whole slab of eight) touches what the program writes of
        // them: 4 KiB pages under all of them (`arena/commit.rs`); only large runs are dense.
        let (start, run_len, zero) = self.fresh_run(
            bytes.max(SLAB),
            bytes.max(SLAB),
            self.arena.page_backing(shift),
        )?;
        memcheck::unpoison(start as *mut u8, run_len);
        let granules = bytes >> GRANULE_SHIFT;
        let mut first = None;
        for at in (start..start + run_len).step_by(bytes) {
            let head = self.desc(at);
            for g in 1..granules {
                let t = self.desc(at + (g << GRANULE_SHIFT));
                t.back.store(g as u32, R);
                t.kind.store(TAIL, Ordering::Release);
            }
            head.start.store(at, R);
            head.shift.store(shift as u8, R);
            head.fresh.store(zero, R);
            head.kind.store(SMALL, Ordering::Release);
            match first {
                None => first = Some(head),
                Some(_) => {
                    self.page_list(shift).push_then(head, |p| {
                        if let Some(n) = self.small_free(p) {
                            n.fetch_add(1, R);
                        }
                    });
                }
            }
        }
        first
    }

    /// Record `heap` as the owner of `page` in its head and in every tail descriptor, so that
    /// a sized free finds the owner of any block with one load (`PageTable::owner_of`).
    ///
    /// The tails are written first and the head last (`SeqCst`): the head is what ownership
    /// changes compare and swap (`heap.rs`), so once another thread can claim the page, this
    /// call writes nothing more.
    pub(crate) fn set_owner(&self, page: &Page, heap: *mut Heap) {
        let start = page.start.load(R);
        let granules = 1usize << (u32::from(page.shift.load(R)) - GRANULE_SHIFT);
        for g in 1..granules {
            self.desc(start + (g << GRANULE_SHIFT))
                .heap
                .store(heap, Ordering::Release);
        }
        page.heap.store(heap, Ordering::SeqCst);
    }

    /// An empty page goes back to the list of its size: a page of a stepped slab stamps its
    /// step first (a pass that finds the page listed sees when its step may have become free)
    /// and asks for a pass after the push (`stepped.rs`).
    pub(crate) fn retire_page(&self, page: &Page) {
        let _inside = changing_hands();
        self.set_owner(page, null_mut());
        let stamp = self.stamp_step(page);
        self.list_page(page);
        if let Some(t) = stamp {
            self.listed_in_step(t);
        }
    }

    /// Walk the head descriptors of every carved page and run (statistics, teardown).
    pub(crate) fn for_each_head(&self, mut f: impl FnMut(&Page)) {
        let span = self.arena.span().min(self.reserve);
        let per_slab = 1usize << (SLAB_SHIFT - GRANULE_SHIFT);
        for s in 0..span >> SLAB_SHIFT {
            // Pages and runs are cut from slab-aligned runs: a slab whose first granule is
            // unused holds no head (the inside of a large run, or nothing carved).
            if self
                .pages
                .get(s * per_slab)
                .is_none_or(|d| d.kind.load(Ordering::Acquire) == UNUSED)
            {
                continue;
            }
            let mut i = s * per_slab;
            while i < (s + 1) * per_slab {
                let Some(d) = self.pages.get(i) else { break };
                let kind = d.kind.load(Ordering::Acquire);
                if kind != UNUSED && kind != TAIL {
                    f(d);
                }
                // A page's tails hold no head: skip them.
                let shift = u32::from(d.shift.load(R));
                i += if kind == SMALL && (GRANULE_SHIFT..=SLAB_SHIFT).contains(&shift) {
                    1 << (shift - GRANULE_SHIFT)
                } else {
                    1
                };
            }
        }
    }

    /// Blocks still handed out: small blocks not freed and large runs in use.
    pub(crate) fn live_blocks(&self) -> u64 {
        // No purge pass meanwhile: one collecting an exited thread's page between the reads
        // of its count and of its remote frees would count those as live.
        let _no_purge = self.idle.lock.lock();
        let cached: u64 = (0..super::tcache::CACHED_CLASSES)
            .map(|c| self.cached_in_heaps(c))
            .sum();
        let mut n = 0u64;
        self.for_each_head(|d| match d.kind.load(R) {
            SMALL => {
                n += (d.used.load(R) - d.thread_free_len().min(d.used.load(R))) as u64;
            }
            LARGE => n += 1,
            _ => {}
        });
        n.saturating_sub(cached)
    }

    /// Debug check of every page's invariant (at quiescence).
    pub(crate) fn validate(&self) -> bool {
        // No purge pass meanwhile (the clock's thread may run one): it takes pages out of
        // lists and gives descriptors of spare slabs back (zeroed) while it runs.
        let _no_purge = self.idle.lock.lock();
        let mut ok = true;
        self.for_each_head(|d| {
            if d.kind.load(R) == SMALL {
                let heap = d.heap.load(R);
                // SAFETY: a page's heap lives in the pool's heap array.
                if heap == super::heap::ABANDONED
                    || (super::heap::is_heap(heap) && !unsafe { &*heap }.orphaned())
                {
                    ok &= d.validate() && !(heap == super::heap::ABANDONED && d.in_full.load(R));
                }
                // Every tail names the head's owner.
                let start = d.start.load(R);
                let Some(g_shift) = u32::from(d.shift.load(R)).checked_sub(GRANULE_SHIFT) else {
                    ok = false;
                    return;
                };
                let granules = 1usize << g_shift;
                ok &= (1..granules).all(|g| {
                    self.desc(start + (g << GRANULE_SHIFT)).heap.load(R) == d.heap.load(R)
                });
            }
        });
        ok && self.arena.validate()
    }
}
