//! A soft device's state and the rules shared by its verbs: PDs, region building (rights,
//! memlock, pinning), fault injection and fault accounting.
//!
//! Contract: one `Device` per soft NIC, behind an `Arc`; its verbs (`backend.rs`), its QPs
//! (through [`Port`]) and its prefetch thread (through a `Weak`) share it. Tables are locked
//! per table (PDs, UMEMs, QP numbers) or per shard (CQs, QPs) or per key slot (regions and
//! windows), never device-wide on the data path.
//!
//! Invariants: `mr_count` / `mw_count` equal the regions / windows in `keys`; a PD's count
//! equals the regions, windows and QPs that name it; `memlock.pinned()` equals the pinned
//! bytes of the live pinned regions and UMEMs.

use super::config::{ReregMode, SoftConfig};
use super::counters::{AtomicCounters, bump};
use super::cq::{ChannelObj, CqObj};
use super::faults::FaultPlan;
use super::keys::{FaultSink, KeyFault, KeyObj, KeyTable, MrObj};
use super::mem;
use super::memlock::{Memlock, page_span};
use super::pin::PinnedPages;
use super::prefetch::{Prefetcher, prefetch_now};
use super::qp::{Port, QpObj};
use super::rereg::mlx5_cache_entry;
use super::residency::Residency;
use super::srq::SrqObj;
use super::sync::{Sharded, lock};
use crate::nic::error::{Error, ReregErrorKind, Result, Verb};
use crate::nic::types::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A soft RDMA device. Obtain one through [`crate::nic::Nic::soft`] and reach it with
/// [`crate::nic::Nic::as_soft`] for counters and fault injection.
pub struct SoftNic {
    pub(super) dev: Arc<Device>,
}

/// The state of one soft device (see the module contract).
pub(crate) struct Device {
    pub(super) id: u32,
    pub(super) caps: Caps,
    pub(super) config: SoftConfig,
    pub(super) keys: KeyTable,
    pub(super) counters: AtomicCounters,
    pub(super) faults: FaultPlan,
    /// PDs: the slab key is the handle, the value counts the objects that use the PD.
    pub(super) pds: Mutex<slab::Slab<u32>>,
    pub(super) next_handle: AtomicU64,
    pub(super) cqs: Sharded<Arc<CqObj>>,
    /// Completion channels: the slab key is the handle.
    pub(super) channels: Mutex<slab::Slab<Arc<ChannelObj>>>,
    /// Shared receive queues: the slab key is the handle.
    pub(super) srqs: Mutex<slab::Slab<Arc<SrqObj>>>,
    pub(super) qps: Sharded<Arc<QpObj>>,
    pub(super) qpns: Mutex<HashMap<u32, Weak<QpObj>>>,
    pub(super) next_qpn: AtomicU32,
    /// UMEMs: the slab key is the handle; (UMEM id, pinned bytes).
    pub(super) umems: Mutex<slab::Slab<(u32, u64)>>,
    pub(super) mr_count: AtomicU32,
    pub(super) mw_count: AtomicU32,
    pub(super) memlock: Memlock,
    pub(super) prefetcher: Prefetcher,
    /// Asynchronous events injected and not yet read.
    pub(super) events: Mutex<std::collections::VecDeque<AsyncEvent>>,
    /// A `DeviceFatal` was injected: every verb fails with `EIO` from then on.
    pub(super) dead: std::sync::atomic::AtomicBool,
}

/// The capabilities a soft device with `config` reports.
fn caps_of(id: u32, config: &SoftConfig) -> Caps {
    Caps {
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
        mkey_cache: config.rereg == ReregMode::Mlx5,
        mw_type1: config.mw_type1,
        mw_type2: config.mw_type2,
        advise_mr: config.advise_mr,
        atomics: config.atomics,
        devx: config.devx,
        path_mtu: 4096,
        numa_node: config.numa_node,
    }
}

impl Device {
    /// Create the device: its tables, its memlock account and its prefetcher (whose thread
    /// the first postponed prefetch starts).
    pub(super) fn new(id: u32, config: SoftConfig) -> Arc<Device> {
        Arc::new_cyclic(|weak: &Weak<Device>| {
            let weak = weak.clone();
            let prefetcher = Prefetcher::start(move |job| {
                let Some(dev) = weak.upgrade() else {
                    return false;
                };
                // Best effort, as the man page says: errors of a postponed prefetch are dropped.
                let _ = prefetch_now(&dev.keys, &dev.counters, &job);
                true
            });
            Device {
                id,
                keys: KeyTable::new(
                    config
                        .max_mr
                        .saturating_add(config.max_mw)
                        .saturating_add(1),
                ),
                caps: caps_of(id, &config),
                memlock: Memlock::new(config.memlock),
                config,
                counters: AtomicCounters::default(),
                faults: FaultPlan::default(),
                pds: Mutex::new(slab::Slab::new()),
                next_handle: AtomicU64::new(1),
                cqs: Sharded::default(),
                channels: Mutex::new(slab::Slab::new()),
                srqs: Mutex::new(slab::Slab::new()),
                qps: Sharded::default(),
                qpns: Mutex::new(HashMap::new()),
                next_qpn: AtomicU32::new(0x11),
                umems: Mutex::new(slab::Slab::new()),
                mr_count: AtomicU32::new(0),
                mw_count: AtomicU32::new(0),
                prefetcher,
                events: Mutex::new(std::collections::VecDeque::new()),
                dead: std::sync::atomic::AtomicBool::new(false),
            }
        })
    }

    /// Consume an injected fault for `verb`, if one is armed (counted).
    pub(super) fn injected(&self, verb: Verb) -> Option<(i32, ReregErrorKind)> {
        let hit = self.faults.take(verb);
        if hit.is_some() {
            bump(&self.counters.injected_faults, 1);
        }
        hit
    }

    /// Fail with the injected fault for `verb`, if one is armed.
    pub(super) fn inject(&self, verb: Verb) -> Result<()> {
        if self.dead.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::from_errno(verb, libc::EIO));
        }
        match self.injected(verb) {
            Some((errno, _)) => Err(Error::from_errno(verb, errno)),
            None => Ok(()),
        }
    }

    pub(super) fn pd_exists(&self, pd: u64) -> bool {
        lock(&self.pds).contains(pd as usize)
    }

    pub(super) fn pd_ref(&self, pd: u64, delta: i32) {
        if let Some(n) = lock(&self.pds).get_mut(pd as usize) {
            *n = n.saturating_add_signed(delta);
        }
    }

    /// Build a region object: checks rights against the process's mappings, pins (faulting
    /// every page in and recording what backs it) and charges memlock. Returns the errno on
    /// failure, having charged nothing.
    pub(super) fn make_mr(
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
            pinned = page_span(addr, len);
            self.memlock.charge(pinned)?;
            match PinnedPages::pin(addr, len, prot.write) {
                Ok(p) => pins = Some(p),
                Err(errno) => {
                    self.memlock.release(pinned);
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
                .then(|| mlx5_cache_entry(addr, len, odp))
                .flatten(),
            revoked: false,
        })
    }
}

impl Device {
    /// Check that each PD's count equals the regions, windows and QPs that name it.
    pub(super) fn validate_pd_counts(&self) -> std::result::Result<(), String> {
        let mut named: HashMap<u64, u32> = HashMap::new();
        for index in self.keys.occupied() {
            let pd = match self.keys.read(index).obj.as_ref() {
                Some(KeyObj::Mr(mr)) => mr.pd,
                Some(KeyObj::Mw(mw)) => mw.pd,
                None => continue,
            };
            *named.entry(pd).or_default() += 1;
        }
        for shard in 0..16 {
            for qp in self.qps.shard(shard).values() {
                *named.entry(qp.pd).or_default() += 1;
            }
        }
        for (pd, &count) in lock(&self.pds).iter() {
            let want = named.get(&(pd as u64)).copied().unwrap_or(0);
            if count != want {
                return Err(format!(
                    "PD {pd}: count {count} != objects naming it {want}"
                ));
            }
        }
        Ok(())
    }
}

/// Reserve one of the `max` objects `count` counts, or report the device limit `limit`.
pub(super) fn reserve(count: &AtomicU32, max: u32, verb: Verb, limit: &'static str) -> Result<()> {
    if count.fetch_add(1, Ordering::AcqRel) >= max {
        count.fetch_sub(1, Ordering::AcqRel);
        return Err(Error::Limit {
            verb,
            limit,
            max: max as u64,
        });
    }
    Ok(())
}

impl FaultSink for Device {
    fn page_fault(&self) {
        bump(&self.counters.page_faults, 1);
        if !self.config.fault_cost.is_zero() {
            std::thread::sleep(self.config.fault_cost);
        }
    }
    fn rejected(&self, why: KeyFault) {
        bump(&self.counters.rejected_accesses, 1);
        if why == KeyFault::PinnedPagesGone {
            bump(&self.counters.stale_pinned_accesses, 1);
        }
    }
}

impl Port for Device {
    fn keys(&self) -> &KeyTable {
        &self.keys
    }
    fn sink(&self) -> &dyn FaultSink {
        self
    }
    fn counters(&self) -> &AtomicCounters {
        &self.counters
    }
}
