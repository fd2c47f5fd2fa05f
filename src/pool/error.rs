//! [`PoolError`]: why a [`Pool`](super::Pool) could not be made.

use crate::{arena, nic};

/// Why [`Pool::new`](super::Pool::new) (or `with_config`, `with_remote_rights`) failed.
/// Nothing is left behind: whatever was set up before the failure is torn down.
///
/// # Examples
/// ```
/// use rdma_pool::{ArenaConfig, Pool, PoolError, arena};
/// let pd = rdma_pool::Nic::soft().alloc_pd()?;
/// let cfg = ArenaConfig { reserve: 0, ..Default::default() };
/// let e = Pool::with_config(&pd, cfg).unwrap_err();
/// assert!(matches!(e, PoolError::Arena(arena::Error::Config(_))));
/// # Ok::<(), PoolError>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The arena or the allocator core could not be set up: the configuration, the address
    /// space, registration, the NIC, or 256 pools already alive.
    #[error(transparent)]
    Arena(#[from] arena::Error),
    /// The grants' state could not be set up: every grant tag is taken (65,536 pools alive,
    /// or dropped with grant requests in flight), or mapping it failed with `errno`.
    #[error("{what} failed with errno {errno}")]
    Grants {
        /// What failed.
        what: &'static str,
        /// Its `errno` (`EMFILE`: every grant tag is taken).
        errno: i32,
    },
}

impl From<nic::Error> for PoolError {
    fn from(e: nic::Error) -> PoolError {
        PoolError::Arena(arena::Error::Nic(e))
    }
}

/// For front ends whose errors are the arena's ([`GlobalPool`](crate::GlobalPool)): a
/// failure of the grants' state is a failed system call there.
impl From<PoolError> for arena::Error {
    fn from(e: PoolError) -> arena::Error {
        match e {
            PoolError::Arena(e) => e,
            PoolError::Grants { errno, .. } if errno == crate::grant::NO_TAG => {
                arena::Error::Config(
                    "every grant tag is taken (65,536 pools alive, or dropped with grant \
                     requests in flight)",
                )
            }
            PoolError::Grants { what, errno } => arena::Error::Os { what, errno },
        }
    }
}

impl PoolError {
    pub(super) fn from_grants_errno(errno: i32) -> PoolError {
        let what = if errno == crate::grant::NO_TAG {
            "taking a grant tag (65,536 pools alive, or dropped with grant requests in flight)"
        } else {
            "mmap of the grants' ledger"
        };
        PoolError::Grants { what, errno }
    }
}
