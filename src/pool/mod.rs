//! [`Pool`]: the one handle an application holds. It composes the allocator core
//! ([`Core`], `alloc/`) with the features built on it — grants (`grant/`), queue memory
//! (`queue_mem/`); prefetch and rails are methods of the core — and dereferences to the core,
//! so `pool.alloc(..)`, `pool.keys_of(..)`, `Vec::new_in(&pool)` and `pool.grant(..)` are all
//! calls on one value. [`GlobalPool`](crate::GlobalPool) is a thin front end over a `Pool`.
//!
//! Contract:
//! - the features' state lives in one mapping of its own (`Features`), never in the global
//!   allocator, at an address that does not move with the handle: the grants' quarantine
//!   hook points into it;
//! - construction: the core, then the features, then the hook (`Core::set_quarantine`) and
//!   the NIC's completion sink for grants; nothing is shared before all three are in place;
//! - drop, in reverse: the grants finish (keys killed, parked blocks freed), the hook is
//!   taken out (under the pool registry's lock, so the completion router never reaches
//!   grants that are going), the features go (windows deallocated, UMEMs deregistered, the
//!   grant tag given back — even when the core then stays mapped for live blocks), and the
//!   core last (its refill thread, which touches only the arena, then its regions and arena).
//!
//! Files: `error.rs` ([`PoolError`]), `grant.rs` and `queue.rs` (the features' calls),
//! `stats.rs` (the one [`Stats`] tree).

mod error;
mod grant;
mod queue;
mod stats;

pub use error::PoolError;
pub use stats::Stats;

use crate::alloc::Core;
use crate::alloc::api2::RawBlocks;
use crate::arena::{ArenaConfig, Error};
use crate::grant::Grants;
use crate::nic::Pd;
use crate::queue_mem::QueueMem;
use crate::sys::os::MmapBox;
use std::alloc::Layout;
use std::mem::ManuallyDrop;

/// A pool of NIC-registered memory: allocate from it through `&Pool` (allocator-api2's
/// `Allocator`, e.g. `allocator_api2::vec::Vec::new_in(&pool)`) or the raw methods of its
/// [`Core`] (which it dereferences to), grant a peer one buffer ([`Pool::grant`]), carve queue
/// memory ([`Pool::queue_memory`]). Several pools may live in one process (say, one per
/// device or PD).
///
/// Dropping a pool while blocks it handed out are still live does **not** unmap them: the pool
/// then leaves its arena mapped and registered for the rest of the process (and says so in a
/// `tracing` warning), so those blocks stay valid memory; without live blocks, dropping
/// deregisters every region and unmaps the arena.
///
/// # Examples
/// ```
/// use allocator_api2::vec::Vec;
/// use rdma_pool::Pool;
/// use rdma_pool::nic::Nic;
/// let pd = Nic::soft().alloc_pd()?;
/// let pool = Pool::new(&pd)?;
/// let mut v: Vec<u8, &Pool> = Vec::new_in(&pool);
/// v.extend_from_slice(b"NIC-ready");
/// let keys = pool.keys_of(v.as_ptr()).unwrap();
/// assert!(keys.contains(v.as_ptr() as usize, v.len()));
/// # Ok::<(), rdma_pool::PoolError>(())
/// ```
pub struct Pool {
    /// The allocator core, which `Pool` dereferences to.
    core: Core,
    features: ManuallyDrop<MmapBox<Features>>,
}

/// What the features keep, beside the core.
struct Features {
    /// The grants (`grant/`): windows, dedicated regions, the ledger.
    grants: Grants,
    /// DEVX queue memory (`queue_mem/`).
    queue: QueueMem,
    /// The free path's quarantine: the grants' ledger (`grant/ledger.rs`).
    quarantine: crate::alloc::Quarantine,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("arena", self.core.arena())
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for Pool {
    type Target = Core;

    #[inline(always)]
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl Pool {
    /// A pool over a fresh arena on `pd` with the default [`ArenaConfig`] (64 GiB reserved,
    /// hugepages preferred, no remote rights).
    ///
    /// # Errors
    /// As [`Pool::with_config`].
    ///
    /// # Examples
    /// ```
    /// let pool = rdma_pool::Pool::new(&rdma_pool::Nic::soft().alloc_pd()?)?;
    /// assert_eq!(pool.live_blocks(), 0);
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn new(pd: &Pd) -> Result<Pool, PoolError> {
        Pool::with_config(pd, ArenaConfig::default())
    }

    /// A pool over a fresh arena configured by `cfg`, with the environment's `RDMA_POOL_*`
    /// overrides applied (as every pool does: see [`ArenaConfig::with_env`]; an unknown value
    /// is counted in [`PoolStats::env_ignored`](crate::PoolStats::env_ignored)).
    ///
    /// # Errors
    /// [`PoolError::Arena`] as [`Arena::new`](crate::arena::Arena::new), or when 256 pools are
    /// already alive; [`PoolError::Grants`] when the grants' state cannot be set up.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::Pool;
    /// use rdma_pool::arena::{ArenaConfig, Hugepages};
    /// let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// let cfg = ArenaConfig { reserve: 1 << 32, hugepages: Hugepages::Off, ..Default::default() };
    /// let pool = Pool::with_config(&pd, cfg)?;
    /// assert_eq!(pool.stats().alloc.arena.reserved_bytes, 1 << 32);
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn with_config(pd: &Pd, cfg: ArenaConfig) -> Result<Pool, PoolError> {
        Pool::compose(Core::with_config(pd, cfg)?)
    }

    /// [`Pool::with_config`] with remote rights on the pool's own regions (`cfg.remote`): the
    /// pool's rkey (`keys_of(..).rkey`) then lets a peer reach any block of the pool (see
    /// [`Arena::with_remote_rights`](crate::arena::Arena::with_remote_rights)).
    ///
    /// # Safety
    /// Whoever holds the pool's rkey may read (and with `REMOTE_WRITE`/`REMOTE_ATOMIC` write)
    /// any memory of the pool — live blocks, freed ones still holding another allocation's
    /// bytes, the pool's free lists inside freed blocks — at any time. Every peer given it
    /// must be trusted to touch only the blocks and at the times the program's protocol
    /// allows, and the program must access a block a peer may write only once that protocol
    /// says the write completed. (Per-buffer grants, [`Pool::grant`]/[`Pool::grant_owned`],
    /// need none of this.)
    ///
    /// # Errors
    /// As [`Pool::with_config`].
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::Pool;
    /// use rdma_pool::arena::ArenaConfig;
    /// use rdma_pool::nic::{Access, Nic};
    /// let pd = Nic::soft().alloc_pd()?;
    /// let cfg = ArenaConfig { remote: Access::REMOTE_WRITE, ..Default::default() };
    /// assert!(Pool::with_config(&pd, cfg.clone()).is_err());
    /// // SAFETY: no peer gets the key in this example.
    /// let pool = unsafe { Pool::with_remote_rights(&pd, cfg) }?;
    /// assert!(pool.arena().access().contains(Access::REMOTE_WRITE));
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub unsafe fn with_remote_rights(pd: &Pd, cfg: ArenaConfig) -> Result<Pool, PoolError> {
        // SAFETY: forwarded from the caller.
        Pool::compose(unsafe { Core::with_remote_rights(pd, cfg) }?)
    }

    /// The features beside `core`, and the hooks that tie them to it.
    fn compose(core: Core) -> Result<Pool, PoolError> {
        let grants = Grants::new().map_err(PoolError::from_grants_errno)?;
        let features = Features {
            quarantine: grants.quarantine(),
            grants,
            queue: QueueMem::default(),
        };
        let mut features = MmapBox::new(features).map_err(|(_, errno)| PoolError::Grants {
            what: "mmap of the features' state",
            errno,
        })?;
        // The grants moved into the mapping: the hook names them where they are now.
        let f = features.get_mut();
        f.quarantine = f.grants.quarantine();
        // SAFETY: the quarantine and the grants it names live in the mapping until the drop,
        // which takes the hook out before they go; parking is thread-safe.
        unsafe { core.set_quarantine(Some(&features.quarantine)) };
        crate::nic::set_grant_sink(crate::grant::route);
        Ok(Pool {
            core,
            features: ManuallyDrop::new(features),
        })
    }

    /// The pool's allocator core (what `*pool` is).
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// Check the invariants of every page, of the arena, of the grants and of the queue
    /// memory (at quiescence; for tests).
    ///
    /// # Examples
    /// ```
    /// let pool = rdma_pool::Pool::new(&rdma_pool::Nic::soft().alloc_pd()?)?;
    /// assert!(pool.validate());
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn validate(&self) -> bool {
        self.core.validate() && self.features.grants.validate() && self.features.queue.validate()
    }

    /// Deregister the pool from `pd`, a rail attached with [`Core::attach`], and free the rail:
    /// keys of this rail stop working; no key of the pool's own device or of another rail
    /// changes. Grants are held off meanwhile.
    ///
    /// # Errors
    /// [`Error::Busy`] while a grant whose QP is in `pd` is open; [`Error::InvalidArgument`]
    /// when `pd` is not attached; [`Error::Reentrant`] from inside the arena's own
    /// provisioning. A region the device refuses to deregister (a window still bound to it) is
    /// dropped anyway, which logs it as leaked, and the first such error is returned after the
    /// rail is freed.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::Pool;
    /// # use rdma_pool::nic::Nic;
    /// # let (rail0, rail1) = (Nic::soft(), Nic::soft());
    /// # let pool = Pool::new(&rail0.alloc_pd()?)?;
    /// let pd1 = rail1.alloc_pd()?;
    /// pool.attach(&pd1)?;
    /// let b = allocator_api2::boxed::Box::new_in([0u8; 256], &pool);
    /// pool.detach(&pd1)?;
    /// assert_eq!(pool.keys_of_on(b.as_ptr(), &rail1), None);
    /// assert!(pool.keys_of_on(b.as_ptr(), &rail0).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn detach(&self, pd: &Pd) -> Result<(), Error> {
        self.features
            .grants
            .without_grants_on(pd, || self.core.arena().detach(pd))
            .unwrap_or(Err(Error::Busy("open grants use this PD")))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // No grant handle is alive (they borrow the pool): kill the keys of grants still
        // revoking and free their parked blocks, while the core can take them.
        self.features.grants.shutdown(&self.core);
        // SAFETY: taking the hook out; nothing parks any more.
        unsafe { self.core.set_quarantine(None) };
        // SAFETY: taken once, here; the handle is not used afterwards. The features go before
        // the core (windows and UMEMs before the arena's regions and slabs).
        drop(unsafe { ManuallyDrop::take(&mut self.features) });
    }
}

/// The core's blocks, with its rules.
impl RawBlocks for Pool {
    #[inline(always)]
    fn raw_alloc(&self, layout: Layout, zero: bool) -> *mut u8 {
        self.core.raw_alloc(layout, zero)
    }

    #[inline(always)]
    unsafe fn raw_free(&self, p: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller.
        unsafe { self.core.raw_free(p, layout) }
    }

    #[inline(always)]
    unsafe fn raw_realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded from the caller.
        unsafe { self.core.raw_realloc(p, layout, new_size) }
    }
}

crate::alloc::api2::allocator!(Pool);
