//! Rules: memory windows — binding (type 1 and 2, PD, QP, region rights), invalidation,
//! a window's bounds and remote rights, and what a settled window still holds.

use crate::common::*;
use rdma_pool::nic::soft::ReregMode;
use rdma_pool::nic::*;

#[test]
fn window_keys_are_not_local_keys() {
    let bed = default_bed();
    let (_mem, mr, mut mw) = bed.a.window_over(4096, 0, MwType::Type1);
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let rkey = unsafe {
        bed.qa
            .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    let (_dst, dst_mr) = bed.b.reg_buf(4096, 0, RW);
    let sge = sge(mr.addr() as u64, 64, Lkey(rkey.0));
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa
            .post_write(2, &[sge], dst_mr.addr() as u64, dst_mr.rkey())
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::LocProtErr);
}

#[test]
fn type1_window_is_usable_from_any_qp() {
    let bed = default_bed();
    let (_mem, mr, mut mw) = bed.b.window_over(4096, 0x61, MwType::Type1);
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let rkey = unsafe {
        bed.qb
            .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    let (qa2, _qb2) = connect(&bed.a, &bed.b);
    let (dst, dst_mr) = bed.a.reg_buf(4096, 0, Access::LOCAL_WRITE);
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe { qa2.post_read(3, &[dst_mr.sge(0, 64).unwrap()], mr.addr() as u64, rkey) }.unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    assert!(dst.as_slice()[..64].iter().all(|&x| x == 0x61));
}

#[test]
fn writable_window_needs_local_write_on_the_region() {
    let bed = default_bed();
    let (_mem, mr) = bed
        .b
        .reg_buf(4096, 0, Access::REMOTE_READ | Access::MW_BIND);
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_ATOMIC)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::MwBindErr);
}

#[test]
fn type2_window_must_be_invalidated_before_rebinding() {
    let bed = default_bed();
    let (_mem, mr, mut mw) = bed.b.window_over(4096, 0, MwType::Type2);
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let k1 = unsafe {
        bed.qb
            .post_bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .post_bind_mw(2, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::MwBindErr);
    let _ = k1;
}

#[test]
fn type2_window_cannot_be_bound_to_nothing() {
    let bed = default_bed();
    let (_mem, mr, mut mw) = bed.b.window_over(4096, 0, MwType::Type2);
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .post_bind_mw(1, &mut mw, &mr, 0, 0, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::MwBindErr);
}

#[test]
fn zero_based_type2_window_addresses_from_its_start() {
    let bed = default_bed();
    let mut mem = buf(2 * 4096, 0);
    mem.as_mut_slice()[4096..].fill(0x7e);
    let mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let rkey = unsafe {
        bed.qb.post_bind_mw(
            1,
            &mut mw,
            &mr,
            4096,
            4096,
            Access::REMOTE_READ | Access::ZERO_BASED,
        )
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    let (dst, dst_mr) = bed.a.reg_buf(4096, 0, Access::LOCAL_WRITE);
    assert_eq!(read(&bed, &dst_mr, 4096, 0, rkey), WcStatus::Success);
    assert!(dst.as_slice().iter().all(|&x| x == 0x7e));
    assert_eq!(
        read(&bed, &dst_mr, 64, 4096 - 32, rkey),
        WcStatus::RemAccessErr,
        "past the window's end"
    );
}

#[test]
fn window_key_must_belong_to_the_responders_pd() {
    // Kills: keys.rs, window branch of check_and_access, `mw.pd != who.pd` check removed.
    let bed = default_bed();
    let (_mem, mr, mut mw) = bed.b.window_over(4096, 0x5c, MwType::Type1);
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let rkey = unsafe {
        bed.qb
            .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    // A responder QP in another PD of the same device must not honour the window.
    let pd2 = bed.b.nic.alloc_pd().unwrap();
    let (qa2, _qb2) = connect_into_pd(&bed.a, &bed.b, &pd2);
    let (dst, dst_mr) = bed.a.reg_buf(4096, 0, Access::LOCAL_WRITE);
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe { qa2.post_read(2, &[dst_mr.sge(0, 64).unwrap()], mr.addr() as u64, rkey) }.unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::RemAccessErr);
    assert!(dst.as_slice().iter().all(|&x| x == 0));
}

#[test]
fn bind_needs_window_region_and_qp_in_one_pd() {
    // Kills: qp.rs bind, `w.pd != self.pd` removed; and `mr.pd != w.pd` removed. (A type 1
    // bind with a region of another PD is refused at the call: see the scenario
    // `bind_mw_refuses_bad_input_at_the_call`.)
    let bed = default_bed();
    let pd2 = bed.b.nic.alloc_pd().unwrap();
    let mut mem = buf(4096, 0);
    let mr2 = reg_in(&pd2, &mut mem, RW | Access::MW_BIND).unwrap();
    // A type 2 window and its region in pd2, bound through a QP of the bed's PD: the post is
    // accepted, the bind fails when it executes.
    let mut mw2 = pd2.alloc_mw(MwType::Type2).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .post_bind_mw(1, &mut mw2, &mr2, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(
        bed.b.wait().status,
        WcStatus::MwBindErr,
        "window of another PD"
    );
    // A type 1 window of pd2 unbound through a QP of the bed's PD.
    let (_qa, qb) = connect(&bed.a, &bed.b);
    let mut mw1 = pd2.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe { qb.bind_mw(2, &mut mw1, &mr2, 0, 0, Access::empty()) }.unwrap();
    assert_eq!(
        bed.b.wait().status,
        WcStatus::MwBindErr,
        "unbind in another PD"
    );
}

#[test]
fn send_with_invalidate_needs_the_window_bound_through_the_receiving_qp() {
    // Kills: qp.rs invalidate, `qpn.is_some_and(|q| b.qpn != Some(q))` removed.
    let bed = default_bed();
    let (_mem, mr, mut mw) = bed.b.window_over(4096, 0x48, MwType::Type2);
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let rkey = unsafe {
        bed.qb
            .post_bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    // SEND_WITH_INV arriving on another QP of the same PD.
    let (qa2, qb2) = connect(&bed.a, &bed.b);
    let (_rbuf, rmr) = bed.b.reg_buf(4096, 0, Access::LOCAL_WRITE);
    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
    unsafe { qb2.post_recv(2, &[rmr.sge(0, 4096).unwrap()]) }.unwrap();
    let (_sbuf, smr) = bed.a.reg_buf(4096, 1, Access::LOCAL_WRITE);
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { qa2.post_send_with_inv(3, &[smr.sge(0, 8).unwrap()], rkey) }.unwrap();
    assert_ne!(bed.a.wait().status, WcStatus::Success);
    let wc = bed.b.wait();
    assert_eq!((wc.wr_id, wc.invalidated_rkey), (2, None));
    assert_ne!(wc.status, WcStatus::Success);
    // The window still works through the QP it is bound to.
    let (dst, dst_mr) = bed.a.reg_buf(4096, 0, Access::LOCAL_WRITE);
    assert_eq!(
        read(&bed, &dst_mr, 64, mr.addr() as u64, rkey),
        WcStatus::Success
    );
    assert!(dst.as_slice()[..64].iter().all(|&x| x == 0x48));
    drop(mw);
}

#[test]
fn window_bounds_below_the_window_start() {
    // Kills: keys.rs window branch, `addr < b.addr as u64` removed (the end check alone passes).
    let bed = default_bed();
    let (_mem, mr, mut mw) = bed.b.window_over(3 * 4096, 0x31, MwType::Type1);
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let rkey = unsafe {
        bed.qb
            .bind_mw(1, &mut mw, &mr, 4096, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    let (dst, dst_mr) = bed.a.reg_buf(4096, 0, Access::LOCAL_WRITE);
    // Inside the region, before the window.
    assert_eq!(
        read(&bed, &dst_mr, 64, mr.addr() as u64, rkey),
        WcStatus::RemAccessErr
    );
    assert!(dst.as_slice().iter().all(|&x| x == 0));
}

#[test]
fn a_poisoned_region_cannot_be_bound() {
    let bed = rereg_bed(ReregMode::Unsupported);
    let mut mem = buf(4096, 0);
    let mut mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    rereg_access(&mut mr, RW).unwrap_err();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let e = unsafe {
        bed.qb
            .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert_eq!(
        bed.qb.state().unwrap(),
        QpState::Ready,
        "nothing was posted"
    );
}

#[test]
fn settled_windows_release_what_they_no_longer_bind() {
    let bed = default_bed();
    let soft = bed.b.nic.as_soft().unwrap();
    let (mut ma, mut mb) = (buf(4096, 0), buf(4096, 0));
    let mr_a = bed.b.reg(&mut ma, RW | Access::MW_BIND).unwrap();
    let mr_b = bed.b.reg(&mut mb, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .bind_mw(1, &mut mw, &mr_a, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert!(mw.settle(bed.b.wait().status));
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .bind_mw(2, &mut mw, &mr_b, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert!(mw.settle(bed.b.wait().status));
    drop(mr_a);
    assert_eq!(
        soft.counters().deregistrations,
        1,
        "the old region is released once settled"
    );
    // A type 2 window lets go of its region (and QP) once its invalidation is settled.
    let mut mw2 = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    let (mut mc, _) = (buf(4096, 0), ());
    let mr_c = bed.b.reg(&mut mc, RW | Access::MW_BIND).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .post_bind_mw(3, &mut mw2, &mr_c, 0, 64, Access::REMOTE_READ)
    }
    .unwrap();
    assert!(mw2.settle(bed.b.wait().status));
    bed.qb.post_invalidate(4, &mut mw2).unwrap();
    assert!(mw2.settle(bed.b.wait().status));
    drop(mr_c);
    assert_eq!(soft.counters().deregistrations, 2);
    assert!(!mw2.settle(WcStatus::Success), "nothing pending");
    drop(mr_b);
}

#[test]
fn windows_grant_remote_rights_their_region_does_not_have() {
    // IB C10-73/74: binding needs MW_BIND, writable windows need LOCAL_WRITE on the region; the
    // region itself needs no remote rights: that is how one buffer is granted, and only it.
    let bed = default_bed();
    let (mem, mr) = bed
        .b
        .reg_buf(2 * 4096, 0, Access::LOCAL_WRITE | Access::MW_BIND);
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let rkey = unsafe {
        bed.qb
            .bind_mw(1, &mut mw, &mr, 4096, 4096, Access::REMOTE_WRITE)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    let (_src, src_mr) = bed.a.reg_buf(4096, 3, Access::LOCAL_WRITE);
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64 + 4096, rkey),
        WcStatus::Success
    );
    assert!(mem.as_slice()[4096..4160].iter().all(|&x| x == 3));
    let (qa2, _qb2) = connect(&bed.a, &bed.b);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        qa2.post_write(
            2,
            &[src_mr.sge(0, 64).unwrap()],
            mr.addr() as u64,
            mr.rkey(),
        )
    }
    .unwrap();
    assert_eq!(
        bed.a.wait().status,
        WcStatus::RemAccessErr,
        "the region's own rkey grants nothing"
    );
}

/// LOCAL_INV and BIND_MW are work requests: they take effect when the send queue reaches them,
/// not when posted. Behind a SEND waiting at the responder for a receive, a type 2 window's
/// key keeps working; once the receive lets the queue run, the invalidation kills the old key
/// and the bind behind it makes the new one, completing in post order.
#[test]
fn local_inv_and_binds_take_effect_in_send_queue_order() {
    let bed = default_bed();
    let (_mem, mr, mut mw) = bed.b.window_over(4096, 5, MwType::Type2);
    // SAFETY: the bound memory outlives the window; the test reads it only after the accesses.
    let key = unsafe {
        bed.qb
            .post_bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    let (_mem2, mr2, mut mw2) = bed.b.window_over(4096, 6, MwType::Type2);
    // The server's SEND waits at the client for a receive; an invalidation and a bind queue
    // behind it.
    let (_s, smr) = bed.b.reg_buf(64, 1, Access::LOCAL_WRITE);
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { bed.qb.post_send(2, &[smr.sge(0, 8).unwrap()]) }.unwrap();
    bed.qb.post_local_inv(3, key).unwrap();
    // SAFETY: as above.
    let key2 = unsafe {
        bed.qb
            .post_bind_mw(4, &mut mw2, &mr2, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    let (_d, dmr) = bed.a.reg_buf(4096, 0, RW);
    let read = |id, rkey: Rkey, addr: usize| {
        // SAFETY: the read's memory stays allocated and unread until its completion is polled.
        unsafe {
            bed.qa
                .post_read(id, &[dmr.sge(0, 8).unwrap()], addr as u64, rkey)
        }
        .unwrap();
        bed.a.wait().status
    };
    assert_eq!(
        read(10, key, mr.addr()),
        WcStatus::Success,
        "not yet invalidated"
    );
    assert!(bed.b.cq.poll_one().unwrap().is_none(), "all three wait");
    // The receive lets the queue run: SEND, LOCAL_INV, BIND complete in order.
    let (_r, rmr) = bed.a.reg_buf(64, 0, Access::LOCAL_WRITE);
    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
    unsafe { bed.qa.post_recv(11, &[rmr.sge(0, 64).unwrap()]) }.unwrap();
    assert_eq!(bed.a.wait().wr_id, 11);
    let ids = bed.b.wait_n(3);
    assert_eq!(
        ids,
        vec![
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    assert_eq!(read(12, key2, mr2.addr()), WcStatus::Success, "the new key");
    assert_eq!(
        read(13, key, mr.addr()),
        WcStatus::RemAccessErr,
        "the invalidated key"
    );
}
