//! The arena's error: what went wrong, typed, built without allocating.

use crate::nic;

/// Why the arena could not hand out or describe memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is inconsistent.
    #[error("invalid arena configuration: {0}")]
    Config(&'static str),
    /// A zero-length run, an alignment that is not a power of two, or a slice that is empty.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// Reserving, mapping or committing memory failed with this `errno`.
    #[error("{what} failed with errno {errno}")]
    Os {
        /// The call that failed.
        what: &'static str,
        /// Its `errno`.
        errno: i32,
    },
    /// Committing (or pinning) the run would take more memory than the system has to give:
    /// `MemAvailable`, or what the cgroup's `memory.max` leaves. Refused up front rather than
    /// populated into the OOM killer.
    #[error(
        "a run of {len} bytes would be populated with only {available} bytes of memory available"
    )]
    NoMemory {
        /// Bytes the run needs populated.
        len: usize,
        /// Bytes available (the smaller of `MemAvailable` and the cgroup's headroom).
        available: u64,
    },
    /// Every chunk of every reservation the arena may hold
    /// ([`ArenaConfig::reservations`](super::ArenaConfig::reservations)) is in use.
    #[error("the arena's reservations of {reserved} bytes in all are used up")]
    ReservationFull {
        /// Bytes reserved (all reservations).
        reserved: usize,
    },
    /// A run larger than the device can register as one region.
    #[error("a run of {len} bytes exceeds the device's max_mr_size of {max}")]
    TooLarge {
        /// Bytes asked for (rounded up to slabs).
        len: usize,
        /// `max_mr_size`.
        max: u64,
    },
    /// [`Hugepages::Require`](super::Hugepages::Require) and no hugetlb page could be had
    /// (`errno` of the mapping or of `MADV_POPULATE_WRITE`).
    #[error("hugetlb pages required but unavailable (errno {errno})")]
    HugepagesUnavailable {
        /// The failing call's `errno`.
        errno: i32,
    },
    /// The pointer or slice is not (wholly) inside one registration of this arena.
    #[error("not inside one registration of the arena")]
    NotRegistered,
    /// The arena was asked to grow while this thread is already provisioning (calling into
    /// the NIC): an allocation made by the NIC layer itself, which must be served elsewhere
    /// (see [`provision`](crate::sys::provision)); or a `GlobalPool` was asked for its pool from
    /// inside its own initialisation.
    #[error("the arena cannot grow from inside its own provisioning")]
    Reentrant,
    /// The operation must wait: something still uses what it would take away (e.g. open
    /// grants on a PD being detached).
    #[error("busy: {0}")]
    Busy(&'static str),
    /// The NIC refused a registration.
    #[error(transparent)]
    Nic(#[from] nic::Error),
}
