//! The arena's ODP prefetch: fault the pool's on-demand-paging memory into the NIC ahead of its
//! first use (`ibv_advise_mr`), so a peer's first access to a fresh buffer takes no
//! network-visible page fault; and the refill reserve (`refill.rs`). Applications' prefetch of
//! hot ranges is a feature above the allocator (`prefetch/`), built on this.
//!
//! Contract:
//! - **When.** The arena prefetches (`PrefetchWrite`, `FLUSH`) every run it commits in ODP mode
//!   and every purged range it revives (the purge dropped those pages), on its slow path,
//!   never on the allocation fast path; with a refill running (`refill.rs`) the slow path takes
//!   runs a background thread already committed and prefetched. Applications prefetch hot
//!   ranges with [`Pool::prefetch`](crate::alloc::Core::prefetch) (`Prefetch`/`PrefetchWrite`
//!   fault pages in; `PrefetchNoFault` maps only pages the CPU has, e.g. after a migration).
//!   Pinned memory needs none: it is skipped. The automatic prefetch asks for the first
//!   [`AUTO_PREFETCH_MAX`] bytes of a run at most: an ODP arena populates nothing else itself
//!   (`Vec::with_capacity` of GiBs costs what is touched, as with any lazy allocator), and the
//!   rest faults in on first touch by the CPU or the NIC.
//! - **Batching.** One `advise_mr` call per list of up to
//!   [`MAX_ADVISE_SGES`] entries (the kernel's bound, not
//!   `max_sge`); a range is cut into entries of at most 1 GiB.
//! - **Errors** (`ibv_advise_mr(3)`): `EAGAIN`/`ENOMEM` are retried [`RETRIES`] times with a
//!   growing pause (20 µs · 4ᵏ); `EOPNOTSUPP` (or a device without the verb) turns prefetch
//!   off for the arena, with the reason kept; `EFAULT`, `EINVAL`, `EPERM`, `ENOENT` are a wrong
//!   range, advice or key: a typed [`PrefetchError`] from `Pool::prefetch`, counted for the
//!   automatic prefetches, which never fail an allocation. Best effort, as the seed says:
//!   nothing relies on pages staying resident.
//! - Nothing here allocates through the global allocator (the arena's paths run inside it).
//!
//! Invariant: `advise_calls == successes + Σ failures` (retried calls count once per try).

mod error;
mod hooks;
mod refill;

pub use error::PrefetchError;
pub use refill::RESERVE_MAX;
pub(crate) use refill::{Refill, Reserve};

use crate::nic::{self, Advice, AdviseFlags, Caps, Lkey, MAX_ADVISE_SGES, Pd, Sge};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Most bytes of one fresh or revived run the arena prefetches on its own (its head: where a
/// buffer's first bytes are).
pub const AUTO_PREFETCH_MAX: usize = 4 << 20;

/// Retries of an `advise_mr` that failed with `EAGAIN` or `ENOMEM`.
pub const RETRIES: u32 = 4;

/// Longest scatter/gather entry a prefetch uses.
const MAX_ENTRY: usize = 1 << 30;

/// The errnos counted one by one, in [`PrefetchStats::failures`] order.
pub const COUNTED_ERRNOS: [i32; 7] = [
    libc::EAGAIN,
    libc::ENOMEM,
    libc::EFAULT,
    libc::EINVAL,
    libc::EPERM,
    libc::ENOENT,
    libc::EOPNOTSUPP,
];

/// What prefetching did, read without a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PrefetchStats {
    /// Whether prefetch works here (the device has `advise_mr` and did not refuse it).
    pub enabled: bool,
    /// Whether the arena prefetches by itself ([`ArenaConfig::prefetch`](crate::arena::ArenaConfig),
    /// ODP mode, and `enabled`).
    pub automatic_enabled: bool,
    /// Why it was turned off: the errno (`EOPNOTSUPP` from the device), if it was.
    pub disabled_errno: Option<i32>,
    /// `ibv_advise_mr` calls (every try).
    pub advise_calls: u64,
    /// Tries repeated after `EAGAIN`/`ENOMEM`.
    pub retries: u64,
    /// 4 KiB pages in ranges advised successfully.
    pub pages: u64,
    /// Runs and revived ranges the arena prefetched by itself.
    pub automatic: u64,
    /// ... of which failed (counted, never fatal).
    pub automatic_failures: u64,
    /// Failed tries by errno, in [`COUNTED_ERRNOS`] order, then every other errno.
    pub failures: [u64; 8],
    /// NIC page faults the device reports (the soft NIC's counter; `None` on devices that
    /// expose none through verbs).
    pub nic_page_faults: Option<u64>,
    /// Slabs committed (and prefetched) ahead of demand, waiting in the reserve.
    pub reserve_slabs: u64,
    /// The refill's target for the reserve (0: no refill running).
    pub reserve_target: u64,
    /// Slabs the refill thread put in the reserve.
    pub refilled: u64,
    /// Slabs taken from the reserve by allocations.
    pub reserve_hits: u64,
}

/// `[addr, addr + len)` of the region `lkey` as scatter/gather entries of at most
/// [`MAX_ENTRY`] bytes (allocates nothing).
pub(crate) fn entries(lkey: Lkey, addr: usize, len: usize) -> impl Iterator<Item = Sge> {
    (addr..addr + len).step_by(MAX_ENTRY).map(move |at| Sge {
        addr: at as u64,
        length: (addr + len - at).min(MAX_ENTRY) as u32,
        lkey,
    })
}

/// The arena's prefetch state (see the module contract).
pub(crate) struct Prefetcher {
    /// The arena prefetches by itself (configured, and the arena is in ODP mode).
    auto: bool,
    /// The device has the verb and did not say `EOPNOTSUPP`.
    on: AtomicBool,
    disabled: AtomicI32,
    calls: AtomicU64,
    retries: AtomicU64,
    pages: AtomicU64,
    automatic: AtomicU64,
    automatic_failures: AtomicU64,
    failures: [AtomicU64; 8],
}

fn errno_of(e: &nic::Error) -> Option<i32> {
    match e {
        nic::Error::Unsupported { .. } => Some(libc::EOPNOTSUPP),
        nic::Error::Verb { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

impl Prefetcher {
    /// Prefetch where the device has the verb; automatically too when `auto`.
    pub(crate) fn new(auto: bool, caps: &Caps) -> Prefetcher {
        let p = Prefetcher {
            auto,
            on: AtomicBool::new(caps.advise_mr),
            disabled: AtomicI32::new(0),
            calls: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            pages: AtomicU64::new(0),
            automatic: AtomicU64::new(0),
            automatic_failures: AtomicU64::new(0),
            failures: Default::default(),
        };
        if !caps.advise_mr {
            p.disabled.store(libc::EOPNOTSUPP, Relaxed);
        }
        p
    }

    /// Whether prefetch is on.
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Relaxed)
    }

    /// Whether the arena prefetches by itself.
    pub(crate) fn is_auto(&self) -> bool {
        self.auto && self.is_on()
    }

    /// Advise `[addr, addr + len)` of the region `lkey`, cut into entries and batched.
    ///
    /// # Errors
    /// See the module contract.
    pub(crate) fn advise_range(
        &self,
        pd: &Pd,
        advice: Advice,
        flags: AdviseFlags,
        lkey: Lkey,
        addr: usize,
        len: usize,
    ) -> Result<(), PrefetchError> {
        let mut list = [Sge::default(); 64];
        let mut entries = entries(lkey, addr, len).peekable();
        while entries.peek().is_some() {
            let mut n = 0;
            for (slot, e) in list.iter_mut().zip(entries.by_ref()) {
                *slot = e;
                n += 1;
            }
            self.advise(pd, advice, flags, &list[..n])?;
        }
        Ok(())
    }

    /// One `advise_mr` per [`MAX_ADVISE_SGES`] entries of `sges`, each retried as the module
    /// contract says.
    ///
    /// # Errors
    /// See the module contract.
    pub(crate) fn advise(
        &self,
        pd: &Pd,
        advice: Advice,
        flags: AdviseFlags,
        sges: &[Sge],
    ) -> Result<(), PrefetchError> {
        for batch in sges.chunks(MAX_ADVISE_SGES) {
            self.advise_batch(pd, advice, flags, batch)?;
            let bytes: u64 = batch.iter().map(|s| s.length as u64).sum();
            self.pages.fetch_add(bytes.div_ceil(4096), Relaxed);
        }
        Ok(())
    }

    fn advise_batch(
        &self,
        pd: &Pd,
        advice: Advice,
        flags: AdviseFlags,
        batch: &[Sge],
    ) -> Result<(), PrefetchError> {
        let mut tries = 0;
        loop {
            if !self.is_on() {
                return Err(PrefetchError::Disabled {
                    errno: self.disabled.load(Relaxed),
                });
            }
            self.calls.fetch_add(1, Relaxed);
            let e = match pd.advise_mr(advice, flags, batch) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let errno = errno_of(&e);
            let slot = errno
                .and_then(|n| COUNTED_ERRNOS.iter().position(|&c| c == n))
                .unwrap_or(7);
            self.failures[slot].fetch_add(1, Relaxed);
            match errno {
                Some(libc::EAGAIN | libc::ENOMEM) if tries < RETRIES => {
                    self.retries.fetch_add(1, Relaxed);
                    std::thread::sleep(Duration::from_micros(20 << (2 * tries)));
                    tries += 1;
                }
                Some(n @ (libc::EAGAIN | libc::ENOMEM)) => {
                    return Err(PrefetchError::Busy { errno: n });
                }
                Some(libc::EOPNOTSUPP | libc::ENOSYS) => {
                    self.disabled.store(libc::EOPNOTSUPP, Relaxed);
                    self.on.store(false, Relaxed);
                    tracing::info!(
                        target: "rdma_pool::prefetch",
                        "advise_mr is not supported here: prefetch turned off"
                    );
                    return Err(PrefetchError::Unsupported);
                }
                Some(libc::EFAULT) => return Err(PrefetchError::Fault),
                Some(libc::EINVAL) => return Err(PrefetchError::Invalid),
                Some(libc::EPERM) => return Err(PrefetchError::Denied),
                Some(libc::ENOENT) => return Err(PrefetchError::StaleKey),
                _ => return Err(PrefetchError::Nic(e)),
            }
        }
    }

    /// The arena's own prefetch of `[addr, addr + len)` in the ODP region `lkey`: best effort,
    /// counted, never an error.
    pub(crate) fn automatic(&self, pd: &Pd, lkey: Lkey, addr: usize, len: usize) {
        if !self.is_auto() {
            return;
        }
        self.automatic.fetch_add(1, Relaxed);
        let r = self.advise_range(
            pd,
            Advice::PrefetchWrite,
            AdviseFlags::FLUSH,
            lkey,
            addr,
            len.min(AUTO_PREFETCH_MAX),
        );
        if let Err(e) = r {
            self.automatic_failures.fetch_add(1, Relaxed);
            tracing::debug!(target: "rdma_pool::prefetch", error = %e, "automatic prefetch failed");
        }
    }

    /// A snapshot of the counters (the reserve's and the device's figures are added by the
    /// caller).
    pub(crate) fn stats(&self) -> PrefetchStats {
        let d = self.disabled.load(Relaxed);
        PrefetchStats {
            enabled: self.is_on(),
            automatic_enabled: self.is_auto(),
            disabled_errno: (d != 0).then_some(d),
            advise_calls: self.calls.load(Relaxed),
            retries: self.retries.load(Relaxed),
            pages: self.pages.load(Relaxed),
            automatic: self.automatic.load(Relaxed),
            automatic_failures: self.automatic_failures.load(Relaxed),
            failures: std::array::from_fn(|i| self.failures[i].load(Relaxed)),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_cut_into_entries_of_at_most_one_gib() {
        let e: Vec<_> = entries(Lkey(7), 0x1000, (5 << 30) / 2).collect();
        let lens: Vec<u32> = e.iter().map(|s| s.length).collect();
        assert_eq!(lens, [1 << 30, 1 << 30, 1 << 29]);
        assert_eq!(e[2].addr, 0x1000 + (2u64 << 30));
        assert!(e.iter().all(|s| s.lkey == Lkey(7)));
        assert_eq!(entries(Lkey(7), 0x1000, 0).count(), 0);
    }
}
