//! `GlobalPool` as the `#[global_allocator]` of this test binary: every `Vec`, `Box`,
//! `String` and `HashMap` of the tests (and of the test harness) is pool memory. Threads hand
//! buffers to each other, vectors grow to MiBs, threads exit while their blocks live elsewhere;
//! every live allocation has keys, and posted as an RDMA WRITE source with its lkey it lands
//! its exact contents at a peer; with the opt-in remote rights a peer's READ returns them.
//! Runs on two soft NICs, and on `rxe0` (the pool) / `rxe1` (the peer) in the QEMU guest
//! (`RDMA_POOL_TEST_NIC=verbs`).

#[path = "../common/mod.rs"]
mod common;

mod bootstrap;
mod exit;
mod grant;
mod owned;
mod peer;
mod workload;

use rdma_pool::GlobalPool;
use rdma_pool::global::GlobalConfig;
use rdma_pool::nic::Access;

/// The pool of this binary: 16 GiB reserved in 256 MiB chunks, and — opt-in — remote read and
/// write rights on its own regions, so that a peer can READ any buffer.
// SAFETY: the tests' peers write only into buffers a test hands them, and the test reads those
// only after the write completed.
#[global_allocator]
static A: GlobalPool = unsafe {
    GlobalPool::with_remote_rights(GlobalConfig {
        arena: rdma_pool::arena::ArenaConfig {
            reserve: 1 << 34,
            chunk: 1 << 28,
            remote: Access::REMOTE_READ.union(Access::REMOTE_WRITE),
            ..GlobalConfig::DEFAULT.arena
        },
        open: Some(common::open_pool_nic),
        ..GlobalConfig::DEFAULT
    })
};

/// A pattern that differs per buffer and per offset.
pub fn pattern(seed: u64, i: usize) -> u8 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (i as u8).wrapping_mul(31)
}

/// Asserts that the global pool is healthy: ready, and nothing was degraded.
pub fn assert_healthy() {
    let s = rdma_pool::stats().expect("the global pool initialised");
    assert_eq!(s.state, rdma_pool::global::GlobalState::Ready);
    assert_eq!(s.degraded_allocations, 0, "{s:?}");
    assert_eq!(s.failed_allocations, 0);
    assert!(s.pool.is_some());
}

#[test]
fn the_pool_is_ready_and_registered_its_own_regions_with_the_opt_in_rights() {
    let pool = A.pool().expect("the pool initialised");
    assert!(
        pool.arena()
            .access()
            .contains(Access::REMOTE_READ | Access::REMOTE_WRITE)
    );
    assert!(A.init_error().is_none());
    let s = A.stats();
    // Opening the NIC and the arena happened inside the allocator: those allocations were
    // served while provisioning, and every one is accounted for.
    assert!(s.reentrant_allocations > 0, "{s:?}");
    assert!(
        s.provisioning_heap_blocks + s.bootstrap_blocks + s.bootstrap_overflow
            >= s.reentrant_allocations
    );
    assert_eq!(
        A.pd().unwrap().nic().caps().name,
        A.nic().unwrap().caps().name
    );
    assert_healthy();
}

#[test]
fn keys_of_knows_every_kind_of_pointer() {
    let on_stack = [0u8; 64];
    static IN_DATA: [u8; 64] = [0; 64];
    assert!(rdma_pool::keys_of(on_stack.as_ptr()).is_none());
    assert!(rdma_pool::keys_of(IN_DATA.as_ptr()).is_none());
    // C's malloc is not the pool.
    // SAFETY: a plain malloc/free pair.
    unsafe {
        let c = libc::malloc(4096);
        assert!(!c.is_null());
        assert!(rdma_pool::keys_of(c.cast::<u8>()).is_none());
        libc::free(c);
    }
    for size in [1usize, 8, 24, 100, 4096, 65_536, 300_000, 1 << 20, 3 << 20] {
        let v = vec![1u8; size];
        let k = rdma_pool::keys_of(v.as_ptr()).expect("a heap block");
        assert!(k.contains(v.as_ptr() as usize, v.len()), "{size}: {k:?}");
        assert_eq!(Some(k), A.keys_of(v.as_ptr()));
        let sge = A.sge_of(&v).unwrap();
        assert_eq!(
            (sge.addr, sge.length, sge.lkey),
            (v.as_ptr() as u64, size as u32, k.lkey)
        );
    }
    let b: Box<[u64]> = (0..1000).collect();
    assert!(rdma_pool::keys_of(b.as_ptr()).is_some());
    let s = String::from("a string");
    assert!(rdma_pool::keys_of(s.as_ptr()).is_some());
    assert_healthy();
}
