//! Pinned-memory accounting: the kernel's `mm->pinned_vm` against `RLIMIT_MEMLOCK`.
//!
//! Contract: pinning `[addr, addr + len)` charges every page it touches
//! ([`page_span`]); the same pages registered twice are charged twice, as the kernel does. The
//! budget is per process ([`MemlockLimit::Rlimit`]: all soft devices share one account, the
//! limit is read at each charge, and `CAP_IPC_LOCK` — checked once, at device creation —
//! bypasses it) or per device ([`MemlockLimit::Bytes`]). A charge that would exceed the budget
//! fails with `ENOMEM` and charges nothing.
//!
//! Invariant: `PINNED == Σ devices' pinned` over the devices on the process account, and each
//! device's `pinned` equals the charges of its live regions and UMEMs.

use super::config::MemlockLimit;
use super::mem;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes pinned by all soft devices of this process on the process account.
static PINNED: AtomicU64 = AtomicU64::new(0);

/// Bytes of the pages `[addr, addr + len)` touches: what pinning it charges.
pub(super) fn page_span(addr: usize, len: usize) -> u64 {
    let ps = mem::page_size();
    ((addr + len).div_ceil(ps) - addr / ps) as u64 * ps as u64
}

/// One device's memlock account.
pub(super) struct Memlock {
    limit: MemlockLimit,
    /// `CAP_IPC_LOCK`: the process limit does not apply.
    privileged: bool,
    pinned: AtomicU64,
    /// The most `pinned` ever was.
    peak: AtomicU64,
}

impl Memlock {
    pub(super) fn new(limit: MemlockLimit) -> Memlock {
        Memlock {
            limit,
            privileged: matches!(limit, MemlockLimit::Rlimit) && mem::has_cap_ipc_lock(),
            pinned: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    /// Bytes this device has pinned.
    pub(super) fn pinned(&self) -> u64 {
        self.pinned.load(Ordering::Relaxed)
    }

    /// The most bytes this device had pinned at once.
    pub(super) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Charge `bytes`, or fail with `ENOMEM` charging nothing.
    pub(super) fn charge(&self, bytes: u64) -> Result<(), i32> {
        let (account, limit) = match self.limit {
            MemlockLimit::Unlimited => (&PINNED, u64::MAX),
            MemlockLimit::Bytes(b) => (&self.pinned, b),
            MemlockLimit::Rlimit if self.privileged => (&PINNED, u64::MAX),
            MemlockLimit::Rlimit => (&PINNED, mem::memlock_rlimit()),
        };
        let mut cur = account.load(Ordering::Relaxed);
        loop {
            let new = cur
                .checked_add(bytes)
                .filter(|&n| n <= limit)
                .ok_or(libc::ENOMEM)?;
            match account.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(c) => cur = c,
            }
        }
        let now = if matches!(self.limit, MemlockLimit::Bytes(_)) {
            self.pinned.load(Ordering::Relaxed)
        } else {
            self.pinned.fetch_add(bytes, Ordering::Relaxed) + bytes
        };
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(())
    }

    /// Return `bytes` charged earlier.
    pub(super) fn release(&self, bytes: u64) {
        self.pinned.fetch_sub(bytes, Ordering::Relaxed);
        if !matches!(self.limit, MemlockLimit::Bytes(_)) {
            PINNED.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_counts_every_page_touched() {
        let ps = mem::page_size();
        assert_eq!(page_span(0, 1), ps as u64);
        assert_eq!(page_span(ps - 1, 2), 2 * ps as u64);
        assert_eq!(page_span(ps, ps), ps as u64);
    }

    #[test]
    fn a_device_budget_refuses_without_charging() {
        let m = Memlock::new(MemlockLimit::Bytes(8192));
        m.charge(4096).unwrap();
        assert_eq!(m.charge(8192), Err(libc::ENOMEM));
        assert_eq!(m.pinned(), 4096);
        assert_eq!(m.peak(), 4096);
        m.release(4096);
        m.charge(8192).unwrap();
    }
}
