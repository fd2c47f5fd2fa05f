//! Grants on the global pool: any heap `Vec` can be granted; a `Vec` dropped while its grant
//! is revoking is parked by `GlobalAlloc::dealloc` (which never blocks) until the invalidation
//! completed.

use crate::A;
use crate::common::{WAIT, serial};
use crate::peer::Peer;
use rdma_pool::nic::{Access, WcStatus};

/// The peer WRITEs `len` bytes of its landing zone to `addr` with `rkey`: the status.
fn peer_writes(p: &Peer, len: usize, addr: u64, rkey: rdma_pool::nic::Rkey) -> WcStatus {
    let sge = p.landing_mr.sge(0, len).unwrap();
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { p.peer_qp.post_write(3, &[sge], addr, rkey) }.unwrap();
    p.peer_cq.wait_one(WAIT).unwrap().status
}

#[test]
fn a_heap_vec_is_granted_and_its_key_dies_on_revoke() {
    let _s = serial();
    let p = Peer::new(64);
    let v = vec![0u8; 4096];
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g = unsafe {
        A.grant_with(
            &v[100..200],
            &p.qp,
            Access::REMOTE_WRITE,
            rdma_pool::grant::GrantKind::Auto,
        )
    }
    .unwrap();
    g.wait(&p.cq, |wc| panic!("{wc:?}")).unwrap();
    let w = g.wire();
    assert_eq!(peer_writes(&p, 64, w.addr, w.rkey), WcStatus::Success);
    assert_eq!(v[100..164], p.landing.as_slice()[..64]);
    g.revoke(&p.cq, |wc| panic!("{wc:?}")).unwrap();
    assert_ne!(peer_writes(&p, 64, w.addr, w.rkey), WcStatus::Success);
    drop(g);
    let s = A.pool().unwrap().stats().grants;
    assert_eq!((s.open, s.quarantined_blocks), (0, 0), "{s:?}");
}

#[test]
fn a_vec_dropped_while_its_grant_revokes_is_parked_by_dealloc() {
    let _s = serial();
    let p = Peer::new(64);
    let v = vec![7u8; 1000];
    let addr = v.as_ptr() as usize;
    let g = A.grant(&v, &p.qp).unwrap();
    // Revocation starts; the pool has not seen its completion yet.
    drop(g);
    drop(v);
    assert_eq!(A.pool().unwrap().stats().grants.quarantined_blocks, 1);
    let others: Vec<Vec<u8>> = (0..256).map(|_| vec![1u8; 1000]).collect();
    assert!(
        others.iter().all(|o| o.as_ptr() as usize != addr),
        "a parked block came back"
    );
    drop(others);
    // The pool's completions reach it inside the poll; none comes out.
    let deadline = std::time::Instant::now() + WAIT;
    while A.pool().unwrap().stats().grants.quarantined_blocks != 0 {
        assert_eq!(
            p.cq.poll_one().unwrap(),
            None,
            "the pool's completion came out"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the invalidation never completed"
        );
        std::thread::yield_now();
    }
    let s = A.pool().unwrap().stats().grants;
    assert_eq!((s.open, s.quarantined_blocks), (0, 0), "{s:?}");
}
