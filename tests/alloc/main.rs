//! The allocator core (`rdma_pool::alloc`): a model-checked `Pool`, threads freeing each
//! other's blocks (and posting them to a peer), allocator-api2 collections, steady state
//! without NIC calls, pool and thread teardown. Runs on two soft NICs, and on `rxe0`/`rxe1` in
//! the QEMU guest (`RDMA_POOL_TEST_NIC=verbs`).

#[path = "../common/mod.rs"]
mod common;

mod api2;
mod footprint;
mod leaving;
mod medium;
mod model;
mod purge;
mod reclaim;
mod refused;
mod shared;
mod small_pages;
mod sparse;
mod step_limits;
mod steps;
mod teardown;
mod threads;
mod trim;

use common::*;
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages, STEP_BYTES};
use rdma_pool::nic::*;

/// A pool on `pd`: 16 GiB reserved, hugepages preferred, pool rights `remote`.
pub fn pool_on(pd: &Pd, remote: Access) -> Pool {
    pool_sharing(pd, remote, ArenaConfig::default().shared_bytes)
}

/// [`pool_on`] with no shared heaps: every block of a thread from pages of its own (what
/// tests of a thread's pages and caches look at).
pub fn own_pages_pool_on(pd: &Pd, remote: Access) -> Pool {
    pool_sharing(pd, remote, 0)
}

/// [`pool_on`], its threads served `shared_bytes` from the shared heaps.
pub fn pool_sharing(pd: &Pd, remote: Access, shared_bytes: u32) -> Pool {
    // SAFETY: the test's peers write only blocks the test hands them, and the test reads
    // those only after the write completed.
    unsafe {
        Pool::with_remote_rights(
            pd,
            ArenaConfig {
                reserve: 1 << 34,
                chunk: 1 << 28,
                hugepages: Hugepages::Prefer,
                remote,
                shared_bytes,
                ..Default::default()
            },
        )
    }
    .unwrap()
}

/// A byte pattern that differs per block and per offset.
pub fn pattern(seed: u64, i: usize) -> u8 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (i as u8).wrapping_mul(31)
}
