//! Owned posts of ordinary heap buffers under `GlobalPool`: a `Vec<u8>`, a `String`'s bytes
//! and a `Box<[u8]>` travel with their work requests and come back with the completions; a
//! dropped handle parks its `Vec` until the peer's SEND lands in it, never in a new one.

use crate::common::WAIT;
use crate::peer::Peer;
use rdma_pool::nic::WcStatus;
use std::time::Instant;

#[test]
fn heap_buffers_are_written_read_and_received_owned() {
    let mut p = Peer::new(1 << 20);
    let text = format!("owned write from pid {}", std::process::id()).into_bytes();
    let (raddr, rkey) = (p.landing_mr.addr() as u64, p.landing_mr.rkey());
    let done =
        p.qp.post_write_owned(1, text, raddr, rkey)
            .unwrap()
            .wait(WAIT)
            .unwrap();
    assert_eq!(done.completion.status, WcStatus::Success);
    assert_eq!(&p.landing.as_slice()[..done.buf.len()], &done.buf[..]);

    let boxed: Box<[u8]> = vec![0u8; 4096].into_boxed_slice();
    p.landing.as_mut_slice()[..4096].fill(0x42);
    let back =
        p.qp.post_read_owned(2, boxed, raddr, rkey)
            .unwrap()
            .wait(WAIT)
            .unwrap();
    assert_eq!(back.completion.status, WcStatus::Success);
    assert!(back.buf.iter().all(|&b| b == 0x42));
}

#[test]
fn a_dropped_heap_receive_is_parked_and_never_lands_in_a_new_vec() {
    let mut p = Peer::new(1 << 16);
    p.landing.as_mut_slice()[..32].fill(0xa5);
    let posted = p.qp.post_recv_owned(1, vec![0u8; 256]).unwrap();
    drop(posted);
    assert_eq!(p.cq.parked(), 1);
    // Same size, same thread: without parking this would be the block just dropped.
    let fresh = vec![0u8; 256];
    // The peer SENDs 32 bytes of its landing zone (a raw post: the peer is a plain verbs user).
    let sge = p.landing_mr.sge(0, 32).unwrap();
    // SAFETY: the landing zone outlives its region and is not written until the completion.
    unsafe { p.peer_qp.post_send(9, &[sge]) }.unwrap();
    assert_eq!(p.peer_cq.wait_one(WAIT).unwrap().status, WcStatus::Success);
    let start = Instant::now();
    while p.cq.parked() != 0 {
        let mut wc = [Default::default(); 4];
        assert_eq!(p.cq.poll(&mut wc).unwrap(), 0, "no application completion");
        assert!(start.elapsed() < WAIT, "the parked buffer never completed");
    }
    assert!(
        fresh.iter().all(|&b| b == 0),
        "the peer's bytes landed in a new Vec"
    );
}
