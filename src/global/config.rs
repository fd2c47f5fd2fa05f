//! How a [`GlobalPool`](super::GlobalPool) is set up: [`GlobalConfig`], const-constructible so
//! that it can sit in a `static`, and the environment overrides, read without allocating.
//!
//! Contract: a `GlobalConfig` wraps the [`ArenaConfig`] of its pool (one configuration for
//! every pool) and adds what only the global allocator has: what to do when it cannot serve a
//! request, how it opens its NIC, where the rest goes. The environment is read once, when the
//! pool initialises, with `getenv` (no Rust allocation, no lock): the `RDMA_POOL_*` overrides
//! of the arena's fields, as for every pool (`arena/env.rs`, [`ArenaConfig::with_env`]), and
//! `RDMA_POOL_NIC`, which picks the device as for [`Nic::open_default`] when
//! [`GlobalConfig::open`] is `None`. An unknown value is ignored (and counted in
//! [`GlobalStats::env_ignored`](super::GlobalStats::env_ignored)).

#[cfg(test)]
use crate::arena::NumaPolicy;
pub use crate::arena::Registration;
use crate::arena::{ArenaConfig, Hugepages, RegistrationPolicy};
use crate::nic::{self, Nic};

/// What the global pool does when it cannot give out NIC-registered memory (no device could
/// be opened, registration or the reservation failed, every heap is taken).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnFailure {
    /// Serve the request from the system allocator (unregistered memory: `keys_of` is `None`
    /// for it) and count it in [`GlobalStats`](super::GlobalStats). `GlobalAlloc` then returns
    /// null only where the system allocator does.
    Degrade,
    /// Return null, as an allocator out of memory does (Rust's `handle_alloc_error` then
    /// aborts the process): for services that must never post unregistered memory. The arena
    /// then runs with [`RegistrationPolicy::Required`]: memory it cannot register (after trying
    /// ODP for it) is never handed out. Re-entrant allocations of the NIC layer still use the
    /// bootstrap region.
    Fail,
}

/// The configuration of a [`GlobalPool`](super::GlobalPool).
///
/// # Examples
/// ```
/// use rdma_pool::global::{GlobalConfig, GlobalPool, OnFailure};
/// use rdma_pool::arena::{ArenaConfig, Hugepages};
/// // In a `static`: every field is const-constructible.
/// static POOL: GlobalPool = GlobalPool::with_config(GlobalConfig {
///     arena: ArenaConfig { hugepages: Hugepages::Off, reserve: 1 << 34, ..GlobalConfig::DEFAULT.arena },
///     on_failure: OnFailure::Degrade,
///     ..GlobalConfig::DEFAULT
/// });
/// assert_eq!(POOL.config().arena.reserve, 1 << 34);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct GlobalConfig {
    /// The pool's arena: reservation, chunks, hugepages, registration, remote rights, purge
    /// delay, NUMA placement (see [`ArenaConfig`]; the environment overrides its fields).
    /// Default [`ArenaConfig::DEFAULT`] with [`Registration::Auto`] (ODP where the device
    /// supports it for every operation and no quirk makes it unsafe, else pinned) and
    /// [`Hugepages::Transparent`] (a general heap on hugetlb pages dies of `SIGBUS` after a
    /// `fork` once the hugetlb pool is dry, see [`Hugepages`]). Remote rights need the
    /// `unsafe` [`GlobalPool::with_remote_rights`](super::GlobalPool::with_remote_rights); any
    /// other constructor's pool refuses them when it initialises. A NUMA node that is not
    /// online makes the arena fail to open, and the pool then degrades as
    /// [`GlobalConfig::on_failure`] says.
    pub arena: ArenaConfig,
    /// Degrade to unregistered memory, or fail. Default `Degrade`.
    pub on_failure: OnFailure,
    /// Opens the NIC; `None` uses [`Nic::open_default`] (which honours `RDMA_POOL_NIC`). It
    /// runs inside the allocator, on the thread of the first allocation: its own allocations
    /// are served from the bootstrap region.
    pub open: Option<fn() -> nic::Result<Nic>>,
    /// Where what the pool cannot serve goes: the system allocator (default), or anonymous
    /// mappings that never call `malloc`, for a pool that is the process's `malloc` itself
    /// ([`Fallback`](super::Fallback)).
    pub fallback: super::Fallback,
}

impl GlobalConfig {
    /// The defaults: auto registration, transparent huge pages, 64 GiB reserved in 1 GiB chunks,
    /// no remote rights, degrade on failure, the default NIC.
    pub const DEFAULT: GlobalConfig = GlobalConfig {
        arena: ArenaConfig {
            registration: Registration::Auto,
            hugepages: Hugepages::Transparent,
            ..ArenaConfig::DEFAULT
        },
        on_failure: OnFailure::Degrade,
        open: None,
        fallback: super::Fallback::System,
    };

    /// This configuration with the environment's overrides applied; the second value counts
    /// variables that were set to an unknown value (and ignored).
    pub(crate) fn with_env(mut self) -> (GlobalConfig, u32) {
        let (arena, ignored) = self.arena.with_env_counted();
        self.arena = arena;
        (self, ignored)
    }

    /// The arena's configuration: [`GlobalConfig::arena`], required to register everything
    /// under [`OnFailure::Fail`].
    pub(crate) fn arena(&self) -> ArenaConfig {
        let mut arena = self.arena;
        if self.on_failure == OnFailure::Fail {
            arena.policy = RegistrationPolicy::Required;
        }
        arena
    }
}

impl Default for GlobalConfig {
    fn default() -> Self {
        GlobalConfig::DEFAULT
    }
}

/// An `RDMA_POOL_NUMA` value: `any`, `device`, `local` or a node number.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_config_follows_the_global_one() {
        let strict = GlobalConfig {
            arena: ArenaConfig {
                registration: Registration::Odp,
                purge_delay: None,
                ..GlobalConfig::DEFAULT.arena
            },
            on_failure: OnFailure::Fail,
            ..GlobalConfig::DEFAULT
        }
        .arena();
        assert_eq!(strict.registration, Registration::Odp);
        assert_eq!(strict.policy, RegistrationPolicy::Required);
        assert_eq!(strict.purge_delay, None);
        let auto = GlobalConfig::DEFAULT.arena();
        assert_eq!(auto.reserve, 64 << 30);
        assert_eq!(auto.registration, Registration::Auto);
        assert_eq!(auto.hugepages, Hugepages::Transparent);
        assert_eq!(auto.policy, RegistrationPolicy::Degrade);
        assert_eq!(auto.numa, NumaPolicy::Any);
        assert!(auto.remote.is_empty());
    }
}
