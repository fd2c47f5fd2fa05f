//! Rules: registering memory — access flags are checked before the device is asked, pinned
//! memory must be mapped (and writable for write access), a PD lives while a region holds it.

use crate::common::*;
use rdma_pool::nic::soft::SoftConfig;
use rdma_pool::nic::*;

#[test]
fn pinned_registration_needs_mapped_and_writable_memory() {
    let (_nic, pd) = soft_pd(SoftConfig::default());
    let mut m = buf(2 * 4096, 0);
    let p = m.as_mut_ptr();
    // Made read-only.
    protect(&mut m, 0, 2 * 4096, libc::PROT_READ);
    // SAFETY: the mapping outlives the attempts.
    let e = unsafe { pd.reg_mr(p, 4096, Access::LOCAL_WRITE) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EFAULT));
    // SAFETY: as above.
    unsafe { pd.reg_mr(p, 4096, Access::REMOTE_READ) }
        .expect("read-only memory registers for reads");
    unprotect(&mut m, 0, 2 * 4096);
    // Below vm.mmap_min_addr: never mapped in any process.
    let gone = 4096 as *mut u8;
    // SAFETY: the registration must fail, nothing is accessed.
    let e = unsafe { pd.reg_mr(gone, 4096, Access::empty()) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EFAULT));
}

#[test]
fn pd_with_live_objects_cannot_be_freed_early() {
    // The RAII layer keeps the PD alive while a region holds it; the device refuses otherwise.
    let (_nic, pd) = soft_pd(SoftConfig::default());
    let mut a = buf(4096, 0);
    let mr = reg_in(&pd, &mut a, Access::empty()).unwrap();
    drop(pd);
    assert_eq!(mr.pd().nic().as_soft().unwrap().counters().registrations, 1);
    drop(mr);
}

#[test]
fn access_flags_are_checked_before_the_device_is_asked() {
    // Kills: mod.rs check_mr_access, either of its two checks removed (the soft device checks
    // the same flags, so only the error's origin shows the difference).
    let (nic, pd) = soft_pd(SoftConfig::default());
    let soft = nic.as_soft().unwrap();
    let mut a = buf(4096, 0);
    soft.fail_next(Verb::RegMr, 1, libc::EAGAIN);
    for access in [
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
        Access::LOCAL_WRITE | Access::ZERO_BASED,
    ] {
        let e = reg_in(&pd, &mut a, access).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { .. }),
            "{access:?}: {e}"
        );
    }
    assert_eq!(
        soft.counters().injected_faults,
        0,
        "the device was not asked"
    );
    soft.fail_next(Verb::RegMr, 0, 0);
    let mut mr = reg_in(&pd, &mut a, Access::LOCAL_WRITE).unwrap();
    for access in [
        Access::REMOTE_WRITE,
        Access::LOCAL_WRITE | Access::ZERO_BASED,
    ] {
        let e = rereg_access(&mut mr, access).unwrap_err();
        assert_eq!(
            (e.kind, e.errno()),
            (ReregErrorKind::Input, Some(libc::EINVAL)),
            "{access:?}"
        );
        assert!(!mr.is_poisoned());
    }
    assert_eq!(soft.counters().reregs, 0);
}
