//! The allocator core: size classes, per-thread heaps with a few-instruction fast path,
//! lock-free cross-thread frees, and [`Core`], whose every byte is NIC-registered memory of an
//! [`Arena`].
//!
//! Contract:
//! - blocks up to [`MAX_SMALL`] (1 MiB, and aligned up to 1 MiB) come from pages of one size
//!   class owned by a thread's heap, carved from arena runs (pages of 4 KiB to one 2 MiB slab,
//!   at least one block each); larger ones are whole slab runs; either way a block never
//!   straddles two registrations, so `keys_of(ptr)` describes it whole;
//! - same-thread `alloc`/`free` touch only the thread's heap and the page, with plain loads and
//!   stores; a free from another thread is one CAS onto the page's `thread_free`, collected by
//!   the owner; the pages of an exiting thread are handed back (`tls.rs`);
//! - no NIC call and no lock on the fast paths; the arena grows (registering) only when a heap
//!   needs a fresh page or a large run is not cached;
//! - the core's metadata is mapped from the kernel, never taken from the global allocator.
//!
//! Layout of the module: `mod.rs` (the `Core` handle and allocation), `free.rs` (freeing),
//! `resize.rs` (resizing, block sizes), `class.rs` (size classes), `page.rs` (pages and their
//! free lists), `heap.rs` (per-thread heaps: the fast paths; `heap/remote.rs`, frees from other
//! threads; `heap/unowned.rs`, heaps their threads left), `heaps.rs` (claiming them), `tcache.rs` (their caches of freed blocks), `pool.rs`
//! (shared slow paths; `pool/large.rs`, large runs), `spare.rs`, `purge.rs` (the purge policy), `purger.rs` (its clock thread), `tls.rs` (thread
//! caches), `rails.rs`, `checked.rs`, `memcheck.rs` (memory-checker mode), `nicbuf.rs`,
//! `stats.rs`, `quarantine.rs` (the hook through which a feature parks a freed block), `api2.rs`
//! (the one allocator-api2 adapter).

pub(crate) mod api2;
mod checked;
mod class;
mod free;
mod heap;
mod heaps;
mod memcheck;
mod nicbuf;
mod page;
mod pool;
mod purge;
mod purger;
mod quarantine;
mod rails;
mod resize;
mod spare;
mod stats;
mod stepped;
mod sweep;
mod tcache;
mod tls;

pub use checked::FreeError;
pub use class::{CLASSES, MAX_SMALL, class_size};
pub use memcheck::{LARGE_GUARD, MemcheckStats, memcheck_stats};
// The memory checker's patterns and its ASan query: documented where it is built in.
#[cfg_attr(not(feature = "memcheck"), doc(hidden))]
pub use memcheck::{FILL_MAX, FREED, GUARD_FILL, asan_poisoned};
pub(crate) use quarantine::Quarantine;
pub use stats::{ClassStats, PoolStats};
pub(crate) use tls::{any_live_pool, keys_of_any, keys_of_any_on};

use crate::arena::{Arena, ArenaConfig, Error, Keys, SLAB};
use crate::nic::{Pd, Sge};
use crate::sys::os::MmapBox;
use class::{TABLE_MAX, class_for, class_of, small_class};
use heap::Heap;
use page::{LARGE, Page, SMALL, UNUSED};
use pool::{PageTable, PoolInner};
use std::alloc::Layout;
use std::mem::ManuallyDrop;
use std::ptr::null_mut;
use std::sync::atomic::Ordering::Relaxed;

/// Largest size freed straight into a thread cache by `free_sized`.
const CACHED_MAX: usize = class_size(tcache::CACHED_CLASSES - 1);

/// Largest alignment served from size-class pages: a block of a class that is a multiple of
/// the alignment, so an over-aligned small block costs about its alignment, not a slab.
pub(crate) const MAX_SMALL_ALIGN: usize = MAX_SMALL;

/// The allocator core of a [`Pool`](crate::Pool): NIC-registered blocks from size-class
/// pages and large runs of one [`Arena`], through per-thread heaps. Every method here is
/// reached through a `Pool` (which dereferences to its core); the features (grants, queue
/// memory) live beside it in the `Pool`, and reach the free path through its quarantine hook
/// (`quarantine.rs`).
///
/// Dropping a core while blocks it handed out are still live does **not** unmap them: it then
/// leaves its arena mapped and registered for the rest of the process (and says so in a
/// `tracing` warning), so those blocks stay valid memory; without live blocks, dropping
/// deregisters every region and unmaps the arena.
pub struct Core {
    /// Copies of the hot fields of `inner` (its id and page table): one load less per call.
    pub(crate) id: u64,
    table: PageTable,
    inner: ManuallyDrop<MmapBox<PoolInner>>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("arena", &self.inner().arena)
            .finish_non_exhaustive()
    }
}

impl Core {
    /// A core over a fresh arena configured by `cfg`, with the environment's `RDMA_POOL_*`
    /// overrides applied (see [`ArenaConfig::with_env`]).
    ///
    /// # Errors
    /// As [`Arena::new`]; [`Error::Config`] when 256 pools are already alive.
    pub(crate) fn with_config(pd: &Pd, cfg: ArenaConfig) -> Result<Core, Error> {
        let (cfg, ignored) = cfg.with_env_counted();
        Core::from_arena(Arena::new(pd, cfg)?, ignored)
    }

    /// [`Core::with_config`] with remote rights on the pool's own regions (`cfg.remote`).
    ///
    /// # Safety
    /// As [`Arena::with_remote_rights`].
    ///
    /// # Errors
    /// As [`Core::with_config`].
    pub(crate) unsafe fn with_remote_rights(pd: &Pd, cfg: ArenaConfig) -> Result<Core, Error> {
        let (cfg, ignored) = cfg.with_env_counted();
        // SAFETY: forwarded from the caller.
        Core::from_arena(unsafe { Arena::with_remote_rights(pd, cfg) }?, ignored)
    }

    /// A pool over `arena`; `env_ignored` environment variables had values it did not know.
    fn from_arena(arena: Arena, env_ignored: u32) -> Result<Core, Error> {
        let id = tls::next_id();
        let inner = PoolInner::new(id, arena, env_ignored).map_err(|errno| Error::Os {
            what: "mmap of pool metadata",
            errno,
        })?;
        let inner = MmapBox::new(inner).map_err(|(_, errno)| Error::Os {
            what: "mmap of pool metadata",
            errno,
        })?;
        if !tls::register(id, &*inner) {
            return Err(Error::Config("too many pools alive (256)"));
        }
        Ok(Core {
            id,
            table: inner.table,
            inner: ManuallyDrop::new(inner),
        })
    }

    /// A handle to the pool whose shared state is `inner`, never dropped.
    ///
    /// # Safety
    /// The pool stays alive while the alias is used (e.g. under the registry lock).
    pub(crate) unsafe fn alias_of(inner: &PoolInner) -> ManuallyDrop<Core> {
        ManuallyDrop::new(Core {
            id: inner.id,
            table: inner.table,
            // SAFETY: `inner` is the value of the pool's live box (the caller's contract).
            inner: unsafe { MmapBox::alias(inner) },
        })
    }

    #[inline(always)]
    pub(crate) fn inner(&self) -> &PoolInner {
        &self.inner
    }

    /// Allocate a block for `layout`: NIC-registered, never straddling two registrations.
    /// Null when the arena cannot grow (reservation, memlock limit, device limits) or when more
    /// than 65,536 threads use the pool at once: see [`PoolStats::failed_allocations`].
    ///
    /// # Examples
    /// ```
    /// use std::alloc::Layout;
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd().unwrap();
    /// # let pool = rdma_pool::Pool::new(&pd).unwrap();
    /// let p = pool.alloc(Layout::from_size_align(100, 64).unwrap());
    /// assert!(!p.is_null() && p as usize % 64 == 0);
    /// assert!(pool.usable_size(p).unwrap() >= 100);
    /// // SAFETY: `p` came from this pool.
    /// unsafe { pool.free(p) };
    /// ```
    #[inline(always)]
    pub fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = self.alloc_fast(layout);
        if !p.is_null() {
            return p;
        }
        self.alloc_outlined(layout)
    }

    /// The fast path alone (a small block from this thread's cache or current page, nothing
    /// called); null when it cannot serve `layout` — then [`Core::alloc`]'s slow path, taken
    /// as the caller's last call. Always null in memory-checker mode (its bookkeeping is on
    /// the slow path).
    #[inline(always)]
    pub(crate) fn alloc_fast(&self, layout: Layout) -> *mut u8 {
        Core::alloc_fast_in(self.id, layout)
    }

    /// [`Core::alloc_fast`] of the pool with id `id` (any id: null when this thread has no
    /// heap with it), for a front end that keeps the id beside its own state. Sizes up to the
    /// class table's 1 KiB only: a front end's slow path tries [`Core::alloc_fast_mid`] first.
    #[inline(always)]
    pub(crate) fn alloc_fast_in(id: u64, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        if !cfg!(feature = "memcheck") && align <= 8 && size <= TABLE_MAX {
            // The first allocation of a thread claims its heap in the slow path.
            if let Some(heap) = tls::heap_in(id) {
                // SAFETY: a heap this thread owns; a class up to `TABLE_MAX` is cached.
                return unsafe { heap.as_ref().alloc_cached(small_class(size)) };
            }
        }
        null_mut()
    }

    /// Whether this thread has a heap of pool `id` in view: false before its first allocation
    /// there, and while it provisions (its heaps are hidden then: `tls.rs`). One thread-local
    /// read of the ways, the fast paths' own.
    #[inline(always)]
    pub(crate) fn heap_in_view(id: u64) -> bool {
        tls::heap_in(id).is_some()
    }

    /// The fast path of the sizes [`Core::alloc_fast_in`] leaves (above the class table's
    /// 1 KiB, up to [`MAX_SMALL`]), for the slow paths to try first; null when it cannot serve
    /// `layout`.
    #[inline(always)]
    pub(crate) fn alloc_fast_mid(id: u64, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        if !cfg!(feature = "memcheck") && align <= 8 && size <= MAX_SMALL {
            // The first allocation of a thread claims its heap in the slow path.
            if let Some(heap) = tls::heap_in(id) {
                // SAFETY: a heap this thread owns.
                return unsafe { heap.as_ref() }.alloc_fast(class_of(size));
            }
        }
        null_mut()
    }

    /// [`Core::alloc`] past its fast path (with memory-checker mode's bookkeeping).
    #[inline(never)]
    fn alloc_outlined(&self, layout: Layout) -> *mut u8 {
        let p = Core::alloc_fast_mid(self.id, layout);
        if !p.is_null() {
            return p;
        }
        let p = self.alloc_slow(layout, false);
        if cfg!(feature = "memcheck") {
            self.memcheck_out(p);
        }
        p
    }

    /// [`Core::alloc`], zero-filled (fresh pages are not touched twice).
    pub fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = self.alloc_slow(layout, true);
        if cfg!(feature = "memcheck") {
            self.memcheck_out(p);
        }
        p
    }

    /// [`Core::alloc`] or [`Core::alloc_zeroed`], as `zero` says.
    #[inline(always)]
    pub(crate) fn alloc_with(&self, layout: Layout, zero: bool) -> *mut u8 {
        if zero {
            self.alloc_zeroed(layout)
        } else {
            self.alloc(layout)
        }
    }

    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout, zero: bool) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        let inner = self.inner();
        let class = (align <= MAX_SMALL_ALIGN)
            .then(|| class_for(size, align))
            .flatten();
        if let Some(c) = class {
            let heap = tls::heap_for(self.id, inner);
            if !heap.is_null() {
                // SAFETY: a heap this thread owns.
                let heap = unsafe { &*heap };
                return if zero {
                    heap.alloc_zeroed(c, size)
                } else {
                    heap.alloc(c)
                };
            }
            if crate::sys::provision::active() {
                // This thread calls the NIC (its heap is hidden meanwhile): the pool's
                // provisioning heap (`heap/provisioning.rs`); a global allocator serves what
                // that heap cannot elsewhere, so a null here is no failure of the pool.
                return self.alloc_provisioning(layout, zero);
            }
            // Every heap of the pool is taken by other threads.
            inner.failed.fetch_add(1, Relaxed);
            return null_mut();
        }
        inner.alloc_large(size.max(1), align, zero)
    }

    /// True when `p` lies in this pool's reservation (one subtraction and a compare; says
    /// nothing about whether a block starts there).
    ///
    /// # Examples
    /// ```
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd().unwrap();
    /// # let pool = rdma_pool::Pool::new(&pd).unwrap();
    /// let p = pool.alloc(std::alloc::Layout::new::<u64>());
    /// assert!(pool.contains(p) && !pool.contains(&0u8));
    /// # unsafe { pool.free(p) };
    /// ```
    #[inline(always)]
    pub fn contains(&self, p: *const u8) -> bool {
        self.table.contains(p)
    }

    /// `(base, window)` of the address space the pool's arena holds (every reservation it may
    /// add): [`Core::contains`] is `p - base < window`.
    pub(crate) fn span(&self) -> (usize, usize) {
        self.table.span()
    }

    /// A bitwise copy of this handle that is never dropped: for a front end that keeps the hot
    /// fields (id, page table) next to its own state, one indirection closer.
    ///
    /// # Safety
    /// The copy must not be used after `self` is dropped, and must never be dropped itself.
    pub(crate) unsafe fn alias(&self) -> ManuallyDrop<Core> {
        // SAFETY: `Core` is a handle (an id, a copy of the page table, a pointer); the caller
        // keeps the original alive and never drops the copy, so `inner` is dropped once.
        ManuallyDrop::new(unsafe { std::ptr::read(self) })
    }

    /// The granule counter of open grants for blocks starting at `block` (in the pool).
    pub(crate) fn granted_flag(&self, block: usize) -> &std::sync::atomic::AtomicU32 {
        &self.inner().desc(block).granted
    }

    /// The keys of the registration covering `p` (see [`Arena::keys_of`]).
    #[inline]
    pub fn keys_of(&self, p: *const u8) -> Option<Keys> {
        self.inner().arena.keys_of(p)
    }

    /// One SGE for `buf` (see [`Arena::sge_of`]).
    ///
    /// # Errors
    /// As [`Arena::sge_of`].
    pub fn sge_of(&self, buf: &[u8]) -> Result<Sge, Error> {
        self.inner().arena.sge_of(buf)
    }

    /// The NUMA node the memory at `p` was bound to (see [`Arena::chunk_node`]): `None` for a
    /// pointer outside the pool or memory the pool did not bind
    /// ([`ArenaConfig::numa`](crate::arena::ArenaConfig::numa)).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::Pool;
    /// use rdma_pool::arena::{ArenaConfig, Hugepages, NumaPolicy};
    /// let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// let cfg = ArenaConfig { reserve: 1 << 32, hugepages: Hugepages::Off, numa: NumaPolicy::Node(0), ..Default::default() };
    /// let pool = Pool::with_config(&pd, cfg)?;
    /// let v = allocator_api2::vec![in &pool; 0u8; 1000];
    /// assert_eq!(pool.node_of(v.as_ptr()), Some(0));
    /// assert_eq!(pool.node_of(&0u8), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn node_of(&self, p: *const u8) -> Option<u32> {
        self.inner().arena.chunk_node(p)
    }

    /// The arena the pool allocates from.
    pub fn arena(&self) -> &Arena {
        &self.inner().arena
    }

    /// The PD every region of the pool is registered in (the one the pool was built on, e.g.
    /// an application's PD adopted with [`Pd::from_raw`]): create the QPs that post pool
    /// buffers in it.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::Pool;
    /// let app_pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// let pool = Pool::new(&app_pd)?;
    /// assert_eq!(pool.pd().as_raw(), app_pd.as_raw());
    /// let cq = pool.nic().create_cq(16)?;
    /// # let _ = cq;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pd(&self) -> &Pd {
        self.inner().arena.pd()
    }

    /// The NIC of [`Core::pd`].
    pub fn nic(&self) -> &crate::nic::Nic {
        self.pd().nic()
    }

    /// Return every idle slab to the system now, whatever the purge delay: freed large runs,
    /// empty pages (see the arena's purge contract: pinned memory
    /// leaves its registration first; a registration shared with live memory whose keys were
    /// handed out keeps its slabs). Returns the bytes purged. Reusing purged memory commits
    /// (and registers) it again.
    ///
    /// The calling thread's cached blocks go back first. Every other thread using the pool is
    /// asked to give back its cached blocks and empty pages at its next free or allocation
    /// slow path (`trims_requested`/`trims` in the stats); what they give back then goes after
    /// the purge delay, or at the next `purge()`. Another thread's cache is never touched from
    /// here: its fast paths take no lock.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::Pool;
    /// use std::alloc::Layout;
    /// let pool = Pool::new(&rdma_pool::nic::Nic::soft().alloc_pd()?)?;
    /// let layout = Layout::from_size_align(8 << 20, 4096)?;
    /// let p = pool.alloc(layout);
    /// // SAFETY: `p` came from this pool with this layout.
    /// unsafe { pool.free_sized(p, layout) };
    /// let purged = pool.purge(); // the run (and, under `memcheck`, its guard slab)
    /// assert!(purged >= 8 << 20);
    /// assert_eq!(pool.stats().alloc.arena.purged_bytes, purged as u64);
    /// let q = pool.alloc(layout); // the same run, committed and registered again
    /// assert_eq!(q, p);
    /// assert!(pool.keys_of(q).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn purge(&self) -> usize {
        let heap = tls::heap_of(self.id);
        // Other threads give their cached blocks and empty pages back at their next call.
        self.inner()
            .request_trims(Some(heap.cast_const()), purge::now_ns());
        if !heap.is_null() {
            // SAFETY: this thread's heap in this pool.
            unsafe { (*heap).flush_all() };
        }
        self.inner().purge_idle(true)
    }

    /// Statistics per size class and totals, read without a lock (the `alloc` branch of
    /// [`Pool::stats`](crate::Pool::stats)).
    pub(crate) fn stats(&self) -> PoolStats {
        self.inner().stats()
    }

    /// Check the invariants of every page and of the arena (at quiescence; the core's part
    /// of [`Pool::validate`](crate::Pool::validate)).
    pub(crate) fn validate(&self) -> bool {
        self.inner().validate()
    }

    /// Blocks handed out and not freed (at quiescence).
    pub fn live_blocks(&self) -> u64 {
        self.inner().live_blocks()
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // The refill thread reaches the arena: it stops before the arena can go.
        self.stop_refill();
        // SAFETY: `inner` is taken once, here, and the pool is not used afterwards.
        let inner = unsafe { ManuallyDrop::take(&mut self.inner) };
        tls::unregister(inner.id);
        // The purge clock may be inside this pool since before the unregistration.
        inner.idle.wait_for_clock();
        tls::forget(&inner);
        let live = inner.live_blocks();
        if live > 0 {
            tracing::warn!(
                live,
                "rdma_pool: Core dropped with live blocks; its memory stays mapped and registered"
            );
            inner.leak();
        }
    }
}
