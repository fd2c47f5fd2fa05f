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
//!   is no recursion into another registration; an allocation under the mark is served by the
//!   pool when it can do so without growing (its fast paths hold no lock and no half-updated
//!   state across a NIC call), else from the bootstrap region (`bootstrap.rs`), as is everything
//!   allocated while the pool initialises; nothing waits on a lock the interrupted operation
//!   holds, so there is no deadlock. `dealloc` tells pool, bootstrap and system blocks apart by
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
//! Invariant (checked by [`GlobalPool::validate`]): `state == READY ⇒ slot` holds `Ok(Ready)`
//! and `hot` a copy of its pool handle (`hot.arena() == ready.pool.arena()`); `state == FAILED ⇒ slot` holds the
//! `Err`; the slot is written once, before the state is published with `Release`.

mod api2;
mod bootstrap;
mod config;
mod exit_report;
mod fallback;
mod grant;
mod prefetch;
mod stats;

pub use bootstrap::BYTES as BOOTSTRAP_BYTES;
pub use config::{GlobalConfig, OnFailure, Registration};
pub use fallback::Fallback;
pub use stats::{DegradeReason, DegradedBy, GlobalState, GlobalStats};

use crate::alloc::Pool;
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

/// What [`GlobalPool::init`] answers when called from inside the pool's own initialisation.
static REENTRANT: Error = Error::Reentrant;

thread_local! {
    /// The `GlobalPool` this thread is initialising (its address), 0 for none.
    static INIT_OWNER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as the one initialising a pool, until dropped.
struct InitOwner(usize);

impl InitOwner {
    fn enter(pool: &GlobalPool) -> InitOwner {
        let prev = INIT_OWNER
            .try_with(|o| o.replace(pool as *const GlobalPool as usize))
            .unwrap_or(0);
        InitOwner(prev)
    }

    fn is(pool: &GlobalPool) -> bool {
        INIT_OWNER
            .try_with(|o| o.get() == pool as *const GlobalPool as usize)
            .unwrap_or(false)
    }
}

impl Drop for InitOwner {
    fn drop(&mut self) {
        let _ = INIT_OWNER.try_with(|o| o.set(self.0));
    }
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
    hot: UnsafeCell<MaybeUninit<ManuallyDrop<Pool>>>,
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

    /// The pool, when ready (never initialises): one load of the state.
    #[inline(always)]
    fn ready(&self) -> Option<&Pool> {
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
    /// assert!(pool.stats().arena.reserved_bytes > 0);
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

    /// The published initialisation, initialising first if nobody did: waits for another
    /// initialising thread (up to `limit`, if given: then `Err(Reentrant)` too), and answers
    /// `Err(Reentrant)` at once when called from inside this pool's own initialisation.
    fn published(&self, limit: Option<Duration>) -> Result<&'static Ready, &Error> {
        let start = Instant::now();
        loop {
            if let Some(slot) = self.slot() {
                return slot.as_ref().map(|r| *r);
            }
            if InitOwner::is(self) {
                // Called from inside this pool's own initialisation (say, by the opener).
                return Err(&REENTRANT);
            }
            if !self.try_init() {
                if limit.is_some_and(|l| start.elapsed() > l) {
                    return Err(&REENTRANT);
                }
                std::thread::yield_now();
            }
        }
    }

    /// The pool, if it is ready and `p` lies in its reservation: two loads and a compare, no
    /// load of the state.
    #[inline(always)]
    fn owner_of(&self, p: *const u8) -> Option<&Pool> {
        let reserve = self.reserve.load(Acquire);
        let base = self.base.load(Relaxed);
        if (p as usize).wrapping_sub(base) < reserve {
            // SAFETY: a non-zero `reserve` was published (Release) after `hot` was written.
            Some(unsafe { (*self.hot.get()).assume_init_ref() })
        } else {
            None
        }
    }

    /// The pool, initialising it first if needed; `None` while another thread initialises it
    /// (after waiting up to [`INIT_WAIT`]), when this thread is itself initialising or
    /// provisioning, or when initialisation failed.
    #[cold]
    fn get_cold(&self) -> Option<&Pool> {
        if provision::active() {
            return self.ready();
        }
        self.published(Some(INIT_WAIT)).ok().map(|r| &r.pool)
    }

    /// Take the UNINIT → BUSY transition and initialise; false when another thread has it.
    #[cold]
    #[inline(never)]
    fn try_init(&self) -> bool {
        if self
            .state
            .compare_exchange(UNINIT, BUSY, Acquire, Relaxed)
            .is_err()
        {
            return self.state.load(Acquire) >= READY;
        }
        // Everything from here to the publication allocates under the mark: those allocations
        // (the NIC's, `tracing`'s) go to the bootstrap region, never back into this function.
        let _mark = Provisioning::enter();
        let _owner = InitOwner::enter(self);
        let counters = self.counters() as *const Counters as *mut Counters;
        let first = !FIRST_CLAIMED.swap(true, Relaxed);
        if first {
            FIRST_COUNTERS.store(counters, Release);
            FIRST_STATE.store(BUSY, Release);
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.open()))
            .unwrap_or(Err(Error::Config("initialisation panicked")));
        // A failure is logged outside the allocation path (`report`), with the degradations
        // it causes, or at exit.
        // SAFETY: `counters` came from `self.counters()`: a `&'static Counters`.
        exit_report::register(unsafe { &*counters }, result.as_ref().err());
        let state = if result.is_ok() { READY } else { FAILED };
        if let Ok(ready) = &result {
            // SAFETY: `ready.pool` is never dropped (it is mapped for good), and neither is the
            // copy; nobody reads `hot` before READY is published below.
            unsafe { (*self.hot.get()).write(ready.pool.alias()) };
            let (base, reserve) = ready.pool.span();
            self.base.store(base, Relaxed);
            self.reserve.store(reserve, Release);
            self.fast_id.store(ready.pool.id, Release);
            let _ = INSTANCE.compare_exchange(
                null_mut(),
                *ready as *const Ready as *mut Ready,
                Release,
                Relaxed,
            );
        }
        // SAFETY: this thread won UNINIT → BUSY: nobody else writes or reads the slot yet.
        unsafe { (*self.slot.get()).write(result) };
        self.state.store(state, Release);
        if first {
            FIRST_STATE.store(state, Release);
        }
        true
    }

    /// Open the NIC, a PD and the pool (on the initialising thread, under a provisioning mark).
    fn open(&self) -> Result<&'static Ready, Error> {
        let (mut cfg, ignored) = self.config.with_env();
        self.counters()
            .env_ignored
            .fetch_add(u64::from(ignored), Relaxed);
        let nic = match cfg.open {
            Some(open) => open()?,
            None => Nic::open_default()?,
        };
        let pd = nic.alloc_pd()?;
        // An address-space limit (`ulimit -v`, a container's) refuses the reservation: halve it
        // down to `MIN_RESERVE` rather than degrade every allocation.
        let pool = loop {
            let arena = cfg.arena();
            let made = if self.remote_rights {
                // SAFETY: the caller of `with_remote_rights` took on its contract.
                unsafe { Pool::with_remote_rights(&pd, arena) }
            } else {
                Pool::with_config(&pd, arena)
            };
            match made {
                Err(Error::Os {
                    errno: libc::ENOMEM,
                    what,
                }) if cfg.arena.reserve / 2 >= MIN_RESERVE => {
                    tracing::info!(
                        what,
                        reserve = cfg.arena.reserve,
                        "rdma_pool: reservation refused, halving it"
                    );
                    cfg.arena.reserve /= 2;
                    cfg.arena.chunk = cfg.arena.chunk.min(cfg.arena.reserve);
                }
                made => break made?,
            }
        };
        tracing::info!(nic = %nic.caps().name, ?cfg.arena.registration, ?cfg.arena.hugepages,
            "rdma_pool: GlobalPool ready");
        MmapBox::new(Ready { cfg, nic, pd, pool })
            .map(MmapBox::into_static)
            .map_err(|(_, errno)| Error::Os {
                what: "mmap of the global pool's handles",
                errno,
            })
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
        let ok = match (self.slot(), self.ready()) {
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
        self.ready()?.keys_of(p)
    }

    /// The keys of the registration covering `p` on `nic`: the pool's own device, or one it
    /// was attached to with [`GlobalPool::attach`].
    #[inline]
    pub fn keys_of_on(&self, p: *const u8, nic: &crate::nic::Nic) -> Option<Keys> {
        self.ready()?.keys_of_on(p, nic)
    }

    /// Register every heap block of the program on `pd` too (a second rail): see
    /// [`Pool::attach`].
    ///
    /// # Errors
    /// Why initialisation failed, or as [`Pool::attach`].
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

    /// Return every idle slab of the pool to the system now (see [`Pool::purge`]); 0 before
    /// the pool is ready. Purging also happens on its own after
    /// [`ArenaConfig::purge_delay`](crate::arena::ArenaConfig::purge_delay).
    ///
    /// # Examples
    /// ```
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// let _ = POOL.purge();
    /// ```
    pub fn purge(&self) -> usize {
        self.ready().map_or(0, |p| p.purge())
    }

    /// A snapshot of the statistics (no lock, no allocation). The bootstrap region's figures
    /// are process-wide (one region serves every pool); the rest are this pool's.
    pub fn stats(&self) -> GlobalStats {
        self.report();
        let p = self.counters.load(Acquire);
        // SAFETY: a non-null pointer is a `&'static Counters`.
        let counters = if p.is_null() { &ZERO } else { unsafe { &*p } };
        counters.snapshot(self.state(), self.ready().map(|p| p.stats()))
    }

    // ---- the paths of `GlobalAlloc` ----

    /// The fast path: a ready pool's own, else the cold path.
    #[inline(always)]
    fn alloc_fast(&self, layout: Layout, zero: bool) -> *mut u8 {
        if !zero {
            let p = Pool::alloc_fast_in(self.fast_id.load(Relaxed), layout);
            if !p.is_null() {
                return p;
            }
        }
        // The last call: the fast path above saves no register for it.
        self.alloc_cold(layout, zero)
    }

    /// Serve `layout` when the fast path could not: the ready pool's slow path (asked once: a
    /// refusal is counted once), else initialise, provision, degrade.
    #[inline(never)]
    fn alloc_cold(&self, layout: Layout, zero: bool) -> *mut u8 {
        if !zero {
            let p = Pool::alloc_fast_mid(self.fast_id.load(Relaxed), layout);
            if !p.is_null() {
                return p;
            }
        }
        // The slow paths make system calls (commit, madvise, registration) whose failures may
        // be handled and leave `errno` set: a successful allocation leaves it as it found it
        // (C's `malloc` is this path too).
        let _errno = ErrnoGuard::save();
        let ready = self.ready();
        if let Some(pool) = ready {
            let p = pool.alloc_with(layout, zero);
            if !p.is_null() {
                return p;
            }
        }
        if provision::active() {
            return self.alloc_reentrant(layout, zero);
        }
        let mut why = DegradeReason::PoolRefused;
        if ready.is_none() {
            match self.get_cold() {
                Some(pool) => {
                    let p = pool.alloc_with(layout, zero);
                    if !p.is_null() {
                        return p;
                    }
                }
                None if self.state.load(Acquire) == FAILED => why = DegradeReason::InitFailed,
                None => why = DegradeReason::InitPending,
            }
        }
        self.alloc_degraded(layout, zero, why)
    }

    /// An allocation made while this thread calls into the NIC: bootstrap region, then malloc.
    fn alloc_reentrant(&self, layout: Layout, zero: bool) -> *mut u8 {
        Counters::bump(&self.counters().reentrant);
        let p = bootstrap::alloc(layout, zero);
        if !p.is_null() {
            return p;
        }
        Counters::bump(&self.counters().overflow);
        // SAFETY: `layout` has a non-zero size (the `GlobalAlloc` contract).
        unsafe { fallback::fallback_alloc(self.config.fallback, layout, zero) }
    }

    /// The pool could not serve `layout`: the system allocator, or null under `Fail`.
    fn alloc_degraded(&self, layout: Layout, zero: bool, why: DegradeReason) -> *mut u8 {
        self.counters().degraded_for(why);
        if self.config.on_failure == OnFailure::Fail {
            Counters::bump(&self.counters().failed);
            return null_mut();
        }
        // SAFETY: `layout` has a non-zero size (the `GlobalAlloc` contract).
        let p = unsafe { fallback::fallback_alloc(self.config.fallback, layout, zero) };
        if p.is_null() {
            // The system refused it too (larger than memory, say): a failure, not a
            // degradation — nothing was served.
            Counters::bump(&self.counters().failed);
            return p;
        }
        Counters::bump(&self.counters().degraded);
        self.counters()
            .degraded_bytes
            .fetch_add(layout.size() as u64, Relaxed);
        p
    }

    /// Free a block that is not the pool's: a bootstrap or a system block.
    #[cold]
    #[inline(never)]
    unsafe fn dealloc_cold(&self, p: *mut u8, layout: Layout) {
        if bootstrap::contains(p) {
            // SAFETY: a live bootstrap block (the caller's contract).
            unsafe { bootstrap::free(p) };
        } else {
            // SAFETY: neither pool nor bootstrap: a fallback block with `layout`.
            unsafe { fallback::fallback_dealloc(self.config.fallback, p, layout) };
        }
    }

    /// `realloc` of a block the fast path did not handle.
    #[cold]
    #[inline(never)]
    unsafe fn realloc_cold(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return null_mut();
        };
        let in_pool = self.owner_of(p).is_some();
        // A bootstrap block stays put only while provisioning; otherwise it moves to the pool.
        // SAFETY: a live bootstrap block when it is in the region (the caller's contract).
        if bootstrap::contains(p)
            && provision::active()
            && unsafe { bootstrap::resize_in_place(p, new_size) }
        {
            return p;
        }
        if !in_pool && !bootstrap::contains(p) && provision::active() {
            // A system block while provisioning: stay there.
            // SAFETY: forwarded from the caller; a fallback block with `layout`.
            return unsafe {
                fallback::fallback_realloc(self.config.fallback, p, layout, new_size)
            };
        }
        // Move: into the pool when possible (healing a degraded block), else wherever the
        // allocation path sends it.
        // SAFETY: `new` has a non-zero size (the caller's contract).
        let q = unsafe { self.alloc(new) };
        if !q.is_null() {
            if !in_pool && !bootstrap::contains(p) && self.keys_of(q).is_some() {
                Counters::bump(&self.counters().healed);
            }
            // SAFETY: distinct live blocks, both valid for the copied length.
            unsafe {
                ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                self.dealloc(p, layout);
            }
        }
        q
    }
}

/// Restores this thread's `errno` when dropped.
struct ErrnoGuard(*mut libc::c_int, libc::c_int);

impl ErrnoGuard {
    fn save() -> ErrnoGuard {
        // SAFETY: `__errno_location` returns this thread's `errno`, valid for the thread's life.
        let e = unsafe { libc::__errno_location() };
        // SAFETY: as above.
        ErrnoGuard(e, unsafe { *e })
    }
}

impl Drop for ErrnoGuard {
    fn drop(&mut self) {
        // SAFETY: as in `save`, on the same thread.
        unsafe { *self.0 = self.1 };
    }
}

/// Size-less frees and sizes: what C's `free`, `realloc` and `malloc_usable_size` need (the
/// C library, `capi/`). A block is found by its address alone: the pool's by its page
/// table, the bootstrap region's by its header, a fallback block by the fallback's registry
/// ([`Fallback::Mmap`]); any other pointer is a stranger's.
impl GlobalPool {
    /// Free `p` without its layout, wherever it came from (pool, bootstrap region,
    /// fallback). Null and pointers no part of this pool handed out — including pointers
    /// into a pool block that are not its first byte — are ignored and the latter counted
    /// ([`GlobalStats::foreign_frees`]; under [`Fallback::System`] those outside the pool are
    /// passed to `free`).
    ///
    /// # Safety
    /// `p` is null, or a block of this `GlobalPool` freed once, or a pointer it did not hand
    /// out that is inside the pool or (under [`Fallback::Mmap`]) anywhere — left alone; under
    /// [`Fallback::System`] a pointer outside the pool must be a `malloc` block.
    ///
    /// # Examples
    /// ```
    /// use std::alloc::{GlobalAlloc, Layout};
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// // SAFETY: a non-zero-size layout; the block is freed once.
    /// unsafe {
    ///     let p = POOL.alloc(Layout::from_size_align(100, 8).unwrap());
    ///     assert!(POOL.usable_size(p).unwrap() >= 100);
    ///     POOL.free_unsized(p);
    /// }
    /// ```
    #[inline]
    pub unsafe fn free_unsized(&self, p: *mut u8) {
        if let Some(pool) = self.owner_of(p) {
            // SAFETY: in the pool's reservation: a block of the pool freed once, or ignored.
            if !unsafe { pool.free_found(p) } {
                Counters::bump(&self.counters().foreign);
            }
            return;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.free_unsized_cold(p) }
    }

    #[cold]
    #[inline(never)]
    unsafe fn free_unsized_cold(&self, p: *mut u8) {
        if p.is_null() {
            return;
        }
        if bootstrap::contains(p) {
            // SAFETY: a live bootstrap block (the caller's contract).
            return unsafe { bootstrap::free(p) };
        }
        // SAFETY: forwarded from the caller.
        if !unsafe { fallback::free_unsized(self.config.fallback, p) } {
            Counters::bump(&self.counters().foreign);
        }
    }

    /// Bytes usable in the live block `p` (at least what was asked for), wherever it came
    /// from; `None` for a pointer this pool did not hand out (or not a block's start).
    ///
    /// # Safety
    /// `p` is null, a live block of this `GlobalPool`, or — under [`Fallback::Mmap`] — a
    /// pointer it did not hand out. (Under [`Fallback::System`] a pointer outside the pool
    /// is taken for a `malloc` block and measured by `malloc_usable_size`; a freed bootstrap
    /// block's header may be gone, so its answer would be made up.)
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::GlobalPool;
    /// use rdma_pool::global::{Fallback, GlobalConfig};
    /// static POOL: GlobalPool = GlobalPool::with_config(GlobalConfig {
    ///     fallback: Fallback::Mmap,
    ///     ..GlobalConfig::DEFAULT
    /// });
    /// // SAFETY: under `Mmap`, a pointer the pool did not hand out is answered `None`.
    /// assert_eq!(unsafe { POOL.usable_size(&0u8) }, None);
    /// ```
    pub unsafe fn usable_size(&self, p: *const u8) -> Option<usize> {
        if let Some(pool) = self.owner_of(p) {
            return pool.usable_size(p);
        }
        if p.is_null() {
            return None;
        }
        if bootstrap::contains(p) {
            // SAFETY: a pointer into the region is one of its live blocks (the caller's
            // contract: strangers are not in the region).
            return Some(unsafe { bootstrap::size_of(p) });
        }
        fallback::size_of(self.config.fallback, p)
            .map(|size| fallback::usable(self.config.fallback, size))
    }

    /// Resize the block `p` to `new_size` bytes without its layout (C's `realloc`): in place
    /// when it can, else moved with its contents, the result aligned to 16 (`max_align_t`).
    /// Null when nothing could be allocated or `p` is not a block of this pool; `p` is then
    /// untouched.
    ///
    /// # Safety
    /// `p` is a live block of this `GlobalPool`, or (under [`Fallback::Mmap`]) a pointer it
    /// did not hand out; on success it must no longer be used (unless the same pointer is
    /// returned). `new_size` is not 0.
    ///
    /// # Examples
    /// ```
    /// use std::alloc::{GlobalAlloc, Layout};
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// // SAFETY: a non-zero-size layout; each block is used until it is resized or freed.
    /// unsafe {
    ///     let p = POOL.alloc(Layout::from_size_align(16, 8).unwrap());
    ///     p.write(42);
    ///     let q = POOL.realloc_unsized(p, 1 << 20);
    ///     assert_eq!(q.read(), 42);
    ///     POOL.free_unsized(q);
    /// }
    /// ```
    pub unsafe fn realloc_unsized(&self, p: *mut u8, new_size: usize) -> *mut u8 {
        let _errno = ErrnoGuard::save();
        let Some(new) = new_size.checked_next_multiple_of(bootstrap::MIN_ALIGN) else {
            return null_mut();
        };
        if let Some(pool) = self.owner_of(p) {
            let Some(old) = pool.usable_size(p) else {
                // Not a block's first byte: a stranger's pointer, refused and counted.
                Counters::bump(&self.counters().foreign);
                return null_mut();
            };
            // SAFETY: a live block of the pool (caller's contract), at most `old` bytes long
            // (align 8: a size class of a multiple of 16 is 16-aligned).
            let q = unsafe { pool.realloc(p, Layout::from_size_align_unchecked(old, 8), new) };
            if !q.is_null() {
                return q;
            }
            // SAFETY: as above; moved wherever the allocation path serves it (degraded).
            return unsafe { self.move_unsized(p, old, new) };
        }
        // SAFETY: forwarded from the caller.
        let Some(old) = (unsafe { self.usable_size(p) }) else {
            return null_mut();
        };
        let Ok(layout) = Layout::from_size_align(old.max(1), bootstrap::MIN_ALIGN) else {
            return null_mut();
        };
        // SAFETY: a live bootstrap or fallback block; the paths of `realloc_cold` find its
        // size again by its address (header, registry), not by `layout`.
        unsafe { self.realloc_cold(p, layout, new) }
    }

    /// Move the block `p` (of `old` usable bytes) to a new block of `new` bytes.
    ///
    /// # Safety
    /// As [`GlobalPool::realloc_unsized`].
    unsafe fn move_unsized(&self, p: *mut u8, old: usize, new: usize) -> *mut u8 {
        // SAFETY: a non-zero size.
        let q = unsafe { self.alloc(Layout::from_size_align_unchecked(new, 8)) };
        if !q.is_null() {
            // SAFETY: distinct live blocks, both valid for the copied length.
            unsafe {
                ptr::copy_nonoverlapping(p, q, old.min(new));
                self.free_unsized(p);
            }
        }
        q
    }
}

// SAFETY: every block handed out is valid for its layout until freed: pool blocks (aligned,
// never straddling registrations), bootstrap blocks (disjoint bump ranges of a static) and
// system blocks; `dealloc`/`realloc` route each pointer back to where it came from by address.
unsafe impl GlobalAlloc for GlobalPool {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.alloc_fast(layout, false)
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.alloc_fast(layout, true)
    }

    #[inline(always)]
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        let reserve = self.reserve.load(Acquire);
        let off = (p as usize).wrapping_sub(self.base.load(Relaxed));
        if off < reserve {
            // SAFETY: a non-zero `reserve` was published (Release) after `hot` was written.
            let pool = unsafe { (*self.hot.get()).assume_init_ref() };
            // SAFETY: a block of the pool with `layout`; `off` is its offset from the
            // reservation's first address, which is the pool's (`span`, published together).
            return unsafe { pool.free_sized_at(p, off, layout) };
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.dealloc_cold(p, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if let Some(pool) = self.owner_of(p) {
            // SAFETY: a block of the pool with `layout` (the caller's contract).
            let q = unsafe { pool.realloc(p, layout, new_size) };
            if !q.is_null() {
                return q;
            }
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.realloc_cold(p, layout, new_size) }
    }
}

/// The lkey and rkey of any heap pointer: the registration covering `p` in the global pool
/// (the first [`GlobalPool`] that initialised), else in any live [`Pool`]. `None` for memory
/// no pool handed out — the stack, statics, bootstrap or degraded blocks, C `malloc`.
///
/// # Examples
/// ```
/// use rdma_pool::alloc::Pool;
/// let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
/// let pool = Pool::new(&pd)?;
/// let p = pool.alloc(std::alloc::Layout::new::<[u8; 64]>());
/// assert_eq!(rdma_pool::keys_of(p), pool.keys_of(p));
/// assert!(rdma_pool::keys_of(&0u8).is_none());
/// # unsafe { pool.free(p) };
/// # Ok::<(), rdma_pool::arena::Error>(())
/// ```
pub fn keys_of<T: ?Sized>(p: *const T) -> Option<Keys> {
    let p = p.cast::<u8>();
    if let Some(ready) = instance()
        && ready.pool.contains(p)
    {
        return ready.pool.keys_of(p);
    }
    crate::alloc::keys_of_any(p)
}

/// What the front end answers when its pool could not initialise (the cause is kept by
/// [`GlobalPool::init_error`]).
fn not_ready() -> Error {
    Error::Config("the global pool could not initialise: see GlobalPool::init_error")
}

/// The keys of any heap pointer on `nic`: as [`keys_of`], on the global pool's own device or
/// on a device it was attached to ([`GlobalPool::attach`]); `None` where the memory is not
/// registered on `nic`.
///
/// # Examples
/// ```
/// use rdma_pool::alloc::Pool;
/// use rdma_pool::nic::Nic;
/// let (a, b) = (Nic::soft(), Nic::soft());
/// let pool = Pool::new(&a.alloc_pd()?)?;
/// pool.attach(&b.alloc_pd()?)?;
/// let p = pool.alloc(std::alloc::Layout::new::<[u8; 64]>());
/// assert_eq!(rdma_pool::keys_of_on(p, &b), pool.keys_of_on(p, &b));
/// assert!(rdma_pool::keys_of_on(p, &b).is_some());
/// assert!(rdma_pool::keys_of_on(&0u8, &a).is_none());
/// # unsafe { pool.free(p) };
/// # Ok::<(), rdma_pool::arena::Error>(())
/// ```
pub fn keys_of_on<T: ?Sized>(p: *const T, nic: &crate::nic::Nic) -> Option<Keys> {
    let p = p.cast::<u8>();
    if let Some(ready) = instance()
        && ready.pool.contains(p)
    {
        return ready.pool.keys_of_on(p, nic);
    }
    crate::alloc::keys_of_any_on(p, Some(nic))
}

/// The statistics of the global pool (the first [`GlobalPool`] that initialised); `None` when
/// none did.
///
/// # Examples
/// ```
/// // No `GlobalPool` is the global allocator of doctests.
/// if let Some(s) = rdma_pool::stats() {
///     println!("{:?}: {} degraded allocations", s.state, s.degraded_allocations);
/// }
/// ```
pub fn stats() -> Option<GlobalStats> {
    let state = match FIRST_STATE.load(Acquire) {
        UNINIT => return None,
        BUSY => GlobalState::Initialising,
        READY => GlobalState::Ready,
        _ => GlobalState::Failed,
    };
    let counters = FIRST_COUNTERS.load(Acquire);
    // SAFETY: set (to a `&'static Counters`) before `FIRST_STATE` leaves UNINIT.
    let counters = if counters.is_null() {
        &ZERO
    } else {
        unsafe { &*counters }
    };
    if !provision::active() {
        exit_report::report(counters);
    }
    Some(counters.snapshot(state, instance().map(|r| r.pool.stats())))
}

fn instance() -> Option<&'static Ready> {
    let p = INSTANCE.load(Acquire);
    // SAFETY: `INSTANCE` only ever holds a `&'static Ready` (mapped and never unmapped).
    (!p.is_null()).then(|| unsafe { &*p })
}
