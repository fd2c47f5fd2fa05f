//! Rules: the RC connection — connecting, the responder's state, receives and sends, and the
//! order of requests behind a waiting SEND.

use crate::common::*;
use rdma_pool::nic::*;

#[test]
fn receives_are_flushed_when_the_qp_fails() {
    let bed = default_bed();
    let (_r, rmr) = bed.b.reg_buf(4096, 0, Access::LOCAL_WRITE);
    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
    unsafe { bed.qb.post_recv(1, &[rmr.sge(0, 4096).unwrap()]) }.unwrap();
    // Fail the responder QP with a bad bind.
    let (_mem, mr) = bed.b.reg_buf(4096, 0, RW);
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .bind_mw(2, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    let mut got = bed.b.wait_n(2);
    got.sort_by_key(|c| c.0);
    assert_eq!(
        got,
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::MwBindErr)]
    );
}

#[test]
fn small_receive_is_a_length_error() {
    let bed = default_bed();
    let (_r, rmr) = bed.b.reg_buf(4096, 0, Access::LOCAL_WRITE);
    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
    unsafe { bed.qb.post_recv(1, &[rmr.sge(0, 4).unwrap()]) }.unwrap();
    let (_s, smr) = bed.a.reg_buf(4096, 1, Access::LOCAL_WRITE);
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { bed.qa.post_send(2, &[smr.sge(0, 64).unwrap()]) }.unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::LocLenErr);
    assert_ne!(bed.a.wait().status, WcStatus::Success);
}

#[test]
fn send_waits_for_a_receive() {
    let bed = default_bed();
    let (_s, smr) = bed.a.reg_buf(4096, 9, Access::LOCAL_WRITE);
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { bed.qa.post_send(2, &[smr.sge(0, 16).unwrap()]) }.unwrap();
    assert!(
        bed.a.cq.poll_one().unwrap().is_none(),
        "no receive yet: the send is not complete"
    );
    let (r, rmr) = bed.b.reg_buf(4096, 0, Access::LOCAL_WRITE);
    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
    unsafe { bed.qb.post_recv(1, &[rmr.sge(0, 4096).unwrap()]) }.unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    assert_eq!(bed.b.wait().byte_len, 16);
    assert!(r.as_slice()[..16].iter().all(|&x| x == 9));
}

#[test]
fn posting_before_connect_is_refused() {
    let nic = Nic::soft();
    let side = Side::new(nic);
    let qp = side.qp();
    let (_s, smr) = side.reg_buf(4096, 9, Access::LOCAL_WRITE);
    assert_eq!(
        // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
        unsafe { qp.post_send(1, &[smr.sge(0, 8).unwrap()]) }
            .unwrap_err()
            .errno(),
        Some(libc::EINVAL)
    );
}

#[test]
fn a_responder_that_is_not_ready_drops_requests() {
    let (a, b) = (Side::new(Nic::soft()), Side::new(Nic::soft()));
    let (qa, qb) = (a.qp(), b.qp());
    qa.connect(&qb.endpoint().unwrap()).unwrap(); // the responder side never connects
    let (_src, src_mr) = a.reg_buf(4096, 1, Access::LOCAL_WRITE);
    let (dst, dst_mr) = b.reg_buf(4096, 0, RW);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        qa.post_write(
            1,
            &[src_mr.sge(0, 64).unwrap()],
            dst_mr.addr() as u64,
            dst_mr.rkey(),
        )
    }
    .unwrap();
    assert_eq!(a.wait().status, WcStatus::RetryExcErr);
    assert!(
        dst.as_slice().iter().all(|&x| x == 0),
        "nothing lands at an unconnected QP"
    );
}

#[test]
fn connect_is_refused_after_the_error_state() {
    let bed = default_bed();
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { bed.qa.post_write(1, &[], 0, Rkey(0)) }.unwrap();
    bed.a.wait();
    let (_src, src_mr) = bed.a.reg_buf(4096, 1, Access::LOCAL_WRITE);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa
            .post_write(2, &[src_mr.sge(0, 8).unwrap()], 0, Rkey(0))
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::RemAccessErr);
    let e = bed.qa.connect(&bed.qb.endpoint().unwrap()).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL));
    assert_eq!(bed.qa.state().unwrap(), QpState::Error);
}

#[test]
fn requests_behind_a_waiting_send_keep_rc_order() {
    let bed = default_bed();
    let (_s, smr) = bed.a.reg_buf(4096, 7, Access::LOCAL_WRITE);
    let (d, dmr) = bed.b.reg_buf(4096, 0, RW);
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { bed.qa.post_send(1, &[smr.sge(0, 16).unwrap()]) }.unwrap();
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa.post_write(
            2,
            &[smr.sge(0, 64).unwrap()],
            dmr.addr() as u64 + 1024,
            dmr.rkey(),
        )
    }
    .unwrap();
    assert!(
        bed.a.cq.poll_one().unwrap().is_none(),
        "both wait for the receive"
    );
    assert!(
        d.as_slice()[1024..1088].iter().all(|&x| x == 0),
        "the WRITE waits behind the SEND"
    );
    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
    unsafe { bed.qb.post_recv(9, &[dmr.sge(0, 1024).unwrap()]) }.unwrap();
    let ids = bed.a.wait_n(2);
    assert_eq!(ids, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert!(d.as_slice()[1024..1088].iter().all(|&x| x == 7));
}

#[test]
fn a_failing_responder_fails_the_sends_waiting_there() {
    let bed = default_bed();
    let (_s, smr) = bed.a.reg_buf(4096, 7, Access::LOCAL_WRITE);
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { bed.qa.post_send(1, &[smr.sge(0, 16).unwrap()]) }.unwrap();
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { bed.qa.post_send(2, &[smr.sge(0, 16).unwrap()]) }.unwrap();
    // Put the responder in the error state with a bind that must fail.
    let (_mem, mr) = bed.b.reg_buf(4096, 0, RW);
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .bind_mw(3, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::MwBindErr);
    let got = bed.a.wait_n(2);
    assert_eq!(
        got,
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(bed.qa.state().unwrap(), QpState::Error);
}

#[test]
fn a_destroyed_requester_never_delivers_its_waiting_sends() {
    let bed = default_bed();
    let (_s, smr) = bed.a.reg_buf(4096, 7, Access::LOCAL_WRITE);
    let (qa2, qb2) = connect(&bed.a, &bed.b);
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { qa2.post_send(1, &[smr.sge(0, 16).unwrap()]) }.unwrap();
    drop(qa2);
    let (r, rmr) = bed.b.reg_buf(4096, 0, Access::LOCAL_WRITE);
    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
    unsafe { qb2.post_recv(5, &[rmr.sge(0, 4096).unwrap()]) }.unwrap();
    assert!(
        bed.b.cq.poll_one().unwrap().is_none(),
        "the receive stays posted"
    );
    assert!(r.as_slice().iter().all(|&x| x == 0));
}

/// An RC connection is a pair: a QP connected one way to a responder that is connected to
/// another QP gets nothing through it — not the responder's type 2 window (bound to the
/// responder, for its own peer), not its memory — and sees its retries run out.
#[test]
fn a_third_qp_connected_one_way_reaches_nothing_through_the_responder() {
    let bed = default_bed();
    let (_mem, mr) = bed.b.reg_buf(4096, 0x5a, RW | Access::MW_BIND);
    let mut mw = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    // SAFETY: the window's memory outlives it; the test reads it after the accesses.
    let rkey = unsafe {
        bed.qb.post_bind_mw(
            1,
            &mut mw,
            &mr,
            0,
            4096,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    // The legitimate peer reads through the window.
    let (_d, dst) = bed.a.reg_buf(64, 0, Access::LOCAL_WRITE);
    // SAFETY: `dst` is not read until the completion.
    unsafe {
        bed.qa
            .post_read(2, &[dst.sge(0, 64).unwrap()], mr.addr() as u64, rkey)
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    // A third QP connects to the responder one way; the responder stays paired with `qa`.
    let third = bed.a.qp();
    third.connect(&bed.qb.endpoint().unwrap()).unwrap();
    let (_t, tmr) = bed.a.reg_buf(64, 0xee, Access::LOCAL_WRITE);
    // SAFETY: `tmr` is neither freed nor written until the completion.
    unsafe { third.post_write(3, &[tmr.sge(0, 64).unwrap()], mr.addr() as u64, rkey) }.unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::RetryExcErr);
    assert!(
        mr_bytes(&mr).iter().all(|&b| b == 0x5a),
        "the third QP wrote through the responder's window"
    );
}

/// The bytes of a region of a test buffer.
fn mr_bytes(mr: &Mr) -> &[u8] {
    // SAFETY: the region covers a live test buffer of `mr.len()` bytes.
    unsafe { std::slice::from_raw_parts(mr.addr() as *const u8, mr.len()) }
}
