//! Re-entrancy: what the pool serves while this thread provisions (calls into the NIC), and
//! how `dealloc`/`realloc` recognise those blocks afterwards.

use crate::{A, assert_healthy};
use rdma_pool::arena::provision::Provisioning;

#[test]
fn allocations_while_provisioning_never_grow_the_arena() {
    let before = A.stats();
    let grown_before = A.pool().unwrap().stats().alloc.arena.runs;
    // A live block of the class keeps a page of it with room in this thread's heap (empty
    // pages leave the heap).
    let warm = vec![1u8; 1000];
    let mark = Provisioning::enter();
    // The pool has room for this one, but what is allocated under the mark is the NIC layer's
    // bookkeeping, which outlives this thread's pages: served outside the pool (the bootstrap
    // region), unregistered; this thread's heap is hidden meanwhile.
    let small = vec![7u8; 1000];
    assert!(rdma_pool::keys_of(small.as_ptr()).is_none());
    // This one needs a fresh 40 MiB run, which the arena refuses under the mark: it is served
    // from the bootstrap region or, being larger than it, by malloc — unregistered.
    let mut big: Vec<u8> = Vec::with_capacity(40 << 20);
    big.extend_from_slice(b"needs growth");
    assert!(rdma_pool::keys_of(big.as_ptr()).is_none());
    let during = A.stats();
    assert!(during.reentrant_allocations > before.reentrant_allocations);
    assert!(during.bootstrap_overflow > before.bootstrap_overflow);
    assert_eq!(
        during.degraded_allocations, 0,
        "re-entrant blocks are not degradation"
    );
    drop(mark);

    // Outside the mark: growing it moves it into the pool, contents kept…
    big.reserve_exact(41 << 20);
    assert!(rdma_pool::keys_of(big.as_ptr()).is_some());
    assert_eq!(&big[..], b"needs growth");
    assert!(A.pool().unwrap().stats().alloc.arena.runs > grown_before);
    assert_eq!(small.iter().map(|&b| b as u64).sum::<u64>(), 7000);
    assert_eq!(warm.iter().map(|&b| b as u64).sum::<u64>(), 1000);
    assert_healthy();
}

#[test]
fn pool_blocks_freed_while_provisioning_go_back_to_the_pool() {
    let blocks: Vec<Vec<u8>> = [16usize, 200, 5000, 100_000, 3 << 20]
        .iter()
        .map(|&n| vec![3u8; n])
        .collect();
    assert!(
        blocks
            .iter()
            .all(|b| rdma_pool::keys_of(b.as_ptr()).is_some())
    );
    let mark = Provisioning::enter();
    drop(blocks);
    drop(mark);
    // The blocks went back: the same sizes allocate again, registered.
    for n in [16usize, 200, 5000, 100_000, 3 << 20] {
        let b = vec![4u8; n];
        assert!(rdma_pool::keys_of(b.as_ptr()).is_some());
    }
    assert_healthy();
}
