//! The soft NIC: an in-process software RDMA device that enforces the verbs memory semantics.
//!
//! It is a model, not a mock. RDMA READ/WRITE/SEND move real bytes between in-process peers
//! (through `mem::dma_copy`, which fails like DMA instead of crashing), and every rule below is
//! enforced; each has a test (`tests/soft_rules/`, `tests/scenarios.rs`, `tests/pinning.rs`,
//! `tests/mlx5_model.rs`) that fails if the rule is removed:
//!
//! - a key names a live region or window in the QP's PD; the range lies inside the region or
//!   window; the rights allow the operation; `REMOTE_WRITE`/`REMOTE_ATOMIC` without
//!   `LOCAL_WRITE` is `EINVAL`; binding needs `MW_BIND`; a window grants no writes its region
//!   does not allow locally (`REMOTE_WRITE`/`REMOTE_ATOMIC` windows need `LOCAL_WRITE` on the
//!   region, C10-74) — the region needs no remote rights of its own;
//! - the low 8 bits of a key are its variant: an invalidated, deregistered or rebound key is
//!   rejected with `REM_ACCESS_ERR`; a remote access error moves the requester *and* the
//!   responder QP to the error state, later work requests and the responder's receives
//!   complete with `WR_FLUSH_ERR`;
//! - a pinned region holds the pages mapped at registration: an access that finds them
//!   dropped, unmapped, remapped or reprotected fails and is counted (hardware would move the
//!   old pages; user space cannot keep them — see `pin.rs` for what stays undetectable); ODP
//!   regions follow the current mapping;
//! - RC ordering: a QP's work requests execute in order, and those behind a SEND waiting for a
//!   receive wait too; a responder that is not connected (or failed) drops requests
//!   (`RETRY_EXC_ERR`); messages above 2 GiB are `LOC_LEN_ERR`; zero-length RDMA skips the rkey
//!   and zero-length scatter/gather entries are skipped (their lkey unchecked);
//! - type 1 windows are bound by `bind_mw`, a work request on the send queue (in order, flushed
//!   behind a failure) that refuses `ZERO_BASED` (`EINVAL`), a region of another PD (`EPERM`)
//!   and windows above 2 GiB (`EOPNOTSUPP`, as mlx5) at the call; they are usable from any QP; type 2
//!   windows are bound by a BIND_MW work request and usable only through that QP; type 2 windows
//!   are invalidated by LOCAL_INV or SEND_WITH_INV, type 1 windows by a zero-length bind (the IB
//!   spec, o10-37.2.26, and kernel rxe refuse to invalidate a type 1 window);
//! - `rereg_mr` honours its three flags, keeps or changes keys per [`ReregMode`] (mlx5's
//!   rules by default, with the mkey revoked while it is updated), and poisons the region
//!   after `ERR_CMD`;
//! - ODP pages are not resident until touched or prefetched; a NIC access to a non-resident
//!   page counts a fault (costing [`SoftConfig::fault_cost`]) and succeeds only if the process
//!   can access the page; `advise_mr` follows `ibv_advise_mr(3)`;
//! - UMEM page-size bitmaps are checked against the backing page size, and UMEM access flags
//!   against what mlx5's `devx.c` accepts;
//! - limits: pinned bytes (`RLIMIT_MEMLOCK`, bypassed with `CAP_IPC_LOCK`, as the kernel does),
//!   `max_mr`, `max_mw` (both [`crate::nic::Error::Limit`]), `max_mr_size`, `max_sge`;
//!   injectable faults ([`SoftNic::fail_next`]).
//!
//! Where kernel Soft-RoCE differs, the difference is in [`crate::nic::quirks::RXE`].
//!
//! Concurrency: `Send + Sync`; the data path locks only the slots of the keys it uses and the
//! QPs involved, never a device-wide lock.

mod backend;
mod config;
mod counters;
mod cq;
mod device;
mod fabric;
mod faults;
mod keys;
pub(crate) mod mem;
mod memlock;
mod pin;
mod prefetch;
mod qp;
mod qp_exec;
mod rereg;
mod residency;
mod srq;
mod sync;
mod window;

pub use config::{MemlockLimit, ReregMode, SoftConfig};
pub use counters::Counters;

use super::error::{ReregErrorKind, Verb};
use super::types::*;
use device::Device;
pub use device::SoftNic;
use keys::KeyObj;
use residency::Residency;

impl std::fmt::Debug for SoftNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftNic")
            .field("name", &self.dev.caps.name)
            .finish()
    }
}

impl SoftNic {
    pub(crate) fn new(config: SoftConfig) -> SoftNic {
        let id = fabric::next_id();
        let dev = Device::new(id, config);
        fabric::attach(id, &dev);
        SoftNic { dev }
    }

    /// A snapshot of the counters.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, Nic};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd().unwrap();
    /// let mut buf = vec![0u8; 64];
    /// // SAFETY: `buf` outlives the region.
    /// let _mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// assert_eq!(nic.as_soft().unwrap().counters().registrations, 1);
    /// ```
    pub fn counters(&self) -> Counters {
        self.dev.counters.snapshot()
    }

    /// Make the next `n` calls of `verb` fail with `errno` (`EOPNOTSUPP` surfaces as
    /// [`crate::nic::Error::Unsupported`]). For [`Verb::ReregMr`] the failure is `ERR_CMD`; see
    /// [`SoftNic::fail_next_rereg`] for other outcomes. Post verbs fail at post time.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Nic, Verb};
    /// let nic = Nic::soft();
    /// nic.as_soft().unwrap().fail_next(Verb::AllocPd, 1, libc::ENOMEM);
    /// assert_eq!(nic.alloc_pd().unwrap_err().errno(), Some(libc::ENOMEM));
    /// assert!(nic.alloc_pd().is_ok());
    /// ```
    pub fn fail_next(&self, verb: Verb, n: u32, errno: i32) {
        self.dev.faults.arm(verb, n, errno, ReregErrorKind::Cmd);
    }

    /// Raise the asynchronous event `ev`, read by [`Nic::poll_async_event`](crate::nic::Nic).
    /// A [`AsyncEvent::DeviceFatal`] also kills the device, as the hardware's does: every verb
    /// fails with `EIO` from then on (data moved through it included).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{AsyncEvent, Nic};
    /// let nic = Nic::soft();
    /// nic.as_soft().unwrap().inject_event(AsyncEvent::DeviceFatal);
    /// assert_eq!(nic.alloc_pd().unwrap_err().errno(), Some(libc::EIO));
    /// assert_eq!(nic.poll_async_event().unwrap(), Some(AsyncEvent::DeviceFatal));
    /// ```
    pub fn inject_event(&self, ev: crate::nic::AsyncEvent) {
        if ev.is_fatal() {
            self.dev
                .dead
                .store(true, std::sync::atomic::Ordering::Release);
        }
        self.dev
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(ev);
    }

    /// Make the next `n` re-registrations fail with `kind` and `errno`.
    pub fn fail_next_rereg(&self, kind: ReregErrorKind, n: u32, errno: i32) {
        self.dev.faults.arm(Verb::ReregMr, n, errno, kind);
    }

    /// Number of pages of the ODP region `lkey` resident in the NIC, or `None` when `lkey` is
    /// not a live ODP region.
    pub fn resident_pages(&self, lkey: Lkey) -> Option<usize> {
        let slot = self.dev.keys.read(lkey.index());
        match slot.obj.as_ref() {
            Some(KeyObj::Mr(mr)) if slot.variant == lkey.variant() => {
                mr.odp.as_ref().map(Residency::count)
            }
            _ => None,
        }
    }

    /// Whether the page holding `addr` of the ODP region `lkey` is resident in the NIC.
    pub fn is_resident(&self, lkey: Lkey, addr: usize) -> bool {
        let slot = self.dev.keys.read(lkey.index());
        match slot.obj.as_ref() {
            Some(KeyObj::Mr(mr))
                if slot.variant == lkey.variant() && mr.contains(addr as u64, 1) =>
            {
                mr.odp
                    .as_ref()
                    .is_some_and(|r| r.present(addr / mem::page_size(), false))
            }
            _ => false,
        }
    }

    /// Drop `[addr, addr + len)` from every ODP region's translation, as the kernel's MMU
    /// notifier does when pages are reclaimed, migrated or unmapped.
    pub fn invalidate_odp_range(&self, addr: usize, len: usize) {
        let ps = mem::page_size();
        let end = addr.saturating_add(len);
        for index in self.dev.keys.occupied() {
            let slot = self.dev.keys.read(index);
            if let Some(KeyObj::Mr(mr)) = slot.obj.as_ref() {
                let (lo, hi) = (addr.max(mr.addr), end.min(mr.addr.saturating_add(mr.len)));
                if let (Some(res), true) = (&mr.odp, lo < hi) {
                    res.remove_range(lo / ps, (hi - 1) / ps);
                }
            }
        }
    }

    /// Check the key table's invariants (`|free| + |occupied| == capacity - 1`, and every
    /// region's bound-window count equals the windows bound to it).
    ///
    /// # Errors
    /// A description of the first violated invariant.
    ///
    /// # Examples
    /// ```
    /// let nic = rdma_pool::nic::Nic::soft();
    /// nic.as_soft().unwrap().validate().unwrap();
    /// ```
    pub fn validate(&self) -> std::result::Result<(), String> {
        self.dev.keys.validate()?;
        self.dev.validate_pd_counts()
    }

    /// Bytes this device has pinned (charged to the memlock budget).
    pub fn pinned_bytes(&self) -> u64 {
        self.dev.memlock.pinned()
    }

    /// The most bytes this device had pinned at once (what a workload's pinned memory peaked
    /// at).
    ///
    /// # Examples
    /// ```
    /// let nic = rdma_pool::nic::Nic::soft();
    /// let soft = nic.as_soft().unwrap();
    /// assert!(soft.pinned_peak_bytes() >= soft.pinned_bytes());
    /// ```
    pub fn pinned_peak_bytes(&self) -> u64 {
        self.dev.memlock.peak()
    }
}

/// Drop `[addr, addr + len)` from the ODP translations of `dev`. Allocates nothing and never
/// waits: it runs inside the allocator, possibly on a thread that holds a slot or a residency
/// lock while it allocates; such a region keeps its translations (the model then counts fewer
/// faults than hardware would, never more).
fn invalidate_in(dev: &Device, addr: usize, len: usize) {
    let ps = mem::page_size();
    let end = addr.saturating_add(len);
    for index in dev.keys.odp_indices() {
        let Some(slot) = dev.keys.try_read(index) else {
            continue;
        };
        if let Some(KeyObj::Mr(mr)) = slot.obj.as_ref() {
            let (lo, hi) = (addr.max(mr.addr), end.min(mr.addr.saturating_add(mr.len)));
            if let (Some(res), true) = (&mr.odp, lo < hi) {
                res.try_remove_range(lo / ps, (hi - 1) / ps);
            }
        }
    }
}

/// The kernel's MMU notifier, for the memory calls this crate makes (`sys/os.rs`, registered
/// by `fabric::attach`): pages of
/// `[addr, addr + len)` were dropped, unmapped or replaced, so every soft device drops their
/// ODP translations (the next NIC access faults, as on hardware). Changes made by other code
/// (its own `madvise`, `munmap`) are not seen: tests call [`SoftNic::invalidate_odp_range`].
/// Allocates nothing; skips a device list that stays busy (creation of a device elsewhere).
pub(super) fn mmu_notify(addr: usize, len: usize) {
    fabric::for_each_live(|dev| invalidate_in(dev, addr, len));
}
