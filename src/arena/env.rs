//! The environment's overrides of an [`ArenaConfig`]: one place for every pool of the process
//! (a [`Pool`](crate::Pool) built with any configuration, and
//! [`GlobalPool`](crate::GlobalPool)), so an operator changes them without a rebuild.
//!
//! Contract: read when a pool is built, with `getenv` (no allocation, no lock):
//! - `RDMA_POOL_REGISTRATION=pinned|odp|auto` → [`ArenaConfig::registration`];
//! - `RDMA_POOL_HUGEPAGES=require|prefer|thp|transparent|off` → [`ArenaConfig::hugepages`];
//! - `RDMA_POOL_PURGE_MS=<milliseconds>|off` → [`ArenaConfig::purge_delay`];
//! - `RDMA_POOL_PURGE_THREAD=on|off` → [`ArenaConfig::purge_thread`];
//! - `RDMA_POOL_SHARED_BYTES=<bytes>` (at most 4 GiB − 1) → [`ArenaConfig::shared_bytes`];
//! - `RDMA_POOL_NUMA=any|device|local|<node>` → [`ArenaConfig::numa`].
//!
//! An unset variable changes nothing; an unknown value is ignored and counted
//! (`PoolStats::env_ignored`, `GlobalStats::env_ignored`). [`Arena::new`](super::Arena::new)
//! itself takes its configuration as given.

use super::{ArenaConfig, Hugepages, NumaPolicy, Registration};
use crate::sys::env::{getenv, parse_u64};
use std::time::Duration;

impl ArenaConfig {
    /// This configuration with the environment's overrides applied (see the module docs);
    /// what every pool does with the configuration it is given.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::arena::ArenaConfig;
    /// // With no RDMA_POOL_* variable set, nothing changes.
    /// # if std::env::var_os("RDMA_POOL_HUGEPAGES").is_none() && std::env::var_os("RDMA_POOL_REGISTRATION").is_none()
    /// #     && std::env::var_os("RDMA_POOL_PURGE_MS").is_none() && std::env::var_os("RDMA_POOL_NUMA").is_none()
    /// #     && std::env::var_os("RDMA_POOL_PURGE_THREAD").is_none()
    /// #     && std::env::var_os("RDMA_POOL_SHARED_BYTES").is_none() {
    /// assert_eq!(ArenaConfig::DEFAULT.with_env(), ArenaConfig::DEFAULT);
    /// # }
    /// ```
    pub fn with_env(self) -> ArenaConfig {
        self.with_env_counted().0
    }

    /// [`ArenaConfig::with_env`], and how many variables were set to an unknown value.
    pub(crate) fn with_env_counted(mut self) -> (ArenaConfig, u32) {
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
        match getenv(c"RDMA_POOL_PURGE_THREAD") {
            None => {}
            Some(b"on" | b"1") => self.purge_thread = true,
            Some(b"off" | b"0") => self.purge_thread = false,
            Some(_) => ignored += 1,
        }
        match getenv(c"RDMA_POOL_SHARED_BYTES") {
            None => {}
            Some(v) => match parse_u64(v).and_then(|n| u32::try_from(n).ok()) {
                Some(n) => self.shared_bytes = n,
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
}

/// `any`, `device`, `local` or a node number.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_values_parse() {
        assert_eq!(parse_numa(b"any"), Some(NumaPolicy::Any));
        assert_eq!(parse_numa(b"device"), Some(NumaPolicy::DeviceNode));
        assert_eq!(parse_numa(b"local"), Some(NumaPolicy::Local));
        assert_eq!(parse_numa(b"3"), Some(NumaPolicy::Node(3)));
        assert_eq!(parse_numa(b"Local"), None);
        assert_eq!(parse_numa(b"-1"), None);
        assert_eq!(parse_numa(b"99999999999"), None);
    }
}
