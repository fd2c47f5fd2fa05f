//! The soft NIC: an in-process software RDMA device that enforces the verbs memory semantics.
//!
//! It is a model, not a mock. RDMA READ/WRITE/SEND move real bytes between in-process peers
//! (through [`mem::dma_copy`], which fails like DMA instead of crashing), and every rule below is
//! enforced; each has a test in `tests/soft_rules.rs` that fails if the rule is removed:
//!
//! - a key names a live region or window in the QP's PD; the range lies inside the region or
//!   window; the rights allow the operation; `REMOTE_WRITE`/`REMOTE_ATOMIC` without
//!   `LOCAL_WRITE` is `EINVAL`; binding needs `MW_BIND`; a window grants no writes its region
//!   does not allow locally (`REMOTE_WRITE`/`REMOTE_ATOMIC` windows need `LOCAL_WRITE` on the
//!   region, C10-74) — the region needs no remote rights of its own;
//! - the low 8 bits of a key are its variant: an invalidated, deregistered or rebound key is
//!   rejected with `REM_ACCESS_ERR`, the requester QP enters the error state and later work
//!   requests complete with `WR_FLUSH_ERR`;
//! - RC ordering: a QP's work requests execute in order, and those behind a SEND waiting for a
//!   receive wait too; a responder that is not connected (or failed) drops requests
//!   (`RETRY_EXC_ERR`); messages above 2 GiB are `LOC_LEN_ERR`; zero-length RDMA skips the rkey;
//! - type 1 windows are bound by `bind_mw` on a QP of their PD and usable from any QP; type 2
//!   windows are bound by a BIND_MW work request and usable only through that QP; type 2 windows
//!   are invalidated by LOCAL_INV or SEND_WITH_INV, type 1 windows by a zero-length bind (the IB
//!   spec, o10-37.2.26, and kernel rxe refuse to invalidate a type 1 window);
//! - `rereg_mr` honours its three flags, keeps or changes keys per [`ReregMode`], and poisons
//!   the region after `ERR_CMD`;
//! - ODP pages are not resident until touched or prefetched; a NIC access to a non-resident
//!   page counts a fault (costing [`SoftConfig::fault_cost`]) and succeeds only if the process
//!   can access the page; `advise_mr` follows `ibv_advise_mr(3)`;
//! - UMEM page-size bitmaps are checked against the backing page size;
//! - limits: pinned bytes (`RLIMIT_MEMLOCK`, bypassed with `CAP_IPC_LOCK`, as the kernel does),
//!   `max_mr`, `max_mw`, `max_mr_size`, `max_sge`; injectable faults ([`SoftNic::fail_next`]).
//!
//! Where kernel Soft-RoCE differs, the difference is in [`crate::nic::quirks::RXE`].
//!
//! Concurrency: `Send + Sync`; the data path locks only the slots of the keys it uses and the
//! QPs involved, never a device-wide lock.

mod keys;
pub(crate) mod mem;
mod pin;
mod qp;
mod rereg;

use super::backend::{Backend, RawBind, RawMr, RawSendWr};
use super::error::{Error, ReregError, ReregErrorKind, Result, Verb};
use super::types::*;
use keys::{KeyObj, KeyTable, MrObj, MwObj, Residency};
use qp::{CqObj, QpObj};
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// What `rereg_mr` does on a soft device: which real device it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReregMode {
    /// As mlx5 (`mlx5_ib_rereg_user_mr`, 6.x mkey cache): PD and in-place access changes keep
    /// the keys; a translation change keeps them only for a pinned region whose mkey came
    /// from the cache and whose new translation fits the cache entry, and then the mkey is
    /// revoked while it is updated ([`SoftConfig::umr_revoke_time`]); every other change
    /// (ODP translation, `MW_BIND`/`ON_DEMAND` toggled, a region outgrowing its entry) gets
    /// new keys. The default: callers must handle both outcomes, as on mlx5.
    #[default]
    Mlx5,
    /// Every change in place, keys always kept, no revoke window. No real provider promises
    /// this; it is the best case, for tests of the path that relies on kept keys.
    KeepKeys,
    /// Every change hands out new keys (the old ones stop working): a device that rebuilds
    /// the region each time, the worst case short of refusing.
    ChangeKeys,
    /// Refuse with `ERR_CMD` / `EOPNOTSUPP`, as kernel rxe does (it has no `rereg_mr`).
    Unsupported,
}

/// How much memory a soft device lets the process pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemlockLimit {
    /// Follow `RLIMIT_MEMLOCK`, bypassed with `CAP_IPC_LOCK` (root), as the kernel does.
    #[default]
    Rlimit,
    /// A fixed budget in bytes for this device, whoever the process is.
    Bytes(u64),
    /// No limit.
    Unlimited,
}

/// Configuration of a soft device.
#[derive(Debug, Clone)]
pub struct SoftConfig {
    /// Device name; `soft<N>` when `None`.
    pub name: Option<String>,
    /// Re-registration behaviour.
    pub rereg: ReregMode,
    /// Explicit ODP support.
    pub odp: bool,
    /// Implicit ODP support.
    pub implicit_odp: bool,
    /// `ibv_advise_mr` support.
    pub advise_mr: bool,
    /// Type 1 windows.
    pub mw_type1: bool,
    /// Type 2 windows.
    pub mw_type2: bool,
    /// DEVX UMEM support.
    pub devx: bool,
    /// `max_mr`.
    pub max_mr: u32,
    /// `max_mw`.
    pub max_mw: u32,
    /// `max_mr_size`.
    pub max_mr_size: u64,
    /// `max_sge`.
    pub max_sge: u32,
    /// Pinned-memory budget.
    pub memlock: MemlockLimit,
    /// Simulated cost of one ODP page fault taken by the NIC.
    pub fault_cost: Duration,
    /// How long a re-registration that keeps the keys of a pinned region keeps its mkey revoked
    /// ([`ReregMode::Mlx5`]); traffic on its keys fails meanwhile. Zero: the update is
    /// instantaneous (but still never seen half-done).
    pub umr_revoke_time: Duration,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            name: None,
            rereg: ReregMode::Mlx5,
            odp: true,
            implicit_odp: true,
            advise_mr: true,
            mw_type1: true,
            mw_type2: true,
            devx: true,
            max_mr: 1 << 14,
            max_mw: 1 << 14,
            max_mr_size: 1 << 40,
            max_sge: 32,
            memlock: MemlockLimit::Rlimit,
            fault_cost: Duration::ZERO,
            umr_revoke_time: Duration::ZERO,
        }
    }
}

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
}

#[derive(Default)]
struct AtomicCounters {
    registrations: AtomicU64,
    deregistrations: AtomicU64,
    reregs: AtomicU64,
    page_faults: AtomicU64,
    prefetched_pages: AtomicU64,
    rejected_accesses: AtomicU64,
    mw_binds: AtomicU64,
    invalidations: AtomicU64,
    bytes_moved: AtomicU64,
    injected_faults: AtomicU64,
    stale_pinned_accesses: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

struct InjectedFault {
    verb: Verb,
    remaining: u32,
    errno: i32,
    rereg_kind: ReregErrorKind,
}

/// Bytes pinned by all soft devices of this process (the kernel's `mm->pinned_vm`).
static PINNED: AtomicU64 = AtomicU64::new(0);
static NEXT_DEVICE: AtomicU32 = AtomicU32::new(0);
/// The in-process fabric: soft devices by id, for connecting QPs (control path only).
static FABRIC: Mutex<Vec<(u32, Weak<Device>)>> = Mutex::new(Vec::new());

pub(crate) struct Device {
    id: u32,
    caps: Caps,
    config: SoftConfig,
    keys: KeyTable,
    counters: AtomicCounters,
    faults: Mutex<Vec<InjectedFault>>,
    faults_armed: AtomicUsize,
    /// PDs: the slab key is the handle, the value counts the objects that use the PD.
    pds: Mutex<slab::Slab<u32>>,
    next_handle: AtomicU64,
    cqs: Sharded<Arc<CqObj>>,
    qps: Sharded<Arc<QpObj>>,
    qpns: Mutex<HashMap<u32, Weak<QpObj>>>,
    next_qpn: AtomicU32,
    /// UMEMs: the slab key is the handle; (UMEM id, pinned bytes).
    umems: Mutex<slab::Slab<(u32, u64)>>,
    mr_count: AtomicU32,
    mw_count: AtomicU32,
    pinned: AtomicU64,
    prefetch_tx: Mutex<Option<crossbeam::channel::Sender<PrefetchJob>>>,
}

struct PrefetchJob {
    lkey: u32,
    addr: u64,
    len: u64,
    write: bool,
}

impl keys::FaultSink for Device {
    fn page_fault(&self) {
        bump(&self.counters.page_faults, 1);
        if !self.config.fault_cost.is_zero() {
            std::thread::sleep(self.config.fault_cost);
        }
    }
    fn rejected(&self, why: keys::KeyFault) {
        bump(&self.counters.rejected_accesses, 1);
        if why == keys::KeyFault::PinnedPagesGone {
            bump(&self.counters.stale_pinned_accesses, 1);
        }
    }
}

/// A soft RDMA device. Obtain one through [`crate::nic::Nic::soft`] and reach it with
/// [`crate::nic::Nic::as_soft`] for counters and fault injection.
pub struct SoftNic {
    dev: Arc<Device>,
}

impl std::fmt::Debug for SoftNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftNic")
            .field("name", &self.dev.caps.name)
            .finish()
    }
}

impl SoftNic {
    pub(crate) fn new(config: SoftConfig) -> SoftNic {
        let id = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
        let caps = Caps {
            name: config.name.clone().unwrap_or_else(|| format!("soft{id}")),
            driver: "soft".into(),
            max_mr_size: config.max_mr_size,
            max_mr: config.max_mr,
            max_mw: if config.mw_type1 || config.mw_type2 {
                config.max_mw
            } else {
                0
            },
            max_sge: config.max_sge,
            max_qp_wr: 16384,
            max_cqe: 1 << 20,
            odp: OdpCaps {
                explicit: config.odp,
                implicit: config.odp && config.implicit_odp,
                rc: if config.odp {
                    OdpOps::all()
                } else {
                    OdpOps::empty()
                },
            },
            rereg_mr: config.rereg != ReregMode::Unsupported,
            mw_type1: config.mw_type1,
            mw_type2: config.mw_type2,
            advise_mr: config.advise_mr,
            devx: config.devx,
            path_mtu: 4096,
        };
        let dev = Arc::new(Device {
            id,
            keys: KeyTable::new(
                config
                    .max_mr
                    .saturating_add(config.max_mw)
                    .saturating_add(1),
            ),
            caps,
            config,
            counters: AtomicCounters::default(),
            faults: Mutex::new(Vec::new()),
            faults_armed: AtomicUsize::new(0),
            pds: Mutex::new(slab::Slab::new()),
            next_handle: AtomicU64::new(1),
            cqs: Sharded::default(),
            qps: Sharded::default(),
            qpns: Mutex::new(HashMap::new()),
            next_qpn: AtomicU32::new(0x11),
            umems: Mutex::new(slab::Slab::new()),
            mr_count: AtomicU32::new(0),
            mw_count: AtomicU32::new(0),
            pinned: AtomicU64::new(0),
            prefetch_tx: Mutex::new(None),
        });
        let mut fabric = lock(&FABRIC);
        fabric.retain(|(_, w)| w.strong_count() > 0);
        fabric.push((id, Arc::downgrade(&dev)));
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
        let c = &self.dev.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            registrations: l(&c.registrations),
            deregistrations: l(&c.deregistrations),
            reregs: l(&c.reregs),
            page_faults: l(&c.page_faults),
            prefetched_pages: l(&c.prefetched_pages),
            rejected_accesses: l(&c.rejected_accesses),
            mw_binds: l(&c.mw_binds),
            invalidations: l(&c.invalidations),
            bytes_moved: l(&c.bytes_moved),
            injected_faults: l(&c.injected_faults),
            stale_pinned_accesses: l(&c.stale_pinned_accesses),
        }
    }

    /// Make the next `n` calls of `verb` fail with `errno` (`EOPNOTSUPP` surfaces as
    /// [`Error::Unsupported`]). For [`Verb::ReregMr`] the failure is `ERR_CMD`; see
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
        self.fail_next_rereg_inner(verb, n, errno, ReregErrorKind::Cmd);
    }

    /// Make the next `n` re-registrations fail with `kind` and `errno`.
    pub fn fail_next_rereg(&self, kind: ReregErrorKind, n: u32, errno: i32) {
        self.fail_next_rereg_inner(Verb::ReregMr, n, errno, kind);
    }

    fn fail_next_rereg_inner(&self, verb: Verb, n: u32, errno: i32, rereg_kind: ReregErrorKind) {
        let mut f = lock(&self.dev.faults);
        f.retain(|x| x.verb != verb);
        if n > 0 {
            f.push(InjectedFault {
                verb,
                remaining: n,
                errno,
                rereg_kind,
            });
        }
        self.dev.faults_armed.store(f.len(), Ordering::Release);
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
        self.dev.keys.validate()
    }

    /// Bytes this device has pinned (charged to the memlock budget).
    pub fn pinned_bytes(&self) -> u64 {
        self.dev.pinned.load(Ordering::Relaxed)
    }

    /// True when this process can read page frame numbers (`CAP_SYS_ADMIN`), so that the
    /// soft NIC sees *every* replacement of a pinned region's pages; without them a page that
    /// was dropped and already faulted in again by the CPU goes unnoticed (see
    /// [`Counters::stale_pinned_accesses`]).
    ///
    /// # Examples
    /// ```
    /// let nic = rdma_pool::nic::Nic::soft();
    /// let full = nic.as_soft().unwrap().sees_page_frames();
    /// println!("pinned-page replacement detection: {}", if full { "complete" } else { "partial" });
    /// ```
    pub fn sees_page_frames(&self) -> bool {
        pin::frames_visible()
    }
}

/// A map split over 16 independently locked shards, so that data-path lookups of different
/// objects never contend on one device-wide lock.
struct Sharded<V> {
    shards: [Mutex<HashMap<u64, V>>; 16],
}

impl<V> Default for Sharded<V> {
    fn default() -> Self {
        Sharded {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }
}

impl<V> Sharded<V> {
    fn shard(&self, key: u64) -> std::sync::MutexGuard<'_, HashMap<u64, V>> {
        lock(&self.shards[(key % 16) as usize])
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn err(verb: Verb, errno: i32) -> Error {
    Error::from_errno(verb, errno)
}

impl Device {
    /// Consume an injected fault for `verb`, if one is armed.
    fn injected(&self, verb: Verb) -> Option<(i32, ReregErrorKind)> {
        if self.faults_armed.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut f = lock(&self.faults);
        let i = f.iter().position(|x| x.verb == verb)?;
        let hit = (f[i].errno, f[i].rereg_kind);
        f[i].remaining -= 1;
        if f[i].remaining == 0 {
            f.remove(i);
        }
        self.faults_armed.store(f.len(), Ordering::Release);
        bump(&self.counters.injected_faults, 1);
        Some(hit)
    }

    fn inject(&self, verb: Verb) -> Result<()> {
        match self.injected(verb) {
            Some((errno, _)) => Err(err(verb, errno)),
            None => Ok(()),
        }
    }

    fn pd_exists(&self, pd: u64) -> bool {
        lock(&self.pds).contains(pd as usize)
    }

    fn pd_ref(&self, pd: u64, delta: i32) {
        if let Some(n) = lock(&self.pds).get_mut(pd as usize) {
            *n = n.saturating_add_signed(delta);
        }
    }

    fn memlock_budget(&self) -> u64 {
        match self.config.memlock {
            MemlockLimit::Unlimited => u64::MAX,
            MemlockLimit::Bytes(b) => b,
            MemlockLimit::Rlimit if mem::has_cap_ipc_lock() => u64::MAX,
            MemlockLimit::Rlimit => mem::memlock_rlimit(),
        }
    }

    /// Charge `bytes` of pinned memory, or fail with ENOMEM.
    fn pin(&self, bytes: u64) -> std::result::Result<(), i32> {
        let budget = self.memlock_budget();
        let (counter, limit) = match self.config.memlock {
            MemlockLimit::Bytes(_) => (&self.pinned, budget),
            _ => (&PINNED, budget),
        };
        let mut cur = counter.load(Ordering::Relaxed);
        loop {
            let new = cur
                .checked_add(bytes)
                .filter(|&n| n <= limit)
                .ok_or(libc::ENOMEM)?;
            match counter.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(c) => cur = c,
            }
        }
        if !matches!(self.config.memlock, MemlockLimit::Bytes(_)) {
            self.pinned.fetch_add(bytes, Ordering::Relaxed);
        }
        Ok(())
    }

    fn unpin(&self, bytes: u64) {
        self.pinned.fetch_sub(bytes, Ordering::Relaxed);
        if !matches!(self.config.memlock, MemlockLimit::Bytes(_)) {
            PINNED.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Build a region object: checks rights against the process's mappings (pinned) and
    /// charges memlock. Returns the errno on failure.
    fn make_mr(
        &self,
        pd: u64,
        addr: usize,
        len: usize,
        access: Access,
    ) -> std::result::Result<MrObj, i32> {
        if len == 0 || !access.is_valid_for_mr() || access.contains(Access::ZERO_BASED) {
            return Err(libc::EINVAL);
        }
        if len as u64 > self.caps.max_mr_size && len != usize::MAX {
            return Err(libc::EINVAL);
        }
        let odp = access.contains(Access::ON_DEMAND);
        if odp && !self.config.odp {
            return Err(libc::EOPNOTSUPP);
        }
        if len == usize::MAX && (!odp || addr != 0 || !self.caps.odp.implicit) {
            return Err(if odp { libc::EOPNOTSUPP } else { libc::EINVAL });
        }
        if len != usize::MAX && addr.checked_add(len).is_none() {
            return Err(libc::EINVAL);
        }
        let (mut pinned, mut pins) = (0, None);
        if !odp {
            // Pinning faults every page in: it must be mapped, and writable if the NIC may write.
            let prot = mem::range_prot(addr, len).ok_or(libc::EFAULT)?;
            let writes = access
                .intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
            if !prot.read || (writes && !prot.write) {
                return Err(libc::EFAULT);
            }
            let ps = mem::page_size();
            pinned = ((addr + len).div_ceil(ps) - addr / ps) as u64 * ps as u64;
            self.pin(pinned)?;
            match pin::PinnedPages::pin(addr, len, prot.write) {
                Ok(p) => pins = Some(p),
                Err(errno) => {
                    self.unpin(pinned);
                    return Err(errno);
                }
            }
        }
        Ok(MrObj {
            pd,
            addr,
            len,
            access,
            odp: odp.then(|| Residency::new(addr, len)),
            num_mw: AtomicU32::new(0),
            usable: true,
            pinned,
            pins,
            cache_ndescs: (self.config.rereg == ReregMode::Mlx5)
                .then(|| rereg::mlx5_cache_entry(addr, len, odp))
                .flatten(),
            revoked: false,
        })
    }

    fn prefetch_worker(self: &Arc<Device>) -> crossbeam::channel::Sender<PrefetchJob> {
        let mut tx = lock(&self.prefetch_tx);
        if let Some(tx) = tx.as_ref() {
            return tx.clone();
        }
        let (s, r) = crossbeam::channel::unbounded::<PrefetchJob>();
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("soft-nic-prefetch".into())
            .spawn(move || {
                for job in r {
                    let Some(dev) = weak.upgrade() else { break };
                    // Best effort, as the man page says: errors of a postponed prefetch are dropped.
                    let _ = dev.prefetch_now(job.lkey, job.addr, job.len, job.write);
                }
            });
        if spawned.is_err() {
            tracing::warn!(
                "could not start the soft NIC prefetch thread; prefetching synchronously"
            );
        }
        *tx = spawned.is_ok().then(|| s.clone());
        s
    }

    /// Make `[addr, addr + len)` of region `lkey` resident; returns pages made resident.
    fn prefetch_now(
        &self,
        lkey: u32,
        addr: u64,
        len: u64,
        write: bool,
    ) -> std::result::Result<u64, i32> {
        let slot = self.keys.read(lkey >> 8);
        // Re-checked here: a postponed prefetch runs after the region may have gone or changed.
        let Some(KeyObj::Mr(mr)) = slot.obj.as_ref().filter(|_| slot.variant == lkey as u8) else {
            return Err(libc::EFAULT);
        };
        let Some(res) = mr.odp.as_ref() else {
            return Err(libc::EINVAL);
        };
        if !mr.contains(addr, len) {
            return Err(libc::EFAULT);
        }
        let ps = mem::page_size() as u64;
        let mut made = 0;
        if len == 0 {
            return Ok(0);
        }
        for page in addr / ps..=(addr + len - 1) / ps {
            match mem::range_prot((page * ps) as usize, ps as usize) {
                Some(p) if p.read && (p.write || !write) => {
                    if res.insert(page as usize, write) {
                        made += 1;
                    }
                }
                _ => return Err(libc::EFAULT),
            }
        }
        bump(&self.counters.prefetched_pages, made);
        Ok(made)
    }
}

impl Backend for SoftNic {
    fn caps(&self) -> &Caps {
        &self.dev.caps
    }

    fn kind(&self) -> NicKind {
        NicKind::Soft
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn alloc_pd(&self) -> Result<u64> {
        self.dev.inject(Verb::AllocPd)?;
        Ok(lock(&self.dev.pds).insert(0) as u64)
    }

    fn dealloc_pd(&self, pd: u64) -> Result<()> {
        self.dev.inject(Verb::DeallocPd)?;
        let mut pds = lock(&self.dev.pds);
        match pds.get(pd as usize) {
            None => Err(err(Verb::DeallocPd, libc::EINVAL)),
            Some(&n) if n > 0 => Err(err(Verb::DeallocPd, libc::EBUSY)),
            Some(_) => {
                pds.remove(pd as usize);
                Ok(())
            }
        }
    }

    fn reg_mr(&self, pd: u64, addr: usize, len: usize, access: Access) -> Result<RawMr> {
        let dev = &self.dev;
        dev.inject(Verb::RegMr)?;
        if !dev.pd_exists(pd) {
            return Err(err(Verb::RegMr, libc::EINVAL));
        }
        if dev.mr_count.fetch_add(1, Ordering::AcqRel) >= dev.config.max_mr {
            dev.mr_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Limit {
                verb: Verb::RegMr,
                limit: "max_mr",
                max: dev.config.max_mr as u64,
            });
        }
        let obj = match dev.make_mr(pd, addr, len, access) {
            Ok(o) => o,
            Err(e) => {
                dev.mr_count.fetch_sub(1, Ordering::AcqRel);
                return Err(err(Verb::RegMr, e));
            }
        };
        let pinned = obj.pinned;
        let Some(key) = dev.keys.insert(KeyObj::Mr(obj)) else {
            dev.unpin(pinned);
            dev.mr_count.fetch_sub(1, Ordering::AcqRel);
            return Err(err(Verb::RegMr, libc::ENOMEM));
        };
        dev.pd_ref(pd, 1);
        bump(&dev.counters.registrations, 1);
        Ok(RawMr {
            handle: (key >> 8) as u64,
            lkey: Lkey(key),
            rkey: Rkey(key),
            addr,
            len,
        })
    }

    fn rereg_mr(
        &self,
        mr: u64,
        flags: ReregFlags,
        pd: u64,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<RawMr, ReregError> {
        rereg::rereg(&self.dev, mr, flags, pd, addr, len, access)
    }

    fn dereg_mr(&self, mr: u64) -> Result<()> {
        let dev = &self.dev;
        dev.inject(Verb::DeregMr)?;
        let removed = dev.keys.remove_if(mr as u32, |obj| match obj {
            KeyObj::Mr(m) if m.num_mw.load(Ordering::Acquire) > 0 => Err(libc::EBUSY),
            KeyObj::Mr(_) => Ok(()),
            KeyObj::Mw(_) => Err(libc::EINVAL),
        });
        match removed {
            Ok(KeyObj::Mr(m)) => {
                dev.unpin(m.pinned);
                dev.pd_ref(m.pd, -1);
                dev.mr_count.fetch_sub(1, Ordering::AcqRel);
                bump(&dev.counters.deregistrations, 1);
                Ok(())
            }
            Ok(KeyObj::Mw(_)) => Err(err(Verb::DeregMr, libc::EINVAL)),
            Err(errno) => Err(err(Verb::DeregMr, errno)),
        }
    }

    fn advise_mr(&self, pd: u64, advice: Advice, flags: AdviseFlags, sges: &[Sge]) -> Result<()> {
        let dev = &self.dev;
        dev.inject(Verb::AdviseMr)?;
        let e = |errno| err(Verb::AdviseMr, errno);
        if !dev.config.advise_mr {
            return Err(e(libc::EOPNOTSUPP));
        }
        if !dev.pd_exists(pd) || flags.bits() & !AdviseFlags::FLUSH.bits() != 0 {
            return Err(e(libc::EINVAL));
        }
        // Validate every entry before acting on any (nothing half-done on bad input).
        for sge in sges {
            let slot = dev.keys.read(sge.lkey.index());
            match slot.obj.as_ref() {
                None => return Err(e(libc::EFAULT)),
                Some(KeyObj::Mw(_)) => return Err(e(libc::EINVAL)),
                Some(KeyObj::Mr(_)) if slot.variant != sge.lkey.variant() => {
                    return Err(e(libc::ENOENT));
                }
                Some(KeyObj::Mr(mr)) => {
                    if mr.pd != pd {
                        return Err(e(libc::EPERM));
                    }
                    if mr.odp.is_none() || !mr.usable {
                        return Err(e(libc::EINVAL));
                    }
                    if !mr.contains(sge.addr, sge.length as u64) {
                        return Err(e(libc::EFAULT));
                    }
                    if advice == Advice::PrefetchWrite && !mr.access.contains(Access::LOCAL_WRITE) {
                        return Err(e(libc::EPERM));
                    }
                }
            }
        }
        for sge in sges {
            match advice {
                Advice::PrefetchNoFault => {
                    // Map only what the CPU already has; never fault.
                    let slot = dev.keys.read(sge.lkey.index());
                    let same = slot.variant == sge.lkey.variant();
                    if let Some(KeyObj::Mr(MrObj { odp: Some(res), .. })) =
                        slot.obj.as_ref().filter(|_| same)
                    {
                        let ps = mem::page_size();
                        let (a, l) = (sge.addr as usize, sge.length as usize);
                        let mut made = 0;
                        if l > 0 {
                            for page in a / ps..=(a + l - 1) / ps {
                                if mem::cpu_resident(page * ps) && res.insert(page, false) {
                                    made += 1;
                                }
                            }
                        }
                        bump(&dev.counters.prefetched_pages, made);
                    }
                }
                Advice::Prefetch | Advice::PrefetchWrite => {
                    let write = advice == Advice::PrefetchWrite;
                    if flags.contains(AdviseFlags::FLUSH) {
                        dev.prefetch_now(sge.lkey.0, sge.addr, sge.length as u64, write)
                            .map_err(e)?;
                    } else {
                        let job = PrefetchJob {
                            lkey: sge.lkey.0,
                            addr: sge.addr,
                            len: sge.length as u64,
                            write,
                        };
                        if let Err(crossbeam::channel::SendError(job)) =
                            dev.prefetch_worker().send(job)
                        {
                            dev.prefetch_now(job.lkey, job.addr, job.len, job.write)
                                .map_err(e)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn alloc_mw(&self, pd: u64, ty: MwType) -> Result<(u64, Rkey)> {
        let dev = &self.dev;
        dev.inject(Verb::AllocMw)?;
        if !dev.pd_exists(pd) {
            return Err(err(Verb::AllocMw, libc::EINVAL));
        }
        let supported = match ty {
            MwType::Type1 => dev.config.mw_type1,
            MwType::Type2 => dev.config.mw_type2,
        };
        if !supported {
            return Err(err(Verb::AllocMw, libc::EOPNOTSUPP));
        }
        if dev.mw_count.fetch_add(1, Ordering::AcqRel) >= dev.config.max_mw {
            dev.mw_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Limit {
                verb: Verb::AllocMw,
                limit: "max_mw",
                max: dev.config.max_mw as u64,
            });
        }
        let Some(key) = dev.keys.insert(KeyObj::Mw(MwObj {
            pd,
            ty,
            binding: None,
        })) else {
            dev.mw_count.fetch_sub(1, Ordering::AcqRel);
            return Err(err(Verb::AllocMw, libc::ENOMEM));
        };
        dev.pd_ref(pd, 1);
        Ok(((key >> 8) as u64, Rkey(key)))
    }

    fn bind_mw(&self, qp: u64, mw: u64, mw_rkey: Rkey, bind: &RawBind) -> Result<Rkey> {
        self.dev.inject(Verb::BindMw)?;
        let qp = self.qp(qp, Verb::BindMw)?;
        let new_rkey = mw_rkey.next_variant();
        qp.bind_type1(&self.dev, mw, mw_rkey, new_rkey, bind)?;
        Ok(new_rkey)
    }

    fn dealloc_mw(&self, mw: u64) -> Result<()> {
        let dev = &self.dev;
        dev.inject(Verb::DeallocMw)?;
        let removed = dev.keys.remove_if(mw as u32, |obj| match obj {
            KeyObj::Mw(_) => Ok(()),
            KeyObj::Mr(_) => Err(libc::EINVAL),
        });
        match removed {
            Ok(KeyObj::Mw(w)) => {
                if let Some(b) = w.binding {
                    qp::release_binding(&dev.keys, b);
                }
                dev.pd_ref(w.pd, -1);
                dev.mw_count.fetch_sub(1, Ordering::AcqRel);
                Ok(())
            }
            Ok(KeyObj::Mr(_)) => Err(err(Verb::DeallocMw, libc::EINVAL)),
            Err(errno) => Err(err(Verb::DeallocMw, errno)),
        }
    }

    fn create_cq(&self, depth: u32) -> Result<u64> {
        self.dev.inject(Verb::CreateCq)?;
        let h = self.dev.next_handle.fetch_add(1, Ordering::Relaxed);
        self.dev.cqs.shard(h).insert(h, Arc::new(CqObj::new(depth)));
        Ok(h)
    }

    fn destroy_cq(&self, cq: u64) -> Result<()> {
        self.dev.inject(Verb::DestroyCq)?;
        let mut cqs = self.dev.cqs.shard(cq);
        match cqs.get(&cq) {
            None => Err(err(Verb::DestroyCq, libc::EINVAL)),
            // QPs still post to it.
            Some(c) if c.users.load(Ordering::Acquire) > 0 => {
                Err(err(Verb::DestroyCq, libc::EBUSY))
            }
            Some(_) => {
                cqs.remove(&cq);
                Ok(())
            }
        }
    }

    fn poll_cq(&self, cq: u64, out: &mut [Completion]) -> Result<usize> {
        let c = self
            .dev
            .cqs
            .shard(cq)
            .get(&cq)
            .cloned()
            .ok_or_else(|| err(Verb::PollCq, libc::EINVAL))?;
        Ok(c.poll(out))
    }

    fn create_qp(&self, pd: u64, send_cq: u64, recv_cq: u64, caps: &QpCaps) -> Result<(u64, u32)> {
        let dev = &self.dev;
        dev.inject(Verb::CreateQp)?;
        if !dev.pd_exists(pd) {
            return Err(err(Verb::CreateQp, libc::EINVAL));
        }
        let (scq, rcq) = {
            let s = dev.cqs.shard(send_cq).get(&send_cq).cloned();
            let r = dev.cqs.shard(recv_cq).get(&recv_cq).cloned();
            match (s, r) {
                (Some(s), Some(r)) => (s, r),
                _ => return Err(err(Verb::CreateQp, libc::EINVAL)),
            }
        };
        let qpn = dev.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
        let h = dev.next_handle.fetch_add(1, Ordering::Relaxed);
        let qp = Arc::new(QpObj::new(Arc::downgrade(dev), pd, qpn, scq, rcq, *caps));
        lock(&dev.qpns).insert(qpn, Arc::downgrade(&qp));
        dev.qps.shard(h).insert(h, qp);
        dev.pd_ref(pd, 1);
        Ok((h, qpn))
    }

    fn endpoint(&self, qp: u64) -> Result<Endpoint> {
        let q = self.qp(qp, Verb::ModifyQp)?;
        Ok(Endpoint {
            gid: soft_gid(self.dev.id),
            qpn: q.qpn,
            lid: 0,
            psn: q.qpn & 0xff_ffff,
        })
    }

    fn connect_qp(&self, qp: u64, remote: &Endpoint) -> Result<()> {
        self.dev.inject(Verb::ModifyQp)?;
        let q = self.qp(qp, Verb::ModifyQp)?;
        let dev_id = gid_device(&remote.gid).ok_or_else(|| err(Verb::ModifyQp, libc::EINVAL))?;
        let peer_dev = lock(&FABRIC)
            .iter()
            .find(|(id, _)| *id == dev_id)
            .and_then(|(_, w)| w.upgrade())
            .ok_or_else(|| err(Verb::ModifyQp, libc::EINVAL))?;
        let peer = lock(&peer_dev.qpns)
            .get(&remote.qpn)
            .and_then(Weak::upgrade)
            .ok_or_else(|| err(Verb::ModifyQp, libc::EINVAL))?;
        if !q.connect(Arc::downgrade(&peer_dev), Arc::downgrade(&peer)) {
            // ibv_modify_qp to RTR is valid from INIT only.
            return Err(err(Verb::ModifyQp, libc::EINVAL));
        }
        Ok(())
    }

    fn qp_state(&self, qp: u64) -> Result<QpState> {
        Ok(self.qp(qp, Verb::ModifyQp)?.state())
    }

    fn destroy_qp(&self, qp: u64) -> Result<()> {
        let dev = &self.dev;
        dev.inject(Verb::DestroyQp)?;
        let q = dev
            .qps
            .shard(qp)
            .remove(&qp)
            .ok_or_else(|| err(Verb::DestroyQp, libc::EINVAL))?;
        lock(&dev.qpns).remove(&q.qpn);
        dev.pd_ref(q.pd, -1);
        Ok(())
    }

    fn post_send(&self, qp: u64, wr: &RawSendWr<'_>) -> Result<()> {
        self.dev.inject(Verb::PostSend)?;
        let q = self.qp(qp, Verb::PostSend)?;
        q.post_send(&self.dev, wr)
    }

    fn post_recv(&self, qp: u64, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.dev.inject(Verb::PostRecv)?;
        let q = self.qp(qp, Verb::PostRecv)?;
        q.post_recv(&self.dev, wr_id, sges)
    }

    fn umem_reg(
        &self,
        addr: usize,
        len: usize,
        access: Access,
        pgsz_bitmap: u64,
    ) -> Result<(u64, u32)> {
        let dev = &self.dev;
        dev.inject(Verb::UmemReg)?;
        let e = |errno| err(Verb::UmemReg, errno);
        if !dev.config.devx {
            return Err(Error::Unsupported {
                verb: Verb::UmemReg,
                detail: "DEVX is disabled on this soft device".into(),
            });
        }
        // devx.c accepts exactly these flags (uverbs_get_flags32), then ib_check_mr_access.
        let allowed = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::RELAXED_ORDERING;
        if !access.is_valid_for_mr() || access.intersects(!allowed) {
            return Err(e(libc::EINVAL));
        }
        let prot = mem::range_prot(addr, len).ok_or_else(|| e(libc::EFAULT))?;
        if !prot.read || (access.contains(Access::LOCAL_WRITE) && !prot.write) {
            return Err(e(libc::EFAULT));
        }
        // The device maps the buffer with one page size from the bitmap: at least the base page,
        // at most what backs the memory (a larger page would need physical contiguity), and a
        // page larger than the base page only for a buffer aligned to it (queue objects address
        // the UMEM in whole pages from its start).
        let backing = mem::backing_page_size(addr).unwrap_or(mem::page_size()) as u64;
        let base = mem::page_size() as u64;
        let fits = (12..64)
            .map(|bit| 1u64 << bit)
            .any(|p| pgsz_bitmap & p != 0 && p <= backing && (p == base || addr as u64 % p == 0));
        if !fits {
            return Err(e(libc::EINVAL));
        }
        let ps = mem::page_size();
        let pinned = ((addr + len).div_ceil(ps) - addr / ps) as u64 * ps as u64;
        dev.pin(pinned).map_err(e)?;
        let id = dev.next_handle.fetch_add(1, Ordering::Relaxed) as u32;
        let h = lock(&dev.umems).insert((id, pinned)) as u64;
        Ok((h, id))
    }

    fn umem_dereg(&self, umem: u64) -> Result<()> {
        self.dev.inject(Verb::UmemDereg)?;
        let (_, pinned) = lock(&self.dev.umems)
            .try_remove(umem as usize)
            .ok_or_else(|| err(Verb::UmemDereg, libc::EINVAL))?;
        self.dev.unpin(pinned);
        Ok(())
    }
}

impl SoftNic {
    fn qp(&self, qp: u64, verb: Verb) -> Result<Arc<QpObj>> {
        self.dev
            .qps
            .shard(qp)
            .get(&qp)
            .cloned()
            .ok_or_else(|| err(verb, libc::EINVAL))
    }
}

/// A soft device's GID: a link-local address whose low bytes name the device.
fn soft_gid(id: u32) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8..12].copy_from_slice(b"soft");
    g[12..].copy_from_slice(&id.to_be_bytes());
    g
}

fn gid_device(gid: &[u8; 16]) -> Option<u32> {
    (gid[0] == 0xfe && gid[1] == 0x80 && &gid[8..12] == b"soft")
        .then(|| u32::from_be_bytes([gid[12], gid[13], gid[14], gid[15]]))
}
