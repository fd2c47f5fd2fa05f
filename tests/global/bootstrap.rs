//! Re-entrancy: what the pool serves while this thread provisions (calls into the NIC), and
//! how `dealloc`/`realloc` recognise those blocks afterwards.

use crate::{A, assert_healthy};
use rdma_pool::arena::provision::Provisioning;

#[test]
fn allocations_while_provisioning_come_from_the_bootstrap_region_and_are_freed_there() {
    let before = A.stats();
    let mark = Provisioning::enter();
    let v = vec![7u8; 1000];
    let mut grown: Vec<u64> = Vec::with_capacity(4);
    grown.extend(0..4);
    // Not pool memory: no keys, served by the bootstrap region.
    assert!(rdma_pool::keys_of(v.as_ptr()).is_none());
    assert!(rdma_pool::keys_of(grown.as_ptr()).is_none());
    let during = A.stats();
    assert!(during.reentrant_allocations >= before.reentrant_allocations + 2);
    assert!(during.bootstrap_blocks >= before.bootstrap_blocks + 2);
    drop(mark);

    // Outside the mark: a bootstrap block that grows moves into the pool…
    grown.extend(4..100_000);
    assert!(rdma_pool::keys_of(grown.as_ptr()).is_some());
    assert!(grown.iter().enumerate().all(|(i, &x)| x == i as u64));
    // …and freeing one is recognised (a free of a bootstrap block through `free` would crash).
    assert_eq!(v.iter().map(|&b| b as u64).sum::<u64>(), 7000);
    drop(v);
    assert_healthy();
}

#[test]
fn pool_blocks_freed_while_provisioning_take_the_cross_thread_path() {
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
