//! `GlobalPool` when things fail: an exhausted reservation under the `#[global_allocator]` of
//! this binary, injected registration failures, a NIC that cannot be opened, the `Fail` policy,
//! ODP asked for, threads racing the first allocation, and the environment overrides. Nothing
//! panics; every degraded allocation is counted and has no keys. Runs on the soft NIC, and on
//! `rxe0` in the QEMU guest (`RDMA_POOL_TEST_NIC=verbs`) for the global allocator itself; the
//! injected failures need the soft NIC's fault injection and use one in either place.

#[path = "../common/mod.rs"]
mod common;

mod env;
mod statics;
mod r#unsized;

use rdma_pool::GlobalPool;
use rdma_pool::arena::Hugepages;
use rdma_pool::global::{GlobalConfig, GlobalState};
use std::sync::Mutex;

/// A deliberately small pool: 64 MiB reserved in 16 MiB chunks, one reservation that never
/// grows.
#[global_allocator]
static A: GlobalPool = GlobalPool::with_config(GlobalConfig {
    arena: rdma_pool::arena::ArenaConfig {
        reserve: 64 << 20,
        reservations: 1,
        chunk: 16 << 20,
        hugepages: Hugepages::Off,
        ..GlobalConfig::DEFAULT.arena
    },
    open: Some(common::open_pool_nic),
    ..GlobalConfig::DEFAULT
});

/// Tests that fill the global pool run one at a time.
static FILL: Mutex<()> = Mutex::new(());

#[test]
fn an_exhausted_reservation_degrades_to_unregistered_memory_and_recovers() {
    let _one = FILL.lock().unwrap_or_else(|e| e.into_inner());
    A.init().expect("the pool initialised");
    let before = A.stats();
    let mut held: Vec<Vec<u8>> = Vec::with_capacity(64);
    let mut unregistered = 0;
    // 12 × 8 MiB cannot fit a 64 MiB reservation that also holds the small pages.
    for i in 0..12u8 {
        let v = vec![i; 8 << 20];
        if rdma_pool::keys_of(v.as_ptr()).is_none() {
            unregistered += 1;
        }
        assert!(v.iter().step_by(4096).all(|&b| b == i));
        held.push(v);
    }
    let after = A.stats();
    assert!(unregistered >= 4, "{unregistered} unregistered of 12");
    assert!(after.degraded_allocations >= before.degraded_allocations + unregistered);
    assert!(after.degraded_bytes >= before.degraded_bytes + unregistered * (8 << 20));
    // Why: the ready pool refused them (its reservation is full).
    assert!(after.degraded_by.pool_refused >= before.degraded_by.pool_refused + unregistered);
    assert_eq!(after.degraded_by.init_failed, 0);
    let pool = after.pool.expect("ready");
    assert!(pool.failed_allocations > 0);
    // Degraded blocks are freed (to the system allocator) like any other.
    held.clear();
    // The pool's own runs are cached again: 8 MiB buffers are registered once more.
    let again = vec![1u8; 8 << 20];
    assert!(rdma_pool::keys_of(again.as_ptr()).is_some());
    assert_eq!(A.stats().state, GlobalState::Ready);
}

#[test]
fn realloc_moves_a_degraded_block_into_the_pool_when_it_has_room() {
    let _one = FILL.lock().unwrap_or_else(|e| e.into_inner());
    // Fill the pool with 2 MiB runs until one allocation degrades (spare slabs of earlier
    // tests included).
    let mut held = Vec::new();
    loop {
        let v = vec![0u8; 2 << 20];
        let full = rdma_pool::keys_of(v.as_ptr()).is_none();
        held.push(v);
        if full {
            break;
        }
        assert!(held.len() < 64, "a 64 MiB reservation must fill up");
    }
    // A 2 MiB Vec now is unregistered too.
    let mut degraded = vec![0u8; 2 << 20];
    assert!(rdma_pool::keys_of(degraded.as_ptr()).is_none());
    degraded[..5].copy_from_slice(b"heals");
    let healed_before = A.stats().healed_reallocations;
    // Room again (the 4 MiB runs are cached): growing the Vec to 4 MiB moves it into the pool,
    // contents kept.
    held.clear();
    degraded.reserve_exact(2 << 20);
    assert!(rdma_pool::keys_of(degraded.as_ptr()).is_some());
    assert_eq!(&degraded[..5], b"heals");
    assert!(A.stats().healed_reallocations > healed_before);
}
