//! What the NIC layer allocates while the pool provisions memory — a registration's handle, the
//! soft NIC's tables — comes from the pool's provisioning heap, which no thread owns, not from
//! the heap of the thread that happened to register: such a record lives as long as what it
//! registers, and one of them in a thread's page kept that page, and in a pinned pool the step
//! under it, long after the thread exited. `GlobalPool` is this binary's global allocator, on a
//! pinned arena of 4 KiB pages (registered in steps), on the soft NIC and on rxe in the guest.

#[path = "common/mod.rs"]
mod common;

use rdma_pool::GlobalPool;
use rdma_pool::arena::provision::Provisioning;
use rdma_pool::arena::{ArenaConfig, Hugepages, Registration};
use rdma_pool::global::GlobalConfig;

#[global_allocator]
static A: GlobalPool = GlobalPool::with_config(GlobalConfig {
    arena: ArenaConfig {
        registration: Registration::Pinned,
        hugepages: Hugepages::Off,
        // Purged by the test alone (a timed pass holding the purge lock would make one of its
        // purges a no-op).
        purge_delay: None,
        ..GlobalConfig::DEFAULT.arena
    },
    open: Some(common::open_pool_nic),
    ..GlobalConfig::DEFAULT
});

fn registered() -> u64 {
    A.pool().unwrap().stats().alloc.arena.registered_bytes
}

/// One test: another one's threads registering, or its `purge()` running meanwhile (the purge
/// lock is tried, not waited for), would blur what this one counts.
#[test]
fn records_of_registrations_are_no_threads() {
    threads_that_registered_steps_and_exited_leave_no_step_registered();
    a_block_allocated_while_provisioning_is_no_threads_and_its_threads_heap_comes_back();
}

fn threads_that_registered_steps_and_exited_leave_no_step_registered() {
    let pool = A.pool().expect("the pool initialised");
    let sizes = [48usize, 200, 900, 3000];
    let threads = 12;
    pool.purge();
    let base = registered();
    let mut peak = 0;
    for wave in 0..3u8 {
        let held = std::sync::Barrier::new(threads + 1);
        let done = std::sync::Barrier::new(threads + 1);
        std::thread::scope(|s| {
            let joined: Vec<_> = (0..threads as u8)
                .map(|t| {
                    let (held, done) = (&held, &done);
                    s.spawn(move || {
                        // Each thread's pages come from steps it registers (a pinned arena of
                        // 4 KiB pages registers a step when a page of it is first handed out).
                        let blocks: Vec<Box<[u8]>> = (0..400)
                            .map(|i| vec![wave ^ t ^ i as u8; sizes[i % sizes.len()]].into())
                            .collect();
                        held.wait();
                        done.wait();
                        for (i, b) in blocks.iter().enumerate() {
                            assert!(b.iter().all(|&x| x == wave ^ t ^ i as u8));
                            assert!(rdma_pool::keys_of(b.as_ptr()).is_some());
                        }
                    })
                })
                .collect();
            held.wait();
            peak = peak.max(registered());
            done.wait();
            // Joined, not only finished: a thread gives its heap back in its exit, after its
            // closure returned (and the scope's end waits only for that).
            for t in joined {
                t.join().unwrap();
            }
        });
        // The threads exited with nothing live: every step of their pages goes back.
        pool.purge();
    }
    let left = registered();
    let s = rdma_pool::stats().unwrap();
    assert_eq!(s.degraded_allocations, 0, "{s:?}");
    assert_eq!(s.pool.as_ref().unwrap().failed_allocations, 0, "{s:?}");
    assert!(
        s.reentrant_allocations > 0,
        "registrations allocated nothing? {s:?}"
    );
    assert!(peak >= 3 << 20, "{peak} bytes registered at the peak");
    assert!(
        left <= base + (512 << 10),
        "{left} bytes still registered once every thread's blocks were freed (peak {peak}, {base} before): {:?}",
        s.pool.as_ref()
    );
}

fn a_block_allocated_while_provisioning_is_no_threads_and_its_threads_heap_comes_back() {
    let pool = A.pool().expect("the pool initialised");
    let before = rdma_pool::stats().unwrap().reentrant_allocations;
    let (record, mine) = std::thread::spawn(|| {
        let mine = vec![1u8; 100];
        let claims = pool.stats().alloc.heap_claims;
        let record = {
            let _mark = Provisioning::enter();
            let record = vec![7u8; 100];
            // Nested marks, frees of this thread's own blocks and of records meanwhile.
            let nested = Provisioning::enter();
            drop(vec![3u8; 64]);
            drop(nested);
            record
        };
        let after: Box<[u8]> = vec![2u8; 100].into_boxed_slice();
        // The thread's heap was hidden, not given up: no second one was claimed.
        assert!(pool.stats().alloc.heap_claims <= claims + 1);
        assert!(rdma_pool::keys_of(after.as_ptr()).is_some());
        (record, mine)
    })
    .join()
    .unwrap();
    assert!(record.iter().all(|&b| b == 7) && mine.iter().all(|&b| b == 1));
    // Served while provisioning (by the provisioning heap, or the bootstrap region when that
    // heap was busy).
    assert!(rdma_pool::stats().unwrap().reentrant_allocations >= before + 2);
    // A thread that leaks its mark still gives its heap back at exit, and others work on.
    std::thread::spawn(|| {
        std::mem::forget(Provisioning::enter());
        drop(vec![4u8; 300]);
    })
    .join()
    .unwrap();
    let v: Vec<u64> = (0..10_000).collect();
    assert!(rdma_pool::keys_of(v.as_ptr()).is_some());
    drop((record, mine));
}
