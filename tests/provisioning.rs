//! What the NIC layer allocates while the pool provisions memory — a registration's handle, the
//! soft NIC's tables — never comes from the heap of the thread that happened to register: such a
//! record lives as long as what it registers, and one of them in a thread's page kept that page,
//! and in a pinned pool the step under it, long after the thread exited. A Rust program's
//! `GlobalPool` serves those blocks outside the pool (bootstrap region, then `malloc`); one that
//! is the process's `malloc` (fallback `Mmap`, the C library) serves small ones from the pool's
//! provisioning heap, which no thread owns. `GlobalPool` is this binary's global allocator, on a
//! pinned arena of 4 KiB pages (registered in steps), on the soft NIC and on rxe in the guest.

#[path = "common/mod.rs"]
mod common;

use rdma_pool::GlobalPool;
use rdma_pool::arena::provision::Provisioning;
use rdma_pool::arena::{ArenaConfig, Hugepages, Registration};
use rdma_pool::global::{Fallback, GlobalConfig};
use std::alloc::{GlobalAlloc, Layout};

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
    a_pool_that_is_malloc_serves_small_records_from_its_provisioning_heap();
}

fn threads_that_registered_steps_and_exited_leave_no_step_registered() {
    let pool = A.pool().expect("the pool initialised");
    let sizes = [48usize, 200, 900, 3000];
    // Under the soft NIC's memlock limit (8 MiB by default): a refused step would blur the
    // count.
    let threads = 8;
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
                        let blocks: Vec<Box<[u8]>> = (0..300)
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
    assert!(peak >= 2 << 20, "{peak} bytes registered at the peak");
    // One step (256 KiB) of slack for this thread's own blocks; the threads' records in their
    // pages kept two or more (the code before). Memory-checker mode keeps freed blocks out of
    // reuse for a while, and their pages with them.
    assert!(
        cfg!(feature = "memcheck") || left <= base + (256 << 10),
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
    // Served while provisioning, outside the pool (bootstrap region or `malloc`): no keys.
    assert!(rdma_pool::keys_of(record.as_ptr()).is_none());
    let s = rdma_pool::stats().unwrap();
    assert!(s.reentrant_allocations >= before + 2);
    assert_eq!(s.provisioning_heap_blocks, 0, "{s:?}");
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

/// A pool that is the process's `malloc` (its fallback maps a page per block), used directly.
static M: GlobalPool = GlobalPool::with_config(GlobalConfig {
    arena: ArenaConfig {
        reserve: 1 << 30,
        chunk: 1 << 24,
        registration: Registration::Pinned,
        hugepages: Hugepages::Off,
        purge_delay: None,
        ..GlobalConfig::DEFAULT.arena
    },
    fallback: Fallback::Mmap,
    open: Some(common::open_pool_nic),
    ..GlobalConfig::DEFAULT
});

fn a_pool_that_is_malloc_serves_small_records_from_its_provisioning_heap() {
    M.init().expect("the pool initialised");
    let small = Layout::from_size_align(96, 8).unwrap();
    let big = Layout::from_size_align(8000, 8).unwrap();
    let (mine, records, big_record, after, claims) = std::thread::spawn(move || {
        // SAFETY: non-zero layouts; each block is freed once below, with its layout.
        unsafe {
            // Registered pages the provisioning heap can take without a NIC call (under a mark
            // no step is registered): the thread fills pages of its class and empties them.
            let warm: Vec<*mut u8> = (0..4000).map(|_| M.alloc(small)).collect();
            for p in warm {
                M.dealloc(p, small);
            }
            let mine = M.alloc(small);
            let claims = M.pool().unwrap().stats().alloc.heap_claims;
            let mark = Provisioning::enter();
            let records = [M.alloc(small), M.alloc(small)];
            let big_record = M.alloc(big);
            // A free of this thread's own block meanwhile (its heap is hidden: a remote free).
            M.dealloc(M.alloc(small), small);
            drop(mark);
            let after = M.alloc(small);
            (
                mine as usize,
                records.map(|p| p as usize),
                big_record as usize,
                after as usize,
                claims,
            )
        }
    })
    .join()
    .unwrap();
    let s = M.stats();
    // The two small records: pool memory, of the provisioning heap (not the thread's, hidden:
    // no heap was claimed meanwhile); the large one: outside the pool.
    assert!(s.provisioning_heap_blocks >= 2, "{s:?}");
    for r in records {
        assert!(M.keys_of(r as *const u8).is_some());
    }
    assert!(M.keys_of(big_record as *const u8).is_none());
    assert!(M.keys_of(after as *const u8).is_some());
    assert_eq!(M.pool().unwrap().stats().alloc.heap_claims, claims, "{s:?}");
    // SAFETY: the blocks allocated above, each freed once with its layout.
    unsafe {
        for p in [mine, after].into_iter().chain(records) {
            M.dealloc(p as *mut u8, small);
        }
        M.dealloc(big_record as *mut u8, big);
    }
    // The provisioning heap's pages go back like an exited thread's.
    M.pool().unwrap().purge();
    assert!(M.validate());
}
