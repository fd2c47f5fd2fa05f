//! How an arena is laid out and registered: [`ArenaConfig`] and the hugepage policy.
//!
//! Contract: `reserve` and `chunk` are powers of two with `SLAB <= chunk <= reserve`; the
//! arena clamps `chunk` to the device's `max_mr_size` (rounded down to a power of two) and
//! reports the size it used. `remote` is a subset of [`Access::REMOTE`]: empty by default, so
//! the pool's own rkeys give a peer nothing. `registration` picks pinned or ODP regions (see
//! `register.rs` for how `Auto` decides), `policy` what happens when memory cannot be
//! registered, `purge_delay` how long freed slabs stay committed (see `purge.rs`), `numa`
//! which node chunks are placed on (see `numa.rs`).

use super::{Error, NumaPolicy, SLAB};
use crate::nic::Access;
use std::time::Duration;

/// The most address space an arena may hold: half of x86-64's 47-bit user space.
pub(crate) const MAX_WINDOW: usize = 64 << 40;

/// How the arena registers its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Registration {
    /// Pinned regions (`ibv_reg_mr` without `ON_DEMAND`): every committed page is resident and
    /// counts against `RLIMIT_MEMLOCK`. Chunks grow by re-registration where the device keeps
    /// keys. The arena's default.
    #[default]
    Pinned,
    /// Explicit on-demand-paging regions, one per chunk, registered when the chunk is first
    /// committed (keys fixed for the chunk's life); nothing is pinned. Fails with
    /// [`Error::Config`] on a device without explicit ODP for every RC operation the pool needs.
    Odp,
    /// ODP where the device supports every RC operation the pool needs *and* no known quirk
    /// makes ODP RDMA unsafe for arbitrary buffers (kernel rxe); pinned otherwise. The choice
    /// and its reason are in [`ArenaStats::mode`](super::ArenaStats::mode).
    Auto,
}

/// What the arena does with memory it could not register (memlock limit, `max_mr`, a refused
/// registration) after trying ODP for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RegistrationPolicy {
    /// Serve it unregistered: `keys_of` is `None` for it, it is counted in
    /// [`ArenaStats::unregistered_bytes`](super::ArenaStats::unregistered_bytes) with the
    /// reason, and later growth tries to register again. Never loses a byte, never panics.
    #[default]
    Degrade,
    /// Fail the allocation instead: for services that must never hand out unregistered memory.
    Required,
}

/// Which pages back the arena's slabs.
///
/// **hugetlb and `fork`.** hugetlb memory is shared copy-on-write with a child like any
/// private memory, but the copy needs a free huge page: when the hugetlb pool is dry, the
/// first write to such a page after a `fork` — by the parent as much as the child — dies of
/// `SIGBUS` (the arena maps `MAP_NORESERVE`, so nothing was reserved for it), and a `fork`
/// while huge pages are pinned fails with `ENOMEM` (the kernel copies pinned pages at once).
/// A program that forks (`std::process::Command` does, on its fork path) should not put its
/// general heap on hugetlb pages: [`Hugepages::Transparent`], the default of
/// [`GlobalConfig`](crate::global::GlobalConfig), never faults that way (a copy falls back to
/// 4 KiB pages). [`Hugepages::Prefer`] and [`Hugepages::Require`] suit a pool of buffers in a
/// process that does not fork, or forks only through `posix_spawn`/`vfork`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Hugepages {
    /// hugetlb 2 MiB pages or fail ([`Error::HugepagesUnavailable`]).
    Require,
    /// hugetlb pages while the pool has them, then transparent huge pages, then 4 KiB pages;
    /// each slab's kind is counted in the stats. Transparent huge pages only in a pinned
    /// arena: an ODP arena's memory faults in where it is touched, a 4 KiB page at a time.
    #[default]
    Prefer,
    /// Transparent huge pages (`MADV_HUGEPAGE`) where the kernel finds them, else 4 KiB
    /// pages; never hugetlb. Safe across `fork` (see above). In a pinned arena only: an ODP
    /// arena's memory faults in where it is touched, a 4 KiB page at a time (on huge pages a
    /// touch would fault in 2 MiB).
    Transparent,
    /// Ordinary 4 KiB pages (`MADV_NOHUGEPAGE`).
    Off,
}

impl Hugepages {
    /// Whether slabs are tried on hugetlb pages first.
    pub(crate) fn hugetlb(self) -> bool {
        matches!(self, Hugepages::Require | Hugepages::Prefer)
    }
}

/// The layout and registration policy of an [`Arena`](super::Arena).
///
/// # Examples
/// ```
/// use rdma_pool::arena::{ArenaConfig, Hugepages};
/// let cfg = ArenaConfig { reserve: 1 << 32, hugepages: Hugepages::Off, ..ArenaConfig::default() };
/// assert_eq!(cfg.chunk, 1 << 30);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Bytes of address space reserved up front (`PROT_NONE`, `MAP_NORESERVE`): a power of
    /// two. Default 64 GiB.
    pub reserve: usize,
    /// How many reservations of `reserve` bytes the arena may hold: when one is full, the next
    /// is added right behind it (so an address still maps to its chunk with one subtraction
    /// and one shift, and `keys_of` stays one lock-free table read). The address space for
    /// all of them is held from the start as one `PROT_NONE` window — no memory, no commit
    /// charge — and a window the kernel refuses (`RLIMIT_AS`) is halved until it fits, down
    /// to one reservation. At least 1 (1: the arena never grows). Default 16.
    pub reservations: u32,
    /// Bytes per chunk (a power of two, at least 2 MiB). Slabs are committed as a growing
    /// prefix of a chunk, and a run never crosses a chunk unless it is larger than one.
    /// Default 1 GiB, clamped to the device's `max_mr_size`.
    pub chunk: usize,
    /// Hugepage policy.
    pub hugepages: Hugepages,
    /// Remote rights for the pool's own regions. **Empty by default**: a peer reaches pool
    /// memory only through a memory-window grant. Setting rights here is an explicit opt-in for
    /// deployments whose peers are all trusted: any peer that learns the pool's rkey and an
    /// address can then read (and with `REMOTE_WRITE`, overwrite) *every* buffer of the pool.
    /// Safe constructors ([`Arena::new`](super::Arena::new), `Pool::with_config`) refuse any
    /// right here; the `unsafe` [`Arena::with_remote_rights`](super::Arena::with_remote_rights)
    /// and `Pool::with_remote_rights` take them (the NIC may then read freed blocks and write
    /// blocks safe code holds; with `implicit_odp`, any byte of the process).
    pub remote: Access,
    /// Grow a chunk's tail region with `ibv_rereg_mr(CHANGE_TRANSLATION)` while its keys were
    /// never handed out (fewer regions); `false` registers every growth step as its own region.
    pub grow_by_rereg: bool,
    /// Pinned or ODP registration. Default [`Registration::Pinned`].
    pub registration: Registration,
    /// With ODP, one implicit ODP region over the whole address space (where the device offers
    /// implicit ODP) instead of one explicit region per chunk. Default `false`: an implicit
    /// region makes every page of the process reachable with the arena's rights.
    pub implicit_odp: bool,
    /// Unregistered memory or a failed allocation when registration is impossible. Default
    /// [`RegistrationPolicy::Degrade`].
    pub policy: RegistrationPolicy,
    /// How long a freed slab stays committed before the pool's purge has returned it to the
    /// system: the purge starts when the slab has been idle for ¾ of it, so that a large purge
    /// has ended on time (`None`: only an explicit `purge()` does). Default 1 s.
    pub purge_delay: Option<Duration>,
    /// Run due purges on a clock — one background thread per process (`rdma-pool-purge`),
    /// started by the first slow path that finds a purge pending, never by the first
    /// allocation — so freed memory goes back after `purge_delay` also while the program is
    /// idle and pages of exited threads come back without another call. `false`: purges run
    /// only on the pool's slow paths and on `purge()`. Default `true`.
    pub purge_thread: bool,
    /// Bytes of blocks (each of at most 64 KiB) a thread is served from a few heaps shared by
    /// every thread before it takes pages of its own: a thread that holds a few blocks then
    /// costs those blocks, not a page per size class (a short-lived thread's first
    /// allocations take a slow path and one CAS each, their frees the cross-thread path; see
    /// the pool's `heap/shared.rs`). 0 turns it off. Default 128 KiB.
    pub shared_bytes: u32,
    /// Prefetch ODP memory into the NIC (`advise_mr`, `PrefetchWrite`, `FLUSH`) as runs are
    /// committed and purged ranges revived, so a peer's first access takes no page fault
    /// (see [`crate::prefetch`]). No effect on pinned memory. Default `true`.
    pub prefetch: bool,
    /// Which NUMA node chunks take their memory from (see [`NumaPolicy`]; `mbind` with
    /// `MPOL_PREFERRED`). Default [`NumaPolicy::Any`]: no binding.
    pub numa: NumaPolicy,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        ArenaConfig::DEFAULT
    }
}

impl ArenaConfig {
    /// The defaults, as a constant (for `static`s and `const`s): 64 GiB reserved in 1 GiB
    /// chunks, hugepages preferred, pinned registration, no remote rights, a 1 s purge delay,
    /// 128 KiB from the shared heaps, prefetch on, no NUMA binding.
    pub const DEFAULT: ArenaConfig = ArenaConfig {
        reserve: 64 << 30,
        reservations: 16,
        chunk: 1 << 30,
        hugepages: Hugepages::Prefer,
        remote: Access::empty(),
        grow_by_rereg: true,
        registration: Registration::Pinned,
        implicit_odp: false,
        policy: RegistrationPolicy::Degrade,
        purge_delay: Some(Duration::from_secs(1)),
        purge_thread: true,
        shared_bytes: 128 << 10,
        prefetch: true,
        numa: NumaPolicy::Any,
    };

    /// Check the configuration against `max_mr_size`, returning the chunk size to use.
    pub(crate) fn chunk_for(&self, max_mr_size: u64) -> Result<usize, Error> {
        if !self.reserve.is_power_of_two() || !self.chunk.is_power_of_two() {
            return Err(Error::Config("reserve and chunk must be powers of two"));
        }
        if self.chunk < SLAB || self.chunk > self.reserve {
            return Err(Error::Config("chunk must be between 2 MiB and reserve"));
        }
        if self.reservations == 0
            || self
                .reserve
                .checked_mul(self.reservations as usize)
                .is_none_or(|w| w > MAX_WINDOW)
        {
            return Err(Error::Config(
                "reservations must be at least 1, and reserve × reservations at most 64 TiB",
            ));
        }
        if !Access::REMOTE.contains(self.remote) {
            return Err(Error::Config(
                "remote may only hold REMOTE_READ/WRITE/ATOMIC",
            ));
        }
        let cap = usize::try_from(max_mr_size).unwrap_or(usize::MAX);
        if cap < SLAB {
            return Err(Error::Config(
                "the device's max_mr_size is below one 2 MiB slab",
            ));
        }
        // The largest power of two not above max_mr_size.
        let cap = 1usize << (usize::BITS - 1 - cap.leading_zeros());
        Ok(self.chunk.min(cap))
    }
}
