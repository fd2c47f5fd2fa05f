//! Locking helpers of the soft NIC: poison-tolerant locks and a sharded map.
//!
//! Contract: a panic while a lock is held (a bug) must not turn every later verb into a panic:
//! [`lock`] takes the data of a poisoned mutex as it is. [`Sharded`] splits a map over 16
//! independently locked shards, so that data-path lookups of different objects never contend
//! on one device-wide lock.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Lock `m`, ignoring poisoning.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A map split over 16 independently locked shards (by key modulo 16).
pub(super) struct Sharded<V> {
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
    /// The locked shard that holds `key`.
    pub(super) fn shard(&self, key: u64) -> MutexGuard<'_, HashMap<u64, V>> {
        lock(&self.shards[(key % 16) as usize])
    }
}
