//! How a [`GlobalPool`](super::GlobalPool) is set up: [`GlobalConfig`], const-constructible so
//! that it can sit in a `static`, and the environment overrides, read without allocating.
//!
//! Contract: the environment is read once, when the pool initialises, with `getenv` (no Rust
//! allocation, no lock): `RDMA_POOL_REGISTRATION=pinned|odp|auto` overrides
//! [`GlobalConfig::registration`], `RDMA_POOL_HUGEPAGES=require|prefer|thp|off` overrides
//! [`GlobalConfig::hugepages`], `RDMA_POOL_PURGE_MS=<milliseconds>|off` overrides
//! [`GlobalConfig::purge_delay`], `RDMA_POOL_NUMA=any|device|local|<node>` overrides
//! [`GlobalConfig::numa`], and `RDMA_POOL_NIC` picks the device as for
//! [`Nic::open_default`] when [`GlobalConfig::open`] is `None`. An unknown value is ignored
//! (and counted in [`GlobalStats::env_ignored`](super::GlobalStats::env_ignored)).

pub use crate::arena::Registration;
use crate::arena::{ArenaConfig, Hugepages, NumaPolicy, RegistrationPolicy};
use crate::nic::{self, Access, Nic};
use std::ffi::CStr;
use std::time::Duration;

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
/// use rdma_pool::arena::Hugepages;
/// // In a `static`: every field is const-constructible.
/// static POOL: GlobalPool = GlobalPool::with_config(GlobalConfig {
///     hugepages: Hugepages::Off,
///     reserve: 1 << 34,
///     on_failure: OnFailure::Degrade,
///     ..GlobalConfig::DEFAULT
/// });
/// assert_eq!(POOL.config().reserve, 1 << 34);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct GlobalConfig {
    /// Pinned or ODP registration (env `RDMA_POOL_REGISTRATION`). Default `Auto`: ODP where
    /// the device supports it for every operation and no quirk makes it unsafe, else pinned.
    pub registration: Registration,
    /// Hugepage policy (env `RDMA_POOL_HUGEPAGES=require|prefer|thp|off`). Default
    /// [`Hugepages::Transparent`]: a general heap on hugetlb pages dies of `SIGBUS` after a
    /// `fork` once the hugetlb pool is dry (see [`Hugepages`]).
    pub hugepages: Hugepages,
    /// Bytes of address space reserved (a power of two). Default 64 GiB.
    pub reserve: usize,
    /// How many reservations of `reserve` bytes the pool may hold: a full one adds the next
    /// (see [`ArenaConfig::reservations`]). Default 16 (1 TiB of address space, no memory).
    pub reservations: u32,
    /// Bytes per chunk (a power of two). Default 1 GiB, clamped to the device's `max_mr_size`.
    pub chunk: usize,
    /// Remote rights of the pool's own regions: empty by default (see
    /// [`ArenaConfig::remote`]; an opt-in for deployments whose peers are all trusted). Any
    /// right here needs the `unsafe`
    /// [`GlobalPool::with_remote_rights`](super::GlobalPool::with_remote_rights); any other
    /// constructor's pool refuses it when it initialises.
    pub remote: Access,
    /// Degrade to unregistered memory, or fail. Default `Degrade`.
    pub on_failure: OnFailure,
    /// How long freed slabs stay committed before they are returned to the system (env
    /// `RDMA_POOL_PURGE_MS`; `None`: only on [`GlobalPool::purge`](super::GlobalPool::purge)).
    /// Default 1 s.
    pub purge_delay: Option<Duration>,
    /// NUMA placement of the pool's chunks (env `RDMA_POOL_NUMA=any|device|local|<node>`; see
    /// [`NumaPolicy`]). Default `Any`: no binding. A node that is not online makes the arena
    /// fail to open, and the pool then degrades as [`GlobalConfig::on_failure`] says.
    pub numa: NumaPolicy,
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
        registration: Registration::Auto,
        hugepages: Hugepages::Transparent,
        reserve: 64 << 30,
        reservations: 16,
        chunk: 1 << 30,
        remote: Access::empty(),
        on_failure: OnFailure::Degrade,
        purge_delay: Some(Duration::from_secs(1)),
        numa: NumaPolicy::Any,
        open: None,
        fallback: super::Fallback::System,
    };

    /// This configuration with the environment's overrides applied; the second value counts
    /// variables that were set to an unknown value (and ignored).
    pub(crate) fn with_env(mut self) -> (GlobalConfig, u32) {
        let mut ignored = 0;
        match getenv(c"RDMA_POOL_REGISTRATION") {
            None => {}
            Some(b"pinned") => self.registration = Registration::Pinned,
            Some(b"odp") => self.registration = Registration::Odp,
            Some(b"auto") => self.registration = Registration::Auto,
            Some(_) => ignored += 1,
        }
        match getenv(c"RDMA_POOL_HUGEPAGES") {
            None => {}
            Some(b"require") => self.hugepages = Hugepages::Require,
            Some(b"prefer") => self.hugepages = Hugepages::Prefer,
            Some(b"thp" | b"transparent") => self.hugepages = Hugepages::Transparent,
            Some(b"off") => self.hugepages = Hugepages::Off,
            Some(_) => ignored += 1,
        }
        match getenv(c"RDMA_POOL_PURGE_MS") {
            None => {}
            Some(b"off") => self.purge_delay = None,
            Some(v) => match parse_u64(v) {
                Some(ms) => self.purge_delay = Some(Duration::from_millis(ms)),
                None => ignored += 1,
            },
        }
        match getenv(c"RDMA_POOL_NUMA") {
            None => {}
            Some(v) => match parse_numa(v) {
                Some(numa) => self.numa = numa,
                None => ignored += 1,
            },
        }
        (self, ignored)
    }

    /// The arena configuration this asks for.
    pub(crate) fn arena(&self) -> ArenaConfig {
        ArenaConfig {
            reserve: self.reserve,
            reservations: self.reservations,
            chunk: self.chunk,
            hugepages: self.hugepages,
            remote: self.remote,
            registration: self.registration,
            policy: match self.on_failure {
                OnFailure::Degrade => RegistrationPolicy::Degrade,
                OnFailure::Fail => RegistrationPolicy::Required,
            },
            purge_delay: self.purge_delay,
            numa: self.numa,
            ..ArenaConfig::default()
        }
    }
}

impl Default for GlobalConfig {
    fn default() -> Self {
        GlobalConfig::DEFAULT
    }
}

/// An `RDMA_POOL_NUMA` value: `any`, `device`, `local` or a node number.
fn parse_numa(v: &[u8]) -> Option<NumaPolicy> {
    match v {
        b"any" => Some(NumaPolicy::Any),
        b"device" => Some(NumaPolicy::DeviceNode),
        b"local" => Some(NumaPolicy::Local),
        _ => parse_u64(v)
            .and_then(|n| u32::try_from(n).ok())
            .map(NumaPolicy::Node),
    }
}

/// A decimal number (no sign, no blanks), or `None`.
fn parse_u64(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// The value of an environment variable, borrowed from the environment block (no allocation).
fn getenv(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: `name` is NUL-terminated; the result, when non-null, points into the process's
    // environment block, which this crate never modifies (a concurrent `setenv` by the program
    // is its own data race, as with any `getenv`).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    // SAFETY: a non-null result is a NUL-terminated string that lives as long as the entry.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_config_follows_the_global_one() {
        let strict = GlobalConfig {
            registration: Registration::Odp,
            on_failure: OnFailure::Fail,
            purge_delay: None,
            ..GlobalConfig::DEFAULT
        }
        .arena();
        assert_eq!(strict.registration, Registration::Odp);
        assert_eq!(strict.policy, RegistrationPolicy::Required);
        assert_eq!(strict.purge_delay, None);
        let auto = GlobalConfig::DEFAULT.arena();
        assert_eq!(auto.reserve, 64 << 30);
        assert_eq!(auto.registration, Registration::Auto);
        assert_eq!(auto.policy, RegistrationPolicy::Degrade);
        assert!(auto.remote.is_empty());
    }

    #[test]
    fn numa_values_parse() {
        assert_eq!(parse_numa(b"any"), Some(NumaPolicy::Any));
        assert_eq!(parse_numa(b"device"), Some(NumaPolicy::DeviceNode));
        assert_eq!(parse_numa(b"local"), Some(NumaPolicy::Local));
        assert_eq!(parse_numa(b"3"), Some(NumaPolicy::Node(3)));
        assert_eq!(parse_numa(b"Local"), None);
        assert_eq!(parse_numa(b"-1"), None);
        assert_eq!(parse_numa(b"99999999999"), None);
        assert_eq!(GlobalConfig::DEFAULT.arena().numa, NumaPolicy::Any);
        let local = GlobalConfig {
            numa: NumaPolicy::Local,
            ..GlobalConfig::DEFAULT
        };
        assert_eq!(local.arena().numa, NumaPolicy::Local);
    }

    #[test]
    fn numbers_parse_without_allocating() {
        assert_eq!(parse_u64(b"250"), Some(250));
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"1s"), None);
        assert_eq!(parse_u64(b"99999999999999999999999"), None);
    }

    #[test]
    fn getenv_reads_without_std_env() {
        assert_eq!(getenv(c"RDMA_POOL_SURELY_UNSET_VARIABLE"), None);
        assert!(getenv(c"PATH").is_some_and(|p| !p.is_empty()));
    }
}
