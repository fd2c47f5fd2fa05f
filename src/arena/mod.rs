//! The arena: one reservation of hugepage slabs, registered with the NIC before anyone
//! allocates from it, grown without ever breaking a key handed out, answering `keys_of` in
//! O(1) without a lock, and returning purged slabs to the system.
//!
//! Contract:
//! - a window of `reserve · reservations` bytes of address space is held up front (`PROT_NONE`,
//!   `MAP_NORESERVE`: no memory, no commit charge) and cut into power-of-two chunks of `chunk`
//!   bytes (`chunk <= max_mr_size`); an address maps to its chunk with one subtraction and one
//!   shift. Chunks are opened in the first `reserve` bytes; when a run does not fit there,
//!   another reservation of `reserve` bytes is added right behind (up to the window), so the
//!   reservation never runs out while the window has room;
//! - memory is committed in [`SLAB`] (2 MiB) slabs as a growing prefix of a chunk (see
//!   `commit.rs` for the page kinds: chunks are dense, on huge pages, or — in an ODP arena —
//!   sparse, on 4 KiB pages, for slabs the pool cuts into size-class pages;
//!   [`Arena::alloc_run`] is dense, and a run goes to a chunk of the other backing only when
//!   the window has no room for a chunk of its own), and every committed slab handed out is
//!   registered —
//!   pinned, or ODP one region per chunk (`register.rs`: [`Registration`], `Auto` and its
//!   reason) — `LOCAL_WRITE | MW_BIND` only unless [`ArenaConfig::remote`] opts in to more;
//! - a refused registration falls back to ODP, then to unregistered memory that is counted and
//!   has no keys, or fails the run under [`RegistrationPolicy::Required`] (`register.rs`);
//! - [`Arena::alloc_run`] hands out whole slabs inside **one** registration (or none, degraded),
//!   so any buffer in a run can be posted as one SGE; a run larger than a chunk gets a
//!   dedicated region (`run.rs`);
//! - keys handed out never change (`grow.rs`): a purge removes a region whose keys were handed
//!   out only when it covers nothing live (its keys then stop working), never re-registers it;
//! - the arena's own code never allocates through the global allocator (its metadata is mapped
//!   from the kernel), never holds its lock across a NIC call, and makes NIC calls only on the
//!   growth, purge and revive paths, never in [`Arena::keys_of`];
//! - each chunk is bound to a NUMA node as [`ArenaConfig::numa`] says, right after it is
//!   mapped and before any page of it is touched (`numa.rs`); the node is recorded per chunk
//!   ([`Arena::chunk_node`]) and a failed binding leaves the chunk unbound, never fails a run.
//!
//! Invariants (checked by [`Arena::validate`]):
//! - `used(c) <= slabs_per_chunk` for every chunk, `next_chunk <= reserved / chunk`,
//!   `reserved == reserve · k` for some `1 <= k`, `reserved <= window`;
//! - every slab the table maps lies in a live registration covering it; no pinned region
//!   covers a purged slab;
//! - `committed_bytes == SLAB · (slabs_hugetlb + slabs_thp + slabs_small)`.
//!
//! Memory handed out by the arena stays mapped until the arena is dropped, and registered as
//! long as it is not purged (`purge.rs`); dropping the arena deregisters every region and
//! unmaps the reservation.
//!
//! Besides the files named above, the `Arena`'s methods live with their concern: the address
//! space and its arithmetic (`layout.rs`), keys and SGEs by address (`lookup.rs`), the NUMA
//! node of each chunk (`placement.rs`), counters, introspection and [`Arena::validate`]
//! (`stats.rs`), the prefetch state and automatic prefetch (`prefetch/hooks.rs`).

mod commit;
pub(crate) use commit::Backing;
pub(crate) use table::{STEP, STEP_SHIFT, STEPS};

/// Bytes of a step: in a pinned arena, a slab cut into pages of at most this size is
/// registered a step at a time, as its pages are used, so it pins what is in use, not 2 MiB.
///
/// # Examples
/// ```
/// assert_eq!(rdma_pool::arena::STEP_BYTES, 256 << 10);
/// assert_eq!(rdma_pool::arena::SLAB % rdma_pool::arena::STEP_BYTES, 0);
/// ```
pub const STEP_BYTES: usize = STEP;

/// The fewest regions (`max_mr`) a device must offer for a pinned arena to register steps: a
/// quarter of them is the arena's step budget (`step.rs`), and a device with fewer regions
/// keeps them for whole slabs and grants.
const MIN_STEP_MAX_MR: u32 = 4096;
mod config;
mod discard;
mod env;
mod error;
mod events;
mod fork;
mod grow;
mod layout;
mod lookup;
pub mod numa;
mod placement;
pub(crate) mod prefetch;
// The provisioning mark, for tests that make allocations re-entrant on purpose.
#[doc(hidden)]
pub use crate::sys::provision;
mod purge;
mod rails;
mod register;
mod run;
mod stats;
mod step;
mod table;

pub use crate::sys::atfork::{DRAIN, ForkStats, fork_stats};
pub use commit::PageKind;
pub use config::{ArenaConfig, Hugepages, Registration, RegistrationPolicy};
pub use error::Error;
pub use fork::ForkPolicy;
pub use numa::{NumaPlacement, NumaPolicy};
pub use rails::{MAX_RAILS, RailStats};
pub use register::{
    Degradation, DegradeCause, MemlockInfo, ModeReason, RegMode, preflight_memlock,
};
pub use stats::{ArenaStats, MAX_STAT_NODES};
pub use table::Keys;

use crate::nic::{Access, Pd};
use crate::sys::atfork::{self, ForkGuard, ForkLock};
use crate::sys::os::{self, MmapArray};
use commit::Pages;
use stats::Counters;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize};
use table::Table;

/// Bytes per slab: the unit of commitment and registration.
pub const SLAB: usize = 1 << SLAB_SHIFT;
pub(crate) const SLAB_SHIFT: u32 = 21;

/// Whole slabs handed out by [`Arena::alloc_run`], inside one registration.
///
/// The memory stays valid (mapped, registered, zero-filled when first handed out) until the
/// arena is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a `Run` is an address range, like a raw pointer and a length.
unsafe impl Send for Run {}
// SAFETY: as above; it gives no access by itself.
unsafe impl Sync for Run {}

impl Run {
    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes (a multiple of [`SLAB`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: runs hold at least one slab.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Per-chunk bookkeeping, under the arena's lock. All-zero is "not opened".
#[derive(Clone, Copy)]
struct ChunkState {
    /// Slabs handed out (committed or skipped for alignment) from the chunk's start.
    used: u32,
    /// Slabs `[0, huge_until)` of the chunk's mapping are hugetlb.
    huge_until: u32,
    /// `id + 1` of the region at the committed end of the chunk, 0 for none.
    tail: u32,
    /// Slab index (in the chunk) where that region ends.
    tail_end: u32,
    /// `id + 1` of the chunk's ODP region, 0 for none.
    odp: u32,
    /// A pinned registration of the chunk failed and its ODP region took over: later slabs of
    /// the chunk use it too.
    fallback: bool,
    /// `n + 1` for a chunk bound to NUMA node `n`, 0 for an unbound one.
    node: u32,
    /// Mapped for [`Backing::Sparse`](commit::Backing::Sparse) runs (`commit.rs`).
    sparse: bool,
    /// Opened for queue memory (`alloc_unregistered`): never cut for registered runs.
    queue: bool,
}

struct State {
    next_chunk: usize,
    /// The chunk runs are cut from, per backing (dense, sparse) and slot: slot 0 unless the
    /// placement is [`NumaPlacement::Local`], then `node % MAX_NODES` of the calling thread.
    open: [[Option<usize>; numa::MAX_NODES]; 2],
    /// The chunk unregistered runs (DEVX queue memory) are cut from, if one is open.
    queue: Option<usize>,
    /// Chunks below `next_chunk` skipped for the alignment of a run and never opened.
    holes: usize,
    chunks: MmapArray<ChunkState>,
}

/// A reservation of NIC-registered memory handed out in slab runs. See the module contract.
///
/// # Examples
/// ```
/// use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
/// use rdma_pool::nic::Nic;
/// let pd = Nic::soft().alloc_pd()?;
/// let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
/// let arena = Arena::new(&pd, cfg)?;
/// let run = arena.alloc_run(1 << 20, 4096)?;
/// // SAFETY: the run is ours until the arena is dropped.
/// let buf = unsafe { std::slice::from_raw_parts_mut(run.as_ptr(), 4096) };
/// buf.fill(7);
/// let sge = arena.sge_of(buf)?;
/// assert_eq!(sge.length, 4096);
/// # Ok::<(), rdma_pool::PoolError>(())
/// ```
pub struct Arena {
    pd: Pd,
    base: usize,
    /// Bytes per reservation (the configured `reserve`).
    reserve: usize,
    /// Bytes of address space held from `base`: room for every reservation.
    window: usize,
    /// Bytes of the window reserved so far (`reserve · k`); grows under the lock.
    reserved: AtomicUsize,
    chunk_shift: u32,
    slabs_per_chunk: u32,
    max_mr_size: u64,
    table: Table,
    state: ForkLock<State>,
    counters: Counters,
    pages: Pages,
    access: Access,
    rereg: AtomicBool,
    hugetlb_hint: AtomicBool,
    last_kind: AtomicU8,
    mode: RegMode,
    mode_reason: ModeReason,
    /// ODP regions can carry the pool's traffic on this device (a fallback for pinned mode).
    odp_usable: bool,
    policy: RegistrationPolicy,
    implicit_odp: bool,
    /// `id + 1` of the implicit ODP region, 0 before it is registered.
    implicit: AtomicU32,
    implicit_lock: ForkLock<()>,
    last_degradation: AtomicU64,
    memlock: MemlockInfo,
    /// What the configured [`NumaPolicy`] resolved to.
    numa: NumaPlacement,
    /// Per slab of the reservation: purge state and page kind (`purge.rs`).
    slabs: MmapArray<purge::SlabInfo>,
    purge_delay: Option<std::time::Duration>,
    purge_thread: bool,
    shared_bytes: u32,
    prefetch: prefetch::Prefetcher,
    /// One-slab runs made ready ahead of demand (`prefetch/refill.rs`).
    ahead: prefetch::Reserve,
    /// The registration asked for, and the remote rights: how rails register (`rails/`).
    asked: Registration,
    remote: Access,
    /// Other devices the arena is registered on (`rails/`).
    rails: rails::Rails,
    /// The device reported a fatal event (`events.rs`).
    dead: AtomicBool,
    /// `Nic::device_id` of the arena's own device (`keys_of_on` compares it first).
    device: usize,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("base", &(self.base as *const u8))
            .field("reserve", &self.reserve)
            .field("window", &self.window)
            .field("chunk", &self.chunk_size())
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl Arena {
    /// Reserve the address space and prepare the tables. Nothing is committed or registered
    /// until the first [`Arena::alloc_run`].
    ///
    /// # Errors
    /// [`Error::Config`] for an inconsistent configuration (or a device whose `max_mr_size`
    /// is below one slab, or a NUMA node — asked for, or the device's under
    /// [`NumaPolicy::DeviceNode`] — that is not online); [`Error::Os`] when the reservation
    /// cannot be made.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&pd, cfg)?;
    /// assert_eq!(arena.stats().reserved_bytes, 1 << 30);
    /// assert_eq!(arena.stats().committed_bytes, 0);
    /// assert!(!arena.access().intersects(rdma_pool::nic::Access::REMOTE));
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn new(pd: &Pd, cfg: ArenaConfig) -> Result<Arena, Error> {
        if !cfg.remote.is_empty() {
            return Err(Error::Config(
                "remote rights on the arena's own regions let a peer with the key reach every \
                 byte of it (with implicit ODP, of the process): with_remote_rights (unsafe)",
            ));
        }
        // SAFETY: no remote right: only the program's own work requests use the regions.
        unsafe { Arena::with_remote_rights(pd, cfg) }
    }

    /// [`Arena::new`] with remote rights on the arena's own regions (`cfg.remote`), for
    /// deployments whose peers are all trusted.
    ///
    /// # Safety
    /// Whoever holds the arena's rkey may read (and with `REMOTE_WRITE`/`REMOTE_ATOMIC`,
    /// write) any byte of its regions at any time — with an implicit ODP region
    /// (`implicit_odp`), any byte of the process. Every peer given the key must be trusted to
    /// touch only what the program's protocol gives it, when it gives it, and the program must
    /// access memory a peer may write only once that protocol says the write completed.
    ///
    /// # Errors
    /// As [`Arena::new`].
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// use rdma_pool::nic::Access;
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, remote: Access::REMOTE_READ, ..Default::default() };
    /// assert!(Arena::new(&pd, cfg.clone()).is_err());
    /// // SAFETY: the key is given to no peer.
    /// let arena = unsafe { Arena::with_remote_rights(&pd, cfg) }?;
    /// assert!(arena.access().contains(Access::REMOTE_READ));
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub unsafe fn with_remote_rights(pd: &Pd, cfg: ArenaConfig) -> Result<Arena, Error> {
        let _mark = provision::Provisioning::enter();
        atfork::install();
        let caps = pd.nic().caps();
        let chunk = cfg.chunk_for(caps.max_mr_size)?;
        let (mode, mode_reason, odp_usable) =
            register::choose_mode(cfg.registration, caps, cfg.remote)?;
        let numa = NumaPlacement::resolve(cfg.numa, caps.numa_node).map_err(Error::Config)?;
        let (base, window, reserve) = os::reserve_window(cfg.reserve, cfg.reservations, chunk)
            .map_err(|errno| Error::Os {
                what: "mmap(PROT_NONE) reservation",
                errno,
            })?;
        let base = base.as_ptr() as usize;
        let unreserve = |e: i32| {
            // SAFETY: the reservation was just made and nothing uses it.
            unsafe { libc::munmap(base as *mut libc::c_void, window) };
            Error::Os {
                what: "mmap of arena metadata",
                errno: e,
            }
        };
        // A quarter of the device's regions for steps (`step.rs`), in a pinned arena on a
        // device with enough of them.
        let step_slabs = if mode == RegMode::Pinned && caps.max_mr >= MIN_STEP_MAX_MR {
            caps.max_mr as usize / 4 / table::STEPS
        } else {
            0
        };
        // Shared with every arena on the device (`table/budget.rs`).
        let budget = table::Budget::join(&caps.name, step_slabs);
        let table = Table::new(base, window, step_slabs, budget).map_err(unreserve)?;
        // SAFETY: an all-zero ChunkState is a valid "not opened" chunk, an all-zero SlabInfo a
        // live slab of unknown kind.
        let (chunks, slabs) = unsafe {
            (
                MmapArray::zeroed(window / chunk).map_err(unreserve)?,
                MmapArray::zeroed(window / SLAB).map_err(unreserve)?,
            )
        };
        let mut access = Access::LOCAL_WRITE | cfg.remote;
        if caps.mw_type1 || caps.mw_type2 {
            access |= Access::MW_BIND;
        }
        let implicit_odp = cfg.implicit_odp && mode == RegMode::Odp && caps.odp.implicit;
        let memlock = preflight_memlock();
        // ODP memory follows the process's mapping: a child gets its own copy, no
        // MADV_DONTFORK needed.
        let fork = match mode {
            RegMode::Odp => ForkPolicy::KernelCopies,
            RegMode::Pinned => ForkPolicy::for_status(pd.nic().fork_status()),
        };
        tracing::info!(
            target: "rdma_pool::arena",
            mode = ?mode,
            reason = mode_reason.as_str(),
            memlock_soft = memlock.soft,
            memlock_raised = memlock.raised,
            "arena registration mode chosen"
        );
        Ok(Arena {
            pd: pd.clone(),
            base,
            reserve,
            window,
            reserved: AtomicUsize::new(reserve),
            chunk_shift: chunk.trailing_zeros(),
            slabs_per_chunk: (chunk / SLAB) as u32,
            max_mr_size: caps.max_mr_size,
            table,
            state: ForkLock::new(State {
                next_chunk: 0,
                open: [[None; numa::MAX_NODES]; 2],
                queue: None,
                holes: 0,
                chunks,
            }),
            counters: Counters::default(),
            pages: Pages {
                policy: cfg.hugepages,
                fork,
                thp: os::thp_available(),
                lazy: mode == RegMode::Odp,
                bind_failures: AtomicU64::new(0),
            },
            access,
            rereg: AtomicBool::new(cfg.grow_by_rereg && caps.rereg_mr && mode == RegMode::Pinned),
            hugetlb_hint: AtomicBool::new(true),
            last_kind: AtomicU8::new(0),
            mode,
            mode_reason,
            odp_usable,
            policy: cfg.policy,
            implicit_odp,
            implicit: AtomicU32::new(0),
            implicit_lock: ForkLock::new(()),
            last_degradation: AtomicU64::new(0),
            memlock,
            numa,
            slabs,
            purge_delay: cfg.purge_delay,
            purge_thread: cfg.purge_thread,
            shared_bytes: cfg.shared_bytes,
            prefetch: prefetch::Prefetcher::new(cfg.prefetch && mode == RegMode::Odp, caps),
            ahead: prefetch::Reserve::new().map_err(unreserve)?,
            asked: cfg.registration,
            remote: cfg.remote,
            rails: rails::Rails::default(),
            dead: AtomicBool::new(false),
            device: pd.nic().device_id(),
        })
    }

    fn lock(&self) -> ForkGuard<'_, State> {
        self.state.lock()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let _mark = provision::Provisioning::enter();
        self.rails.drop_all();
        self.table.drop_all();
        // SAFETY: every region over the reservation is gone; nothing else uses it.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.window) };
    }
}
