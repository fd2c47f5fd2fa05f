//! A soft device's configuration: which optional verbs it has, which real device its
//! re-registration stands for, its limits, and the costs it simulates.
//!
//! Contract: plain data, fixed when the device is created (`Nic::soft_with`); the default is a
//! device with every feature, mlx5's re-registration rules, `RLIMIT_MEMLOCK` and no simulated
//! latency.

use crate::nic::ForkStatus;
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
    /// RC atomics (compare-and-swap, fetch-and-add on 8 aligned bytes, host byte order as
    /// rxe): `Caps::atomics`.
    pub atomics: bool,
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
    /// What `fork_status()` reports: `Unneeded` (default) models a kernel that copies pinned
    /// pages for a child, `Disabled`/`Enabled` one that needs `MADV_DONTFORK`.
    pub fork: ForkStatus,
    /// The NUMA node the device reports ([`Caps::numa_node`](crate::nic::Caps::numa_node)):
    /// where `NumaPolicy::DeviceNode` places the pool's memory. Default `None` (no node, as a
    /// device whose sysfs `numa_node` is `-1`).
    pub numa_node: Option<u32>,
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
            atomics: true,
            devx: true,
            max_mr: 1 << 14,
            max_mw: 1 << 14,
            max_mr_size: 1 << 40,
            max_sge: 32,
            memlock: MemlockLimit::Rlimit,
            fault_cost: Duration::ZERO,
            umr_revoke_time: Duration::ZERO,
            fork: ForkStatus::Unneeded,
            numa_node: None,
        }
    }
}
