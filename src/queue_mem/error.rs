//! Why queue memory could not be had.

use crate::{arena, nic};

/// A queue-memory error. Nothing is kept for a failed request: a UMEM that could not be
/// registered leaves its slabs for the next one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueMemError {
    /// The device has no DEVX (not an mlx5 device, or `libmlx5` is missing).
    #[error("the device has no DEVX UMEM support")]
    Unsupported,
    /// A zero length, or an alignment that is not a power of two up to 2 MiB.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The device takes none of the page sizes asked for (`EINVAL`): the bitmap does not fit
    /// the memory's pages or alignment.
    #[error("the device refused page-size bitmap {bitmap:#x} for this memory (EINVAL)")]
    PageSize {
        /// The bitmap asked for.
        bitmap: u64,
    },
    /// The arena could not commit the slabs.
    #[error(transparent)]
    Arena(#[from] arena::Error),
    /// Another NIC failure.
    #[error(transparent)]
    Nic(nic::Error),
}
