//! The arena's counters: plain atomics bumped on the slow path, read as one `Copy` snapshot
//! without a lock.
//!
//! Invariants (at quiescence): `committed_bytes == SLAB * (slabs_hugetlb + slabs_thp +
//! slabs_small)`; `registered_bytes <= committed_bytes`; `mrs == regs + fallbacks_to_new_mr`
//! counted over registrations still alive.

use super::fork::ForkPolicy;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of an arena's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStats {
    /// Bytes of address space reserved.
    pub reserved_bytes: u64,
    /// Bytes committed (faulted in) as slabs.
    pub committed_bytes: u64,
    /// Bytes covered by live registrations.
    pub registered_bytes: u64,
    /// Slabs backed by hugetlb pages.
    pub slabs_hugetlb: u64,
    /// Slabs in `MADV_HUGEPAGE` memory (transparent huge pages where the kernel finds them).
    pub slabs_thp: u64,
    /// Slabs of ordinary 4 KiB pages.
    pub slabs_small: u64,
    /// Live memory regions.
    pub mrs: u64,
    /// `reg_mr` calls that succeeded.
    pub regs: u64,
    /// Successful growths of a tail region by `rereg_mr(CHANGE_TRANSLATION)`.
    pub reregs: u64,
    /// Of those, how many came back with new keys (never handed out, so harmless).
    pub rereg_new_keys: u64,
    /// Growths that registered a region of their own: the tail's keys had been handed out,
    /// re-registration is off or unsupported, or it failed and left the old region valid.
    pub fallbacks_to_new_mr: u64,
    /// Re-registrations that ended in `IBV_REREG_MR_ERR_CMD` (region registered anew).
    pub rereg_cmd_errors: u64,
    /// Chunks opened.
    pub chunks: u64,
    /// Runs handed out.
    pub runs: u64,
    /// Runs that failed (commit or registration), their slabs returned.
    pub failed_runs: u64,
    /// The fork policy chosen at creation.
    pub fork: ForkPolicy,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) committed_bytes: AtomicU64,
    pub(crate) registered_bytes: AtomicU64,
    pub(crate) slabs_hugetlb: AtomicU64,
    pub(crate) slabs_thp: AtomicU64,
    pub(crate) slabs_small: AtomicU64,
    pub(crate) mrs: AtomicU64,
    pub(crate) regs: AtomicU64,
    pub(crate) reregs: AtomicU64,
    pub(crate) rereg_new_keys: AtomicU64,
    pub(crate) fallbacks_to_new_mr: AtomicU64,
    pub(crate) rereg_cmd_errors: AtomicU64,
    pub(crate) chunks: AtomicU64,
    pub(crate) runs: AtomicU64,
    pub(crate) failed_runs: AtomicU64,
}

/// `counter += n`.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

/// `counter -= n`.
pub(crate) fn sub(c: &AtomicU64, n: u64) {
    c.fetch_sub(n, Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self, reserved_bytes: u64, fork: ForkPolicy) -> ArenaStats {
        let r = |c: &AtomicU64| c.load(Relaxed);
        ArenaStats {
            reserved_bytes,
            committed_bytes: r(&self.committed_bytes),
            registered_bytes: r(&self.registered_bytes),
            slabs_hugetlb: r(&self.slabs_hugetlb),
            slabs_thp: r(&self.slabs_thp),
            slabs_small: r(&self.slabs_small),
            mrs: r(&self.mrs),
            regs: r(&self.regs),
            reregs: r(&self.reregs),
            rereg_new_keys: r(&self.rereg_new_keys),
            fallbacks_to_new_mr: r(&self.fallbacks_to_new_mr),
            rereg_cmd_errors: r(&self.rereg_cmd_errors),
            chunks: r(&self.chunks),
            runs: r(&self.runs),
            failed_runs: r(&self.failed_runs),
            fork,
        }
    }
}
