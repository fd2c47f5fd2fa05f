//! Why a prefetch failed (`ibv_advise_mr(3)`'s errors, typed).

use crate::nic;

/// A prefetch's error. Prefetch is best effort: none of these leaves the memory unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrefetchError {
    /// The range does not lie in this pool's memory.
    #[error("the range is not in this pool's memory")]
    OutsidePool,
    /// The range is not registered memory (the pool degraded) or spans two registrations.
    #[error("the range is not inside one registration of the pool")]
    Unregistered,
    /// Prefetch is off: the device has no `advise_mr`, or said `EOPNOTSUPP` (`errno`).
    #[error("prefetch is off (errno {errno})")]
    Disabled {
        /// Why: the device's errno.
        errno: i32,
    },
    /// The device does not support `advise_mr` (`EOPNOTSUPP`): prefetch is now off.
    #[error("the device does not support advise_mr; prefetch turned off")]
    Unsupported,
    /// `EAGAIN`/`ENOMEM` after every retry.
    #[error("advise_mr stayed busy (errno {errno}) after retries")]
    Busy {
        /// The last errno.
        errno: i32,
    },
    /// `EFAULT`: the range is out of the region's bounds or not in the address space.
    #[error("advise_mr: range outside its region or the address space (EFAULT)")]
    Fault,
    /// `EINVAL`: the key names no ODP region (a window, a pinned region) or the flags are bad.
    #[error("advise_mr: not an ODP region, or bad flags (EINVAL)")]
    Invalid,
    /// `EPERM`: a key outside the PD, or `PrefetchWrite` on a read-only region.
    #[error("advise_mr: key of another PD, or write advice on a read-only region (EPERM)")]
    Denied,
    /// `ENOENT`: the key is stale.
    #[error("advise_mr: stale key (ENOENT)")]
    StaleKey,
    /// Another NIC failure.
    #[error(transparent)]
    Nic(#[from] nic::Error),
}
