//! How an arena is laid out and registered: [`ArenaConfig`] and the hugepage policy.
//!
//! Contract: `reserve` and `chunk` are powers of two with `SLAB <= chunk <= reserve`; the
//! arena clamps `chunk` to the device's `max_mr_size` (rounded down to a power of two) and
//! reports the size it used. `remote` is a subset of [`Access::REMOTE`]: empty by default, so
//! the pool's own rkeys give a peer nothing.

use super::{Error, SLAB};
use crate::nic::Access;

/// Which pages back the arena's slabs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Hugepages {
    /// hugetlb 2 MiB pages or fail ([`Error::HugepagesUnavailable`]).
    Require,
    /// hugetlb pages while the pool has them, then transparent huge pages, then 4 KiB pages;
    /// each slab's kind is counted in the stats.
    #[default]
    Prefer,
    /// Ordinary 4 KiB pages (`MADV_NOHUGEPAGE`).
    Off,
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
    pub remote: Access,
    /// Grow a chunk's tail region with `ibv_rereg_mr(CHANGE_TRANSLATION)` while its keys were
    /// never handed out (fewer regions); `false` registers every growth step as its own region.
    pub grow_by_rereg: bool,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        ArenaConfig {
            reserve: 64 << 30,
            chunk: 1 << 30,
            hugepages: Hugepages::Prefer,
            remote: Access::empty(),
            grow_by_rereg: true,
        }
    }
}

impl ArenaConfig {
    /// Check the configuration against `max_mr_size`, returning the chunk size to use.
    pub(crate) fn chunk_for(&self, max_mr_size: u64) -> Result<usize, Error> {
        if !self.reserve.is_power_of_two() || !self.chunk.is_power_of_two() {
            return Err(Error::Config("reserve and chunk must be powers of two"));
        }
        if self.chunk < SLAB || self.chunk > self.reserve {
            return Err(Error::Config("chunk must be between 2 MiB and reserve"));
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
