//! Rules: a key names a region of the right PD and device: lkeys of the requester's PD, rkeys of
//! the responder's, handles of the device they are used on; a zero-length RDMA checks no rkey;
//! a READ response needs LOCAL_WRITE on its destination.

use crate::common::*;
use rdma_pool::nic::*;

#[test]
fn key_must_belong_to_the_responders_pd() {
    let bed = default_bed();
    let other_pd = bed.b.nic.alloc_pd().unwrap();
    let mut dst = buf(4096, 0);
    let mr = reg_in(&other_pd, &mut dst, RW).unwrap();
    let (_src, src_mr) = bed.a.reg_buf(4096, 1, Access::LOCAL_WRITE);
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::RemAccessErr
    );
    assert!(dst.as_slice().iter().all(|&x| x == 0));
}

#[test]
fn lkey_must_belong_to_the_requesters_pd() {
    let bed = default_bed();
    let other_pd = bed.a.nic.alloc_pd().unwrap();
    let mut src = buf(4096, 1);
    let src_mr = reg_in(&other_pd, &mut src, Access::LOCAL_WRITE).unwrap();
    let (_dst, mr) = bed.b.reg_buf(4096, 0, RW);
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::LocProtErr
    );
}

#[test]
fn read_response_needs_local_write_on_the_destination() {
    let bed = default_bed();
    let (dst, dst_mr) = bed.a.reg_buf(4096, 0, Access::empty());
    let (_src, src_mr) = bed.b.reg_buf(4096, 5, RW);
    assert_eq!(
        read(&bed, &dst_mr, 64, src_mr.addr() as u64, src_mr.rkey()),
        WcStatus::LocProtErr
    );
    assert!(dst.as_slice().iter().all(|&x| x == 0));
}

#[test]
fn zero_length_rdma_does_not_check_the_rkey() {
    let bed = default_bed();
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { bed.qa.post_write(1, &[], 0, Rkey(0)) }.unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success, "C9-88");
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe { bed.qa.post_read(2, &[], 0, Rkey(0)) }.unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
}

#[test]
fn handles_of_another_device_are_refused_not_confused() {
    let bed = default_bed();
    let mut mem = buf(4096, 0);
    // A region of the *requester's* device, bound through the responder's QP.
    let foreign = bed.a.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let e = unsafe {
        bed.qb
            .bind_mw(1, &mut mw, &foreign, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let e = bed
        .b
        .pd
        .create_qp(&bed.a.cq, &bed.b.cq, QpCaps::default())
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}
