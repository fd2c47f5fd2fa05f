//! Rules: re-registration (`ibv_rereg_mr`) — the configured modes, access and PD changes, and
//! the man page's error kinds.

use crate::common::*;
use rdma_pool::nic::soft::ReregMode;
use rdma_pool::nic::*;

#[test]
fn rereg_change_keys_mode_retires_old_keys() {
    let bed = rereg_bed(ReregMode::ChangeKeys);
    let mut a = buf(4096, 0);
    let mut mr = bed.b.reg(&mut a, RW).unwrap();
    let old = mr.rkey();
    rereg_access(&mut mr, RW).unwrap();
    assert_ne!(mr.rkey(), old);
    assert_eq!(mr.rkey().index(), old.index());
    let (_src, src_mr) = bed.a.reg_buf(4096, 2, Access::LOCAL_WRITE);
    assert_eq!(
        write(&bed, &src_mr, 8, mr.addr() as u64, old),
        WcStatus::RemAccessErr
    );
}

#[test]
fn rereg_unsupported_mode_is_err_cmd_and_poisons() {
    let bed = rereg_bed(ReregMode::Unsupported);
    let mut a = buf(4096, 0);
    let mut mr = bed.b.reg(&mut a, RW).unwrap();
    let (addr, rkey) = (mr.addr() as u64, mr.rkey());
    let e = rereg_access(&mut mr, RW).unwrap_err();
    assert_eq!(
        (e.kind, e.errno()),
        (ReregErrorKind::Cmd, Some(libc::EOPNOTSUPP))
    );
    assert!(mr.is_poisoned() && mr.sge(0, 8).is_err());
    let (_src, src_mr) = bed.a.reg_buf(4096, 2, Access::LOCAL_WRITE);
    assert_eq!(
        write(&bed, &src_mr, 8, addr, rkey),
        WcStatus::RemAccessErr,
        "MR must not be used after ERR_CMD"
    );
    drop(mr); // dereg still works
    assert_eq!(bed.b.nic.as_soft().unwrap().counters().deregistrations, 1);
}

#[test]
fn rereg_change_access_takes_effect() {
    let bed = default_bed();
    let mut a = buf(4096, 0);
    let mut mr = bed
        .b
        .reg(&mut a, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let (_src, src_mr) = bed.a.reg_buf(4096, 2, Access::LOCAL_WRITE);
    rereg_access(&mut mr, RW).unwrap();
    assert_eq!(
        write(&bed, &src_mr, 8, mr.addr() as u64, mr.rkey()),
        WcStatus::Success
    );
    assert_eq!(bed.b.nic.as_soft().unwrap().counters().reregs, 1);
}

#[test]
fn rereg_change_pd_moves_the_region() {
    let bed = default_bed();
    let pd2 = bed.b.nic.alloc_pd().unwrap();
    let mut a = buf(4096, 0);
    let mut mr = bed.b.reg(&mut a, RW).unwrap();
    // SAFETY: no translation change.
    unsafe {
        mr.rereg(
            ReregFlags::CHANGE_PD,
            Some(&pd2),
            std::ptr::null_mut(),
            0,
            Access::empty(),
        )
    }
    .unwrap();
    assert_eq!(mr.pd(), &pd2);
    // The device moved the region's PD reference too.
    bed.b.nic.as_soft().unwrap().validate().unwrap();
    let (_src, src_mr) = bed.a.reg_buf(4096, 2, Access::LOCAL_WRITE);
    // The bed's responder QP is in the old PD: the key no longer matches.
    assert_eq!(
        write(&bed, &src_mr, 8, mr.addr() as u64, mr.rkey()),
        WcStatus::RemAccessErr
    );
}

#[test]
fn injected_rereg_failures_follow_the_man_page() {
    let bed = default_bed();
    let soft = bed.b.nic.as_soft().unwrap();
    let mut a = buf(4096, 0);
    let mut mr = bed.b.reg(&mut a, RW).unwrap();
    soft.fail_next_rereg(ReregErrorKind::DontForkNew, 1, libc::ENOMEM);
    let e = rereg_access(&mut mr, RW).unwrap_err();
    assert!(e.kind.old_mr_valid() && !mr.is_poisoned());
    // The device agrees: the old region still moves data.
    let mut src = buf(4096, 0x64);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    let (addr, rkey) = (mr.addr() as u64, mr.rkey());
    assert_eq!(write(&bed, &src_mr, 64, addr, rkey), WcStatus::Success);
    soft.fail_next_rereg(ReregErrorKind::CmdAndDoForkNew, 1, libc::EIO);
    let e = rereg_access(&mut mr, RW).unwrap_err();
    assert!(!e.kind.mr_usable() && mr.is_poisoned());
    // And here the device refuses it.
    assert_eq!(write(&bed, &src_mr, 64, addr, rkey), WcStatus::RemAccessErr);
}
