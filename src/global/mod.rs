//! [`GlobalPool`]: the pool as `#[global_allocator]`, so that every `Vec`, `Box` and `String`
//! of a program is NIC-registered memory that can be posted as-is.
//!
//! ```
//! #[global_allocator]
//! static A: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
//! # fn main() {
//! let v = vec![7u8; 4096];
//! let keys = rdma_pool::keys_of(v.as_ptr()).expect("every heap block is registered");
//! assert!(keys.contains(v.as_ptr() as usize, v.len()));
//! # }
//! ```
//!
//! Contract:
//! - **Lazy, thread-safe initialisation.** The first allocation (or [`GlobalPool::init`])
//!   opens the NIC ([`GlobalConfig::open`], else [`Nic::open_default`]), a PD and the arena,
//!   with the environment's overrides (`config.rs`). Other threads that allocate meanwhile wait
//!   for it (bounded: after [`INIT_WAIT`] they are served degraded rather than risk waiting on
//!   a thread the NIC layer itself waits for).
//! - **Re-entrancy.** Opening the NIC, registering and growing run inside the allocator and
//!   allocate in turn (handles, errors, the soft NIC's tables, `tracing`). The arena marks such
//!   code ([`crate::sys::provision`]) and refuses to grow under the mark, so there
//!   is no recursion into another registration. What is allocated under the mark is the NIC
//!   layer's bookkeeping, which lives as long as what it registers: the thread's heaps are
//!   hidden meanwhile (`alloc/tls.rs`) and it is served outside the pool — from the bootstrap
//!   region (`bootstrap.rs`), as is everything allocated while the pool initialises, then by the
//!   fallback; under [`Fallback::Mmap`] small blocks first from the pool's provisioning heap,
//!   which no thread owns (`alloc/heap/provisioning.rs`). Nothing waits on a lock the
//!   interrupted operation holds, so there is no deadlock. `dealloc` tells pool, bootstrap and system blocks apart by
//!   address. C code (libibverbs and its providers) allocates with libc
//!   `malloc`, which does not re-enter: that memory is not registered, and needs not be.
//! - **Never panic or abort.** When the pool cannot serve a request (initialisation failed, the
//!   arena cannot grow, every heap is taken) the request is served by the system allocator and
//!   counted ([`GlobalStats::degraded_allocations`]), or refused under [`OnFailure::Fail`]; so
//!   `GlobalAlloc` returns null only where the system allocator does. A panic inside
//!   initialisation is caught and becomes [`GlobalState::Failed`]. Why is counted per reason
//!   ([`GlobalStats::degraded_by`], [`DegradeReason`]) and logged once with `tracing` outside
//!   the allocation path: by the next method call that is not an allocation, or at exit
//!   (`exit_report.rs`).
//! - **Thread-locals** are const-initialised without destructors, and the exit hand-back of a
//!   thread's heap is a pthread key destructor (see `alloc/tls.rs`): allocation and free work
//!   while thread-locals are destroyed and after. Supported targets are those where std has
//!   native thread-local destructors (Linux with glibc or musl ≥ 1.2.3); on targets where std
//!   keeps its own destructor list, a global allocator that registers a TLS destructor makes std
//!   abort with "global allocator may not use TLS with destructors" — this crate registers
//!   none, but is built and tested on Linux only.
//! - **No NIC call on a fast path**: `alloc`/`dealloc` of a ready pool are [`Pool`]'s fast
//!   paths after one load of the state and one thread-local read.
//!
//! - **Initialisation runs under a provisioning mark** from the state transition to its
//!   publication, so everything it allocates (the NIC's handles, `tracing`) goes to the bootstrap
//!   region; [`GlobalPool::init`] called from inside it (say, by the opener) answers
//!   [`Error::Reentrant`] rather than wait for itself. With `panic = "abort"` a panic in the
//!   opener aborts; otherwise it is caught.
//!
//! Files: `init.rs` (initialisation and its publication), `paths.rs` (the paths of
//! `GlobalAlloc`), `sizeless.rs` (free, size and realloc without a layout), `lookup.rs`
//! ([`keys_of`], [`stats`] from anywhere), `config.rs`, `bootstrap.rs` (the region that serves
//! re-entrant allocations), `fallback.rs` (what the pool cannot serve), `stats.rs` and
//! `exit_report.rs`, `api2.rs` (allocator-api2), `grant.rs` and `prefetch.rs` (the pool's
//! features, reached through the global pool).
//!
//! Invariant (checked by [`GlobalPool::validate`]): `state == READY ⇒ slot` holds `Ok(Ready)`
//! and `hot` a copy of its pool handle (`hot.arena() == ready.pool.arena()`); `state == FAILED ⇒ slot` holds the
//! `Err`; the slot is written once, before the state is published with `Release`.

mod api2;
mod bootstrap;
mod config;
mod exit_report;
mod fallback;
mod grant;
mod init;
mod lookup;
mod paths;
mod prefetch;
mod sizeless;
mod stats;

pub use bootstrap::BYTES as BOOTSTRAP_BYTES;
pub use config::{GlobalConfig, OnFailure, Registration};
pub use fallback::Fallback;
use lookup::not_ready;
pub use lookup::{keys_of, keys_of_on, stats};
pub use stats::{DegradeReason, DegradedBy, GlobalState, GlobalStats};

use crate::Pool;
use crate::alloc::Core;
use crate::arena::{Error, Keys};
use crate::nic::{Nic, Pd, Sge};
use crate::sys::os::MmapBox;
use crate::sys::provision::{self, Provisioning};
use stats::Counters;
use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::{self, null_mut};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize};
use std::time::{Duration, Instant};

const UNINIT: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;

/// `fast_id` before the pool is ready: no pool has this id (ids count up from 1).
const NO_POOL: u64 = u64::MAX;
const FAILED: u8 = 3;

/// The smallest reservation a pool falls back to when the address space refuses its own
/// (see [`ArenaConfig::reserve`](crate::arena::ArenaConfig::reserve)).
pub const MIN_RESERVE: usize = 16 << 20;

/// How long a thread allocating during another thread's initialisation waits for it.
pub const INIT_WAIT: Duration = Duration::from_secs(2);

/// What a ready global pool holds: mapped from the kernel and never freed, so that
/// [`keys_of`] can use it from anywhere, even if the `GlobalPool` was not a `static`.
struct Ready {
    cfg: GlobalConfig,
    nic: Nic,
    pd: Pd,
    pool: Pool,
}

/// The first `GlobalPool` that became ready: what [`keys_of`] and [`stats`] consult.
static INSTANCE: AtomicPtr<Ready> = AtomicPtr::new(null_mut());

/// The state of the first `GlobalPool` that started initialising (for [`stats`]).
static FIRST_STATE: AtomicU8 = AtomicU8::new(UNINIT);
static FIRST_CLAIMED: AtomicBool = AtomicBool::new(false);

/// The counters of the first `GlobalPool` that started initialising (for [`stats`]).
static FIRST_COUNTERS: AtomicPtr<Counters> = AtomicPtr::new(null_mut());

/// Where counts go while a pool has no counters of its own (their mapping failed).
static ORPHAN: Counters = Counters::new();
/// What a pool without counters reads.
static ZERO: Counters = Counters::new();

/// A pool usable as `#[global_allocator]`; see the [module documentation](self).
///
/// Meant to live in a `static`. Its NIC, PD and arena are mapped for the rest of the process
/// once initialised (blocks it handed out may be live anywhere), so a `GlobalPool` that is
/// dropped leaves them registered rather than pull memory from under its users.
///
/// # Examples
/// ```
/// use rdma_pool::GlobalPool;
/// use std::alloc::{GlobalAlloc, Layout};
/// // Usually `#[global_allocator] static A: GlobalPool = GlobalPool::new();`; it can also be
/// // called directly.
/// static POOL: GlobalPool = GlobalPool::new();
/// let l = Layout::from_size_align(256, 64).unwrap();
/// // SAFETY: a non-zero-size layout; the block is freed with the same layout.
/// unsafe {
///     let p = POOL.alloc(l);
///     assert!(POOL.keys_of(p).is_some());
///     POOL.dealloc(p, l);
/// }
/// ```
pub struct GlobalPool {
    config: GlobalConfig,
    /// Built by [`GlobalPool::with_remote_rights`]: `config.remote` may hold rights.
    remote_rights: bool,
    state: AtomicU8,
    slot: UnsafeCell<MaybeUninit<Result<&'static Ready, Error>>>,
    /// A copy of the ready pool's handle (of `Ready::pool`, never dropped), kept here so that
    /// the fast paths read the pool's id and page table from this static, written before READY.
    hot: UnsafeCell<MaybeUninit<ManuallyDrop<Core>>>,
    /// The ready pool's reservation, `(0, 0)` before: `dealloc` tests `p - base < reserve`
    /// without loading the state (a reserve of 0 contains nothing — the empty sentinel).
    /// `reserve` is stored last, with `Release`, after `hot`.
    base: AtomicUsize,
    reserve: AtomicUsize,
    /// The ready pool's id, `NO_POOL` before: the allocation fast path looks this thread's
    /// heap up by it without loading the state (no heap is ever claimed in `NO_POOL`, so a
    /// hit means the pool is ready).
    fast_id: AtomicU64,
    /// This pool's counters, mapped (and never unmapped) on first use.
    counters: AtomicPtr<Counters>,
}

// SAFETY: the slot is written once by the thread that won the UNINIT → BUSY transition and
// read only after the state says it was published (`Acquire`/`Release`); `Ready` is `Send +
// Sync` (NIC handles and the pool are).
unsafe impl Sync for GlobalPool {}

impl Default for GlobalPool {
    fn default() -> Self {
        GlobalPool::new()
    }
}

impl std::fmt::Debug for GlobalPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalPool")
            .field("state", &self.state())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl GlobalPool {
    /// A global pool with the default configuration ([`GlobalConfig::DEFAULT`]); nothing
    /// happens until the first allocation.
    ///
    /// # Examples
    /// ```
    /// #[global_allocator]
    /// static A: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// # fn main() {}
    /// ```
    pub const fn new() -> GlobalPool {
        GlobalPool::with_config(GlobalConfig::DEFAULT)
    }

    /// A global pool configured by `config` (the environment may still override parts of it,
    /// see [`GlobalConfig`]).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::global::{GlobalConfig, GlobalPool, Registration};
    /// static A: GlobalPool = GlobalPool::with_config(GlobalConfig {
    ///     arena: rdma_pool::ArenaConfig {
    ///         registration: Registration::Pinned,
    ///         ..GlobalConfig::DEFAULT.arena
    ///     },
    ///     ..GlobalConfig::DEFAULT
    /// });
    /// assert_eq!(A.config().arena.registration, Registration::Pinned);
    /// ```
    pub const fn with_config(config: GlobalConfig) -> GlobalPool {
        GlobalPool {
            config,
            remote_rights: false,
            state: AtomicU8::new(UNINIT),
            slot: UnsafeCell::new(MaybeUninit::uninit()),
            hot: UnsafeCell::new(MaybeUninit::uninit()),
            base: AtomicUsize::new(0),
            reserve: AtomicUsize::new(0),
            fast_id: AtomicU64::new(NO_POOL),
            counters: AtomicPtr::new(null_mut()),
        }
    }

    /// A global pool configured by `config`, whose `remote` may hold rights
    /// ([`GlobalPool::with_config`] refuses them at initialisation).
    ///
    /// # Safety
    /// As [`Pool::with_remote_rights`]: whoever holds the pool's rkey may read (and with
    /// write rights, write) any heap memory of the program at any time, freed or live, so
    /// every peer given it must be trusted to touch only what and when the program's protocol
    /// lets it, and the program must read such memory only once that protocol says a write
    /// completed.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::global::{GlobalConfig, GlobalPool};
    /// use rdma_pool::nic::Access;
    /// // SAFETY: the peers of this program are trusted and synchronised by its protocol.
    /// static A: GlobalPool = unsafe {
    ///     GlobalPool::with_remote_rights(GlobalConfig {
    ///         arena: rdma_pool::ArenaConfig { remote: Access::REMOTE_WRITE, ..GlobalConfig::DEFAULT.arena },
    ///         ..GlobalConfig::DEFAULT
    ///     })
    /// };
    /// ```
    pub const unsafe fn with_remote_rights(config: GlobalConfig) -> GlobalPool {
        let mut pool = GlobalPool::with_config(config);
        pool.remote_rights = true;
        pool
    }

    /// The configuration given at construction (before environment overrides).
    pub fn config(&self) -> &GlobalConfig {
        &self.config
    }

    /// Where the pool is in its life.
    pub fn state(&self) -> GlobalState {
        match self.state.load(Acquire) {
            UNINIT => GlobalState::Uninitialised,
            BUSY => GlobalState::Initialising,
            READY => GlobalState::Ready,
            _ => GlobalState::Failed,
        }
    }

    /// This pool's counters, mapped on first use (`ORPHAN` if that mapping fails).
    #[inline]
    fn counters(&self) -> &'static Counters {
        let p = self.counters.load(Acquire);
        if p.is_null() {
            return self.map_counters();
        }
        // SAFETY: a non-null pointer is a `&'static Counters` (mapped, never unmapped).
        unsafe { &*p }
    }

    #[cold]
    #[inline(never)]
    fn map_counters(&self) -> &'static Counters {
        let Ok(mapped) = MmapBox::new(Counters::new()) else {
            return &ORPHAN;
        };
        let fresh = &*mapped as *const Counters as *mut Counters;
        match self
            .counters
            .compare_exchange(null_mut(), fresh, AcqRel, Acquire)
        {
            Ok(_) => mapped.into_static(),
            Err(theirs) => {
                drop(mapped);
                // SAFETY: published by the winner: a `&'static Counters`.
                unsafe { &*theirs }
            }
        }
    }

    /// The published slot, if any.
    #[inline(always)]
    fn slot(&self) -> Option<&Result<&'static Ready, Error>> {
        if self.state.load(Acquire) >= READY {
            // SAFETY: READY and FAILED are published after the slot was written, once.
            Some(unsafe { (*self.slot.get()).assume_init_ref() })
        } else {
            None
        }
    }

    /// The pool, when ready (never initialises): a load of the state and of the slot.
    #[inline(always)]
    fn ready(&self) -> Option<&Pool> {
        match self.slot() {
            Some(Ok(r)) => Some(&r.pool),
            _ => None,
        }
    }

    /// The pool's core, when ready (never initialises): the copy kept in this static, one
    /// load of the state (what the allocation paths and key lookups use).
    #[inline(always)]
    fn hot(&self) -> Option<&Core> {
        if self.state.load(Acquire) == READY {
            // SAFETY: `hot` is written before READY is published, and never again.
            Some(unsafe { (*self.hot.get()).assume_init_ref() })
        } else {
            None
        }
    }

    /// Initialise now (if no allocation did yet) and return the pool: call it at start-up to
    /// open the NIC before threads are spawned, and to learn why it failed.
    ///
    /// # Errors
    /// Why initialisation failed: the NIC could not be opened, the configuration was refused,
    /// or the arena could not be created. The pool then degrades (or fails) as configured.
    ///
    /// # Examples
    /// ```
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// let pool = POOL.init().expect("the soft NIC is always there");
    /// assert!(pool.stats().alloc.arena.reserved_bytes > 0);
    /// ```
    pub fn init(&self) -> Result<&Pool, &Error> {
        let r = self.published(None).map(|r| &r.pool);
        self.report();
        r
    }

    /// Log a degradation not reported yet, once (see `stats.rs`): called by the methods that
    /// are not allocations, never under a provisioning mark.
    fn report(&self) {
        let p = self.counters.load(Acquire);
        if p.is_null() || provision::active() {
            return;
        }
        // SAFETY: a non-null pointer is a `&'static Counters`.
        let counters = unsafe { &*p };
        let error = self.slot().and_then(|s| s.as_ref().err());
        counters.report(error.map(|e| e as &dyn std::fmt::Display));
    }

    /// The pool, if it is ready and `p` lies in its reservation: two loads and a compare, no
    /// load of the state.
    #[inline(always)]
    fn owner_of(&self, p: *const u8) -> Option<&Core> {
        let reserve = self.reserve.load(Acquire);
        let base = self.base.load(Relaxed);
        if (p as usize).wrapping_sub(base) < reserve {
            // SAFETY: a non-zero `reserve` was published (Release) after `hot` was written.
            Some(unsafe { (*self.hot.get()).assume_init_ref() })
        } else {
            None
        }
    }

    /// Check the invariants of the module contract, of the bootstrap region and of the pool
    /// itself (at quiescence; for tests).
    ///
    /// # Examples
    /// ```
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// assert!(POOL.validate());
    /// POOL.init().unwrap();
    /// assert!(POOL.validate());
    /// ```
    pub fn validate(&self) -> bool {
        let ok = match (self.slot(), self.hot()) {
            (Some(Ok(r)), Some(hot)) => {
                std::ptr::eq(hot.arena(), r.pool.arena()) && r.pool.validate()
            }
            (Some(Err(_)), None) => true,
            (None, None) => matches!(
                self.state(),
                GlobalState::Uninitialised | GlobalState::Initialising
            ),
            _ => false,
        };
        ok && bootstrap::validate()
    }

    /// The configuration in force once the pool is ready: [`GlobalPool::config`] with the
    /// environment's overrides applied.
    pub fn effective_config(&self) -> Option<GlobalConfig> {
        match self.slot() {
            Some(Ok(r)) => Some(r.cfg),
            _ => None,
        }
    }

    /// Why initialisation failed, once it has.
    pub fn init_error(&self) -> Option<&Error> {
        self.report();
        self.slot().and_then(|s| s.as_ref().err())
    }

    /// The pool, once ready (initialising it if needed).
    ///
    /// # Errors
    /// As [`GlobalPool::init`].
    pub fn pool(&self) -> Result<&Pool, &Error> {
        self.init()
    }

    /// The NIC the pool registers with: create CQs on it.
    ///
    /// # Errors
    /// As [`GlobalPool::init`].
    ///
    /// # Examples
    /// ```
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// let nic = POOL.nic().unwrap();
    /// let cq = nic.create_cq(16).unwrap();
    /// # drop(cq);
    /// ```
    pub fn nic(&self) -> Result<&Nic, &Error> {
        let r = self.published(None).map(|r| &r.nic);
        self.report();
        r
    }

    /// The protection domain of the pool's registrations: create QPs on it, so that the
    /// pool's lkeys are valid for them.
    ///
    /// # Errors
    /// As [`GlobalPool::init`].
    pub fn pd(&self) -> Result<&Pd, &Error> {
        let r = self.published(None).map(|r| &r.pd);
        self.report();
        r
    }

    /// The keys of the registration covering `p`, if the pool handed it out (bootstrap and
    /// degraded blocks have none).
    #[inline]
    pub fn keys_of(&self, p: *const u8) -> Option<Keys> {
        self.hot()?.keys_of(p)
    }

    /// The keys of the registration covering `p` on `nic`: the pool's own device, or one it
    /// was attached to with [`GlobalPool::attach`].
    #[inline]
    pub fn keys_of_on(&self, p: *const u8, nic: &crate::nic::Nic) -> Option<Keys> {
        self.hot()?.keys_of_on(p, nic)
    }

    /// Register every heap block of the program on `pd` too (a second rail): see
    /// [`Pool::attach`](crate::alloc::Core::attach).
    ///
    /// # Errors
    /// Why initialisation failed, or as [`Pool::attach`](crate::alloc::Core::attach).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::Nic;
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// let rail1 = Nic::soft();
    /// POOL.attach(&rail1.alloc_pd()?)?;
    /// let l = std::alloc::Layout::new::<[u8; 64]>();
    /// // SAFETY: a non-zero-size layout, freed with the same one.
    /// unsafe {
    ///     let p = std::alloc::GlobalAlloc::alloc(&POOL, l);
    ///     assert!(POOL.keys_of_on(p, &rail1).is_some());
    ///     std::alloc::GlobalAlloc::dealloc(&POOL, p, l);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn attach(&self, pd: &Pd) -> Result<usize, Error> {
        self.init().map_err(|_| not_ready())?.attach(pd)
    }

    /// Deregister the pool from `pd` (see [`Pool::detach`]).
    ///
    /// # Errors
    /// Why initialisation failed, or as [`Pool::detach`].
    pub fn detach(&self, pd: &Pd) -> Result<(), Error> {
        self.init().map_err(|_| not_ready())?.detach(pd)
    }

    /// One SGE (with its lkey) for `buf`, a slice of memory the pool handed out.
    ///
    /// # Errors
    /// [`Error::NotRegistered`] when `buf` is not wholly inside one registration of the pool
    /// (a bootstrap or degraded block, the stack), or why initialisation failed.
    ///
    /// # Examples
    /// ```
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// assert!(matches!(POOL.sge_of(&[1u8, 2, 3]), Err(rdma_pool::arena::Error::NotRegistered)));
    /// ```
    pub fn sge_of(&self, buf: &[u8]) -> Result<Sge, Error> {
        match self.init() {
            Ok(pool) => pool.sge_of(buf),
            Err(_) => Err(Error::NotRegistered),
        }
    }

    /// Return every idle slab of the pool to the system now (see [`Pool::purge`](crate::alloc::Core::purge)); 0 before
    /// the pool is ready. Purging also happens on its own after
    /// [`ArenaConfig::purge_delay`](crate::arena::ArenaConfig::purge_delay).
    ///
    /// # Examples
    /// ```
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// let _ = POOL.purge();
    /// ```
    pub fn purge(&self) -> usize {
        self.hot().map_or(0, |p| p.purge())
    }

    /// A snapshot of the statistics (no lock, no allocation). The bootstrap region's figures
    /// are process-wide (one region serves every pool); the rest are this pool's.
    pub fn stats(&self) -> GlobalStats {
        self.report();
        let p = self.counters.load(Acquire);
        // SAFETY: a non-null pointer is a `&'static Counters`.
        let counters = if p.is_null() { &ZERO } else { unsafe { &*p } };
        counters.snapshot(self.state(), self.hot().map(|p| p.stats()))
    }
}
