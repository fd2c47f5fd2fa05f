//! The arena's side of prefetching: its prefetch state and reserve of ready slabs, as the
//! crate's other layers reach them; the automatic prefetch of a run just committed or revived;
//! and [`Arena::prefetch_stats`].
//!
//! Contract (see the module contract in `mod.rs`):
//! - only a run in an ODP region is prefetched, and only while prefetch is automatic and the
//!   device is not dead; pinned memory is skipped;
//! - nothing here allocates through the global allocator or fails an allocation.

use crate::arena::{Arena, prefetch};

impl Arena {
    /// The prefetch state.
    pub(crate) fn prefetcher(&self) -> &prefetch::Prefetcher {
        &self.prefetch
    }

    /// The reserve of ready slabs.
    pub(crate) fn ahead(&self) -> &prefetch::Reserve {
        &self.ahead
    }

    /// Prefetch a run just committed or revived, if its region (`id`) is an ODP region.
    pub(crate) fn prefetch_fresh(&self, id: Option<u32>, addr: usize, len: usize) {
        let Some(id) = id else { return };
        // A sparse slab is touched a block at a time: prefetching it whole would fault in
        // (and charge) every page of it; the first touch by CPU or NIC faults what is used.
        if self.device_dead() || self.is_sparse(addr) {
            return;
        }
        let reg = self.table.reg(id);
        if reg.is_odp() && self.prefetch.is_auto() {
            self.prefetch
                .automatic(&self.pd, reg.keys().lkey, addr, len);
        }
    }

    /// What prefetching did, with the reserve's and the device's figures.
    pub fn prefetch_stats(&self) -> prefetch::PrefetchStats {
        let (held, target, refilled, hits) = self.ahead.counts();
        prefetch::PrefetchStats {
            reserve_slabs: held,
            reserve_target: target,
            refilled,
            reserve_hits: hits,
            nic_page_faults: self.pd.nic().as_soft().map(|s| s.counters().page_faults),
            ..self.prefetch.stats()
        }
    }
}
