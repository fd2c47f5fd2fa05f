//! A soft device's counters: what it did and what it refused, for tests and for the pool's
//! stats.
//!
//! Contract: every counter only grows (relaxed atomics, no ordering with the data they count);
//! a snapshot reads each counter once, so counters of one snapshot may be from slightly
//! different instants.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a soft device's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Successful `reg_mr` calls.
    pub registrations: u64,
    /// Successful `dereg_mr` calls.
    pub deregistrations: u64,
    /// Successful `rereg_mr` calls.
    pub reregs: u64,
    /// ODP page faults taken by the NIC.
    pub page_faults: u64,
    /// Pages made resident by `advise_mr`.
    pub prefetched_pages: u64,
    /// Accesses refused by a key, bound, right or PD check.
    pub rejected_accesses: u64,
    /// Successful window binds.
    pub mw_binds: u64,
    /// Successful window invalidations.
    pub invalidations: u64,
    /// Bytes moved by RDMA READ/WRITE/SEND.
    pub bytes_moved: u64,
    /// Calls failed by fault injection.
    pub injected_faults: u64,
    /// Accesses refused because a pinned region's pages are no longer the ones the process
    /// sees (dropped, unmapped, remapped or reprotected after registration; hardware would
    /// move the old pages).
    pub stale_pinned_accesses: u64,
    /// Pinned regions deregistered (or re-registered onto another translation) after the
    /// process had dropped or replaced pages they held: for as long as they were registered,
    /// hardware would have moved pages the process no longer saw (a purge before the
    /// deregistration, say). Counted even when no access met them.
    pub stale_pinned_releases: u64,
}

#[derive(Default)]
pub(super) struct AtomicCounters {
    pub(super) registrations: AtomicU64,
    pub(super) deregistrations: AtomicU64,
    pub(super) reregs: AtomicU64,
    pub(super) page_faults: AtomicU64,
    pub(super) prefetched_pages: AtomicU64,
    pub(super) rejected_accesses: AtomicU64,
    pub(super) mw_binds: AtomicU64,
    pub(super) invalidations: AtomicU64,
    pub(super) bytes_moved: AtomicU64,
    pub(super) injected_faults: AtomicU64,
    pub(super) stale_pinned_accesses: AtomicU64,
    pub(super) stale_pinned_releases: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl AtomicCounters {
    /// Read every counter once.
    pub(super) fn snapshot(&self) -> Counters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            registrations: l(&self.registrations),
            deregistrations: l(&self.deregistrations),
            reregs: l(&self.reregs),
            page_faults: l(&self.page_faults),
            prefetched_pages: l(&self.prefetched_pages),
            rejected_accesses: l(&self.rejected_accesses),
            mw_binds: l(&self.mw_binds),
            invalidations: l(&self.invalidations),
            bytes_moved: l(&self.bytes_moved),
            injected_faults: l(&self.injected_faults),
            stale_pinned_accesses: l(&self.stale_pinned_accesses),
            stale_pinned_releases: l(&self.stale_pinned_releases),
        }
    }
}
