//! The soft NIC's rules, one test (at least) per rule, on configurations the scenario suite does
//! not cover. Each test fails if its rule is removed from `src/nic/soft/`.

mod common;

use common::*;
use rdma_pool::nic::soft::{MemlockLimit, ReregMode, SoftConfig};
use rdma_pool::nic::*;
use std::time::Duration;

fn soft_bed(cfg: SoftConfig) -> Bed {
    let (a, b) = (
        Side::new(Nic::soft_with(cfg.clone())),
        Side::new(Nic::soft_with(cfg)),
    );
    let (qa, qb) = connect(&a, &b);
    Bed { a, b, qa, qb }
}

fn default_bed() -> Bed {
    soft_bed(SoftConfig::default())
}

#[test]
fn key_must_belong_to_the_responders_pd() {
    let bed = default_bed();
    let other_pd = bed.b.nic.alloc_pd().unwrap();
    let mut dst = buf(4096, 0);
    // SAFETY: `dst` outlives the region.
    let mr = unsafe { other_pd.reg_mr(dst.as_mut_ptr(), 4096, RW) }.unwrap();
    let mut src = buf(4096, 1);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
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
    // SAFETY: `src` outlives the region.
    let src_mr = unsafe { other_pd.reg_mr(src.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }.unwrap();
    let mut dst = buf(4096, 0);
    let mr = bed.b.reg(&mut dst, RW).unwrap();
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::LocProtErr
    );
}

#[test]
fn read_response_needs_local_write_on_the_destination() {
    let bed = default_bed();
    let mut dst = buf(4096, 0);
    let dst_mr = bed.a.reg(&mut dst, Access::empty()).unwrap();
    let mut src = buf(4096, 5);
    let src_mr = bed.b.reg(&mut src, RW).unwrap();
    assert_eq!(
        read(&bed, &dst_mr, 64, src_mr.addr() as u64, src_mr.rkey()),
        WcStatus::LocProtErr
    );
    assert!(dst.as_slice().iter().all(|&x| x == 0));
}

#[test]
fn window_keys_are_not_local_keys() {
    let bed = default_bed();
    let mut mem = buf(4096, 0);
    let mr = bed.a.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.a.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = bed
        .qa
        .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    let mut dst = buf(4096, 0);
    let dst_mr = bed.b.reg(&mut dst, RW).unwrap();
    let sge = Sge {
        addr: mr.addr() as u64,
        length: 64,
        lkey: Lkey(rkey.0),
    };
    bed.qa
        .post_write(2, &[sge], dst_mr.addr() as u64, dst_mr.rkey())
        .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::LocProtErr);
}

#[test]
fn type1_window_is_usable_from_any_qp() {
    let bed = default_bed();
    let mut mem = buf(4096, 0x61);
    let mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = bed
        .qb
        .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    let (qa2, _qb2) = connect(&bed.a, &bed.b);
    let mut dst = buf(4096, 0);
    let dst_mr = bed.a.reg(&mut dst, Access::LOCAL_WRITE).unwrap();
    qa2.post_read(3, &[dst_mr.sge(0, 64).unwrap()], mr.addr() as u64, rkey)
        .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    assert!(dst.as_slice()[..64].iter().all(|&x| x == 0x61));
}

#[test]
fn writable_window_needs_local_write_on_the_region() {
    let bed = default_bed();
    let mut mem = buf(4096, 0);
    let mr = bed
        .b
        .reg(&mut mem, Access::REMOTE_READ | Access::MW_BIND)
        .unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    bed.qb
        .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_ATOMIC)
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::MwBindErr);
}

#[test]
fn type2_window_must_be_invalidated_before_rebinding() {
    let bed = default_bed();
    let mut mem = buf(4096, 0);
    let mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    let k1 = bed
        .qb
        .post_bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    bed.qb
        .post_bind_mw(2, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::MwBindErr);
    let _ = k1;
}

#[test]
fn type2_window_cannot_be_bound_to_nothing() {
    let bed = default_bed();
    let mut mem = buf(4096, 0);
    let mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    bed.qb
        .post_bind_mw(1, &mut mw, &mr, 0, 0, Access::REMOTE_READ)
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
    let rkey = bed
        .qb
        .post_bind_mw(
            1,
            &mut mw,
            &mr,
            4096,
            4096,
            Access::REMOTE_READ | Access::ZERO_BASED,
        )
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    let mut dst = buf(4096, 0);
    let dst_mr = bed.a.reg(&mut dst, Access::LOCAL_WRITE).unwrap();
    assert_eq!(read(&bed, &dst_mr, 4096, 0, rkey), WcStatus::Success);
    assert!(dst.as_slice().iter().all(|&x| x == 0x7e));
    assert_eq!(
        read(&bed, &dst_mr, 64, 4096 - 32, rkey),
        WcStatus::RemAccessErr,
        "past the window's end"
    );
}

#[test]
fn rereg_change_keys_mode_retires_old_keys() {
    let bed = soft_bed(SoftConfig {
        rereg: ReregMode::ChangeKeys,
        ..Default::default()
    });
    let mut a = buf(4096, 0);
    let mut mr = bed.b.reg(&mut a, RW).unwrap();
    let old = mr.rkey();
    // SAFETY: no translation change.
    unsafe { mr.rereg(ReregFlags::CHANGE_ACCESS, None, std::ptr::null_mut(), 0, RW) }.unwrap();
    assert_ne!(mr.rkey(), old);
    assert_eq!(mr.rkey().index(), old.index());
    let mut src = buf(4096, 2);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        write(&bed, &src_mr, 8, mr.addr() as u64, old),
        WcStatus::RemAccessErr
    );
}

#[test]
fn rereg_unsupported_mode_is_err_cmd_and_poisons() {
    let bed = soft_bed(SoftConfig {
        rereg: ReregMode::Unsupported,
        ..Default::default()
    });
    let mut a = buf(4096, 0);
    let mut mr = bed.b.reg(&mut a, RW).unwrap();
    let (addr, rkey) = (mr.addr() as u64, mr.rkey());
    // SAFETY: no translation change.
    let e = unsafe { mr.rereg(ReregFlags::CHANGE_ACCESS, None, std::ptr::null_mut(), 0, RW) }
        .unwrap_err();
    assert_eq!(
        (e.kind, e.errno()),
        (ReregErrorKind::Cmd, Some(libc::EOPNOTSUPP))
    );
    assert!(mr.is_poisoned() && mr.sge(0, 8).is_err());
    let mut src = buf(4096, 2);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
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
    let mut src = buf(4096, 2);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    // SAFETY: no translation change.
    unsafe { mr.rereg(ReregFlags::CHANGE_ACCESS, None, std::ptr::null_mut(), 0, RW) }.unwrap();
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
    let mut src = buf(4096, 2);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
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
    // SAFETY: no translation change.
    let e = unsafe { mr.rereg(ReregFlags::CHANGE_ACCESS, None, std::ptr::null_mut(), 0, RW) }
        .unwrap_err();
    assert!(e.kind.old_mr_valid() && !mr.is_poisoned());
    soft.fail_next_rereg(ReregErrorKind::CmdAndDoForkNew, 1, libc::EIO);
    // SAFETY: as above.
    let e = unsafe { mr.rereg(ReregFlags::CHANGE_ACCESS, None, std::ptr::null_mut(), 0, RW) }
        .unwrap_err();
    assert!(!e.kind.mr_usable() && mr.is_poisoned());
}

#[test]
fn odp_access_to_an_inaccessible_page_fails() {
    let bed = default_bed();
    let mut dst = buf(2 * 4096, 0);
    let mr = bed.b.reg(&mut dst, RW | Access::ON_DEMAND).unwrap();
    // SAFETY: the mapping is ours; the second page becomes inaccessible to the process.
    let rc = unsafe { libc::mprotect(dst.as_mut_ptr().add(4096).cast(), 4096, libc::PROT_NONE) };
    assert_eq!(rc, 0);
    let mut src = buf(4096, 1);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64 + 4096, mr.rkey()),
        WcStatus::RemAccessErr
    );
    let (qa, _qb) = connect(&bed.a, &bed.b);
    qa.post_write(
        1,
        &[src_mr.sge(0, 64).unwrap()],
        mr.addr() as u64,
        mr.rkey(),
    )
    .unwrap();
    assert_eq!(
        bed.a.wait().status,
        WcStatus::Success,
        "the accessible page faults in fine"
    );
    let c = bed.b.nic.as_soft().unwrap().counters();
    assert_eq!(c.page_faults, 2);
    // SAFETY: restore before the buffer is unmapped.
    unsafe {
        libc::mprotect(
            dst.as_mut_ptr().add(4096).cast(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
}

#[test]
fn odp_write_to_a_read_only_page_fails_but_reads_work() {
    let bed = default_bed();
    let mut mem = buf(4096, 0x15);
    let mr = bed.b.reg(&mut mem, RW | Access::ON_DEMAND).unwrap();
    // SAFETY: our mapping; made read-only for the process.
    unsafe { libc::mprotect(mem.as_mut_ptr().cast(), 4096, libc::PROT_READ) };
    let mut dst = buf(4096, 0);
    let dst_mr = bed.a.reg(&mut dst, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        read(&bed, &dst_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::Success
    );
    assert_eq!(
        write(&bed, &dst_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::RemAccessErr
    );
    // SAFETY: restore.
    unsafe {
        libc::mprotect(
            mem.as_mut_ptr().cast(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
}

#[test]
fn odp_fault_cost_is_paid_once_per_page_and_prefetch_avoids_it() {
    let cost = Duration::from_millis(5);
    let bed = soft_bed(SoftConfig {
        fault_cost: cost,
        ..Default::default()
    });
    let soft = bed.b.nic.as_soft().unwrap();
    let mut dst = buf(8 * 4096, 0);
    let mr = bed.b.reg(&mut dst, RW | Access::ON_DEMAND).unwrap();
    let mut src = buf(8 * 4096, 1);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    bed.b
        .pd
        .advise_mr(
            Advice::PrefetchWrite,
            AdviseFlags::FLUSH,
            &[mr.sge(0, 4 * 4096).unwrap()],
        )
        .unwrap();
    assert_eq!(soft.counters().prefetched_pages, 4);
    assert_eq!(
        write(&bed, &src_mr, 8 * 4096, mr.addr() as u64, mr.rkey()),
        WcStatus::Success
    );
    assert_eq!(
        soft.counters().page_faults,
        4,
        "only the pages not prefetched fault"
    );
    assert_eq!(
        write(&bed, &src_mr, 8 * 4096, mr.addr() as u64, mr.rkey()),
        WcStatus::Success
    );
    assert_eq!(
        soft.counters().page_faults,
        4,
        "resident pages do not fault again"
    );
}

#[test]
fn read_prefetch_leaves_pages_read_only_for_the_nic() {
    let bed = default_bed();
    let soft = bed.b.nic.as_soft().unwrap();
    let mut dst = buf(4096, 0);
    let mr = bed.b.reg(&mut dst, RW | Access::ON_DEMAND).unwrap();
    bed.b
        .pd
        .advise_mr(
            Advice::Prefetch,
            AdviseFlags::FLUSH,
            &[mr.sge(0, 4096).unwrap()],
        )
        .unwrap();
    let mut src = buf(4096, 1);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::Success
    );
    assert_eq!(
        soft.counters().page_faults,
        1,
        "a write to a read-prefetched page faults for write"
    );
}

#[test]
fn prefetch_without_flush_completes_in_the_background() {
    let bed = default_bed();
    let soft = bed.b.nic.as_soft().unwrap();
    let mut dst = buf(64 * 4096, 0);
    let mr = bed.b.reg(&mut dst, RW | Access::ON_DEMAND).unwrap();
    bed.b
        .pd
        .advise_mr(
            Advice::PrefetchWrite,
            AdviseFlags::empty(),
            &[mr.sge(0, 64 * 4096).unwrap()],
        )
        .unwrap();
    let start = std::time::Instant::now();
    while soft.resident_pages(mr.lkey()) != Some(64) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "postponed prefetch never happened"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn prefetch_no_fault_maps_only_pages_the_cpu_has() {
    let bed = default_bed();
    let soft = bed.b.nic.as_soft().unwrap();
    let mut mem = Buffer::new(8 * 4096).unwrap();
    mem.as_mut_slice()[..2 * 4096].fill(1); // touch two pages only
    let mr = bed.b.reg(&mut mem, RW | Access::ON_DEMAND).unwrap();
    bed.b
        .pd
        .advise_mr(
            Advice::PrefetchNoFault,
            AdviseFlags::FLUSH,
            &[mr.sge(0, 8 * 4096).unwrap()],
        )
        .unwrap();
    assert_eq!(soft.resident_pages(mr.lkey()), Some(2));
}

#[test]
fn odp_invalidation_makes_pages_fault_again() {
    let bed = default_bed();
    let soft = bed.b.nic.as_soft().unwrap();
    let mut mem = buf(4 * 4096, 0);
    let mr = bed.b.reg(&mut mem, RW | Access::ON_DEMAND).unwrap();
    bed.b
        .pd
        .advise_mr(
            Advice::PrefetchWrite,
            AdviseFlags::FLUSH,
            &[mr.sge(0, 4 * 4096).unwrap()],
        )
        .unwrap();
    soft.invalidate_odp_range(mr.addr(), 4096);
    assert_eq!(soft.resident_pages(mr.lkey()), Some(3));
    assert!(!soft.is_resident(mr.lkey(), mr.addr()));
}

#[test]
fn advise_mr_error_codes_follow_the_man_page() {
    let bed = default_bed();
    let pd = &bed.b.pd;
    let mut a = buf(4 * 4096, 0);
    let ro = bed
        .b
        .reg(&mut a, Access::ON_DEMAND | Access::REMOTE_READ)
        .unwrap();
    let errno = |sges: &[Sge], advice| {
        pd.advise_mr(advice, AdviseFlags::FLUSH, sges)
            .unwrap_err()
            .errno()
    };
    // PREFETCH_WRITE on a region without write access: EPERM.
    assert_eq!(
        errno(&[ro.sge(0, 4096).unwrap()], Advice::PrefetchWrite),
        Some(libc::EPERM)
    );
    // A valid lkey of another PD: EPERM.
    let pd2 = bed.b.nic.alloc_pd().unwrap();
    let mut b = buf(4096, 0);
    // SAFETY: `b` outlives the region.
    let other = unsafe {
        pd2.reg_mr(
            b.as_mut_ptr(),
            4096,
            Access::LOCAL_WRITE | Access::ON_DEMAND,
        )
    }
    .unwrap();
    assert_eq!(
        errno(&[other.sge(0, 4096).unwrap()], Advice::Prefetch),
        Some(libc::EPERM)
    );
    // An lkey naming nothing: EFAULT.
    let none = Sge {
        addr: ro.addr() as u64,
        length: 64,
        lkey: Lkey(0x00ff_ff00),
    };
    assert_eq!(errno(&[none], Advice::Prefetch), Some(libc::EFAULT));
    // A stale lkey (not consistent with the MR's): ENOENT.
    let stale = Sge {
        lkey: Lkey(ro.lkey().0 ^ 1),
        ..ro.sge(0, 64).unwrap()
    };
    assert_eq!(errno(&[stale], Advice::Prefetch), Some(libc::ENOENT));
    // A window's key: EINVAL.
    let mw = pd.alloc_mw(MwType::Type1).unwrap();
    let mwsge = Sge {
        addr: ro.addr() as u64,
        length: 64,
        lkey: Lkey(mw.rkey().0),
    };
    assert_eq!(errno(&[mwsge], Advice::Prefetch), Some(libc::EINVAL));
    // Nothing was prefetched by the failed calls (all entries are checked first).
    assert_eq!(bed.b.nic.as_soft().unwrap().counters().prefetched_pages, 0);
    // Range outside the process address space (inside the MR): EFAULT.
    let mut c = buf(2 * 4096, 0);
    let odp = bed
        .b
        .reg(&mut c, Access::LOCAL_WRITE | Access::ON_DEMAND)
        .unwrap();
    // SAFETY: our mapping; its second page becomes inaccessible.
    unsafe { libc::mprotect(c.as_mut_ptr().add(4096).cast(), 4096, libc::PROT_NONE) };
    assert_eq!(
        errno(&[odp.sge(0, 2 * 4096).unwrap()], Advice::Prefetch),
        Some(libc::EFAULT)
    );
    // SAFETY: restore.
    unsafe {
        libc::mprotect(
            c.as_mut_ptr().add(4096).cast(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    // An empty list: EINVAL.
    assert_eq!(
        pd.advise_mr(Advice::Prefetch, AdviseFlags::FLUSH, &[])
            .unwrap_err()
            .errno(),
        Some(libc::EINVAL)
    );
}

#[test]
fn advise_mr_unsupported_device_says_so() {
    let nic = Nic::soft_with(SoftConfig {
        advise_mr: false,
        ..Default::default()
    });
    let pd = nic.alloc_pd().unwrap();
    let mut a = buf(4096, 0);
    // SAFETY: `a` outlives the region.
    let mr = unsafe {
        pd.reg_mr(
            a.as_mut_ptr(),
            4096,
            Access::LOCAL_WRITE | Access::ON_DEMAND,
        )
    }
    .unwrap();
    assert!(
        pd.advise_mr(
            Advice::Prefetch,
            AdviseFlags::FLUSH,
            &[mr.sge(0, 64).unwrap()]
        )
        .unwrap_err()
        .is_unsupported()
    );
}

#[test]
fn odp_needs_device_support() {
    let nic = Nic::soft_with(SoftConfig {
        odp: false,
        ..Default::default()
    });
    let pd = nic.alloc_pd().unwrap();
    let mut a = buf(4096, 0);
    // SAFETY: `a` outlives the region.
    let e = unsafe {
        pd.reg_mr(
            a.as_mut_ptr(),
            4096,
            Access::LOCAL_WRITE | Access::ON_DEMAND,
        )
    }
    .unwrap_err();
    assert!(e.is_unsupported());
}

#[test]
fn pinned_registration_needs_mapped_and_writable_memory() {
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let mut m = buf(2 * 4096, 0);
    let p = m.as_mut_ptr();
    // SAFETY: our mapping; made read-only.
    unsafe { libc::mprotect(p.cast(), 2 * 4096, libc::PROT_READ) };
    // SAFETY: the mapping outlives the attempts.
    let e = unsafe { pd.reg_mr(p, 4096, Access::LOCAL_WRITE) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EFAULT));
    // SAFETY: as above.
    unsafe { pd.reg_mr(p, 4096, Access::REMOTE_READ) }
        .expect("read-only memory registers for reads");
    // SAFETY: restore.
    unsafe { libc::mprotect(p.cast(), 2 * 4096, libc::PROT_READ | libc::PROT_WRITE) };
    // Below vm.mmap_min_addr: never mapped in any process.
    let gone = 4096 as *mut u8;
    // SAFETY: the registration must fail, nothing is accessed.
    let e = unsafe { pd.reg_mr(gone, 4096, Access::empty()) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EFAULT));
}

#[test]
fn memlock_budget_limits_pinned_bytes() {
    let nic = Nic::soft_with(SoftConfig {
        memlock: MemlockLimit::Bytes(16 * 4096),
        ..Default::default()
    });
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let mut a = buf(12 * 4096, 0);
    let mut b = buf(8 * 4096, 0);
    // SAFETY: the buffers outlive the regions.
    let mr = unsafe { pd.reg_mr(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE) }.unwrap();
    assert_eq!(soft.pinned_bytes(), 12 * 4096);
    // SAFETY: as above.
    let e = unsafe { pd.reg_mr(b.as_mut_ptr(), b.len(), Access::LOCAL_WRITE) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOMEM));
    // SAFETY: as above.
    let _odp = unsafe {
        pd.reg_mr(
            b.as_mut_ptr(),
            b.len(),
            Access::LOCAL_WRITE | Access::ON_DEMAND,
        )
    }
    .unwrap();
    drop(mr);
    assert_eq!(soft.pinned_bytes(), 0);
    // SAFETY: as above.
    unsafe { pd.reg_mr(b.as_mut_ptr(), b.len(), Access::LOCAL_WRITE) }
        .expect("budget freed by dereg");
}

#[test]
fn max_mr_and_max_mw_are_enforced() {
    let nic = Nic::soft_with(SoftConfig {
        max_mr: 2,
        max_mw: 1,
        ..Default::default()
    });
    let pd = nic.alloc_pd().unwrap();
    let mut a = buf(4096, 0);
    // SAFETY: `a` outlives the regions.
    let r: Vec<_> = (0..3)
        .map(|_| unsafe { pd.reg_mr(a.as_mut_ptr(), 4096, Access::empty()) })
        .collect();
    assert!(r[0].is_ok() && r[1].is_ok());
    assert!(matches!(
        r[2],
        Err(Error::Limit {
            limit: "max_mr",
            ..
        })
    ));
    let _w = pd.alloc_mw(MwType::Type1).unwrap();
    assert!(matches!(
        pd.alloc_mw(MwType::Type2),
        Err(Error::Limit {
            limit: "max_mw",
            ..
        })
    ));
}

#[test]
fn max_mr_size_and_max_sge_are_enforced() {
    let nic = Nic::soft_with(SoftConfig {
        max_mr_size: 8192,
        max_sge: 2,
        ..Default::default()
    });
    let pd = nic.alloc_pd().unwrap();
    let mut a = buf(4 * 4096, 0);
    // SAFETY: `a` outlives the region.
    let e = unsafe { pd.reg_mr(a.as_mut_ptr(), a.len(), Access::empty()) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                limit: "max_mr_size",
                ..
            }
        ),
        "{e}"
    );
    let cq = nic.create_cq(4).unwrap();
    let e = pd
        .create_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_sge: 3,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                limit: "max_sge",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn fault_injection_fails_exactly_n_calls() {
    let nic = Nic::soft();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let mut a = buf(4096, 0);
    soft.fail_next(Verb::RegMr, 2, libc::EAGAIN);
    for _ in 0..2 {
        // SAFETY: `a` outlives the region.
        let e = unsafe { pd.reg_mr(a.as_mut_ptr(), 4096, Access::empty()) }.unwrap_err();
        assert_eq!(e.errno(), Some(libc::EAGAIN));
    }
    // SAFETY: as above.
    unsafe { pd.reg_mr(a.as_mut_ptr(), 4096, Access::empty()) }.unwrap();
    soft.fail_next(Verb::AllocMw, 1, libc::EOPNOTSUPP);
    assert!(pd.alloc_mw(MwType::Type1).unwrap_err().is_unsupported());
    assert_eq!(soft.counters().injected_faults, 3);
}

#[test]
fn umem_page_size_bitmap_must_fit_the_buffer() {
    let nic = Nic::soft();
    let mut a = buf(1 << 16, 0);
    // SAFETY (all calls): `a` outlives the UMEMs.
    let e =
        unsafe { nic.umem_reg(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE, 1 << 11) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "below the base page");
    let e =
        unsafe { nic.umem_reg(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE, 1 << 21) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "2 MiB pages on 4 KiB memory");
    let u = unsafe {
        nic.umem_reg(
            a.as_mut_ptr(),
            a.len(),
            Access::LOCAL_WRITE,
            (1 << 12) | (1 << 21),
        )
    }
    .unwrap();
    let v = unsafe { nic.umem_reg(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE, 1 << 12) }.unwrap();
    assert_ne!(u.id(), v.id());
    if let Ok(mut h) = Buffer::huge(2 << 21) {
        let p = h.as_mut_ptr();
        unsafe { nic.umem_reg(p, h.len(), Access::LOCAL_WRITE, 1 << 21) }
            .expect("2 MiB pages fit aligned hugetlb memory");
        let e = unsafe { nic.umem_reg(p.add(4096), 1 << 21, Access::LOCAL_WRITE, 1 << 21) }
            .unwrap_err();
        assert_eq!(
            e.errno(),
            Some(libc::EINVAL),
            "2 MiB pages need a 2 MiB-aligned start"
        );
        unsafe {
            nic.umem_reg(
                p.add(4096),
                1 << 21,
                Access::LOCAL_WRITE,
                (1 << 12) | (1 << 21),
            )
        }
        .expect("4 KiB pages fit any start");
    } else {
        eprintln!("no huge pages reserved: the hugetlb part of the UMEM test is skipped");
    }

    let off = Nic::soft_with(SoftConfig {
        devx: false,
        ..Default::default()
    });
    assert!(
        unsafe { off.umem_reg(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE, 1 << 12) }
            .unwrap_err()
            .is_unsupported()
    );
}

#[test]
fn receives_are_flushed_when_the_qp_fails() {
    let bed = default_bed();
    let mut r = buf(4096, 0);
    let rmr = bed.b.reg(&mut r, Access::LOCAL_WRITE).unwrap();
    bed.qb.post_recv(1, &[rmr.sge(0, 4096).unwrap()]).unwrap();
    // Fail the responder QP with a bad bind.
    let mut mem = buf(4096, 0);
    let mr = bed.b.reg(&mut mem, RW).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    bed.qb
        .bind_mw(2, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    let mut got: Vec<_> = (0..2)
        .map(|_| bed.b.wait())
        .map(|c| (c.wr_id, c.status))
        .collect();
    got.sort_by_key(|c| c.0);
    assert_eq!(
        got,
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::MwBindErr)]
    );
}

#[test]
fn small_receive_is_a_length_error() {
    let bed = default_bed();
    let mut r = buf(4096, 0);
    let rmr = bed.b.reg(&mut r, Access::LOCAL_WRITE).unwrap();
    bed.qb.post_recv(1, &[rmr.sge(0, 4).unwrap()]).unwrap();
    let mut s = buf(4096, 1);
    let smr = bed.a.reg(&mut s, Access::LOCAL_WRITE).unwrap();
    bed.qa.post_send(2, &[smr.sge(0, 64).unwrap()]).unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::LocLenErr);
    assert_ne!(bed.a.wait().status, WcStatus::Success);
}

#[test]
fn send_waits_for_a_receive() {
    let bed = default_bed();
    let mut s = buf(4096, 9);
    let smr = bed.a.reg(&mut s, Access::LOCAL_WRITE).unwrap();
    bed.qa.post_send(2, &[smr.sge(0, 16).unwrap()]).unwrap();
    assert!(
        bed.a.cq.poll_one().unwrap().is_none(),
        "no receive yet: the send is not complete"
    );
    let mut r = buf(4096, 0);
    let rmr = bed.b.reg(&mut r, Access::LOCAL_WRITE).unwrap();
    bed.qb.post_recv(1, &[rmr.sge(0, 4096).unwrap()]).unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    assert_eq!(bed.b.wait().byte_len, 16);
    assert!(r.as_slice()[..16].iter().all(|&x| x == 9));
}

#[test]
fn posting_before_connect_is_refused() {
    let nic = Nic::soft();
    let side = Side::new(nic);
    let qp = side.qp();
    let mut s = buf(4096, 9);
    let smr = side.reg(&mut s, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        qp.post_send(1, &[smr.sge(0, 8).unwrap()])
            .unwrap_err()
            .errno(),
        Some(libc::EINVAL)
    );
}

#[test]
fn pd_with_live_objects_cannot_be_freed_early() {
    // The RAII layer keeps the PD alive while a region holds it; the device refuses otherwise.
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let mut a = buf(4096, 0);
    // SAFETY: `a` outlives the region.
    let mr = unsafe { pd.reg_mr(a.as_mut_ptr(), 4096, Access::empty()) }.unwrap();
    drop(pd);
    assert_eq!(mr.pd().nic().as_soft().unwrap().counters().registrations, 1);
    drop(mr);
}

#[test]
fn concurrent_writers_on_many_qps() {
    let (na, nb) = (Nic::soft(), Nic::soft());
    let (a, b) = (Side::new(na), Side::new(nb));
    let mut dst = buf(8 * 4096, 0);
    let dst_mr = b.reg(&mut dst, RW).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let (a, b, dst_mr) = (&a, &b, &dst_mr);
            s.spawn(move || {
                let cq = a.nic.create_cq(64).unwrap();
                let qa = a.pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
                let qb = b.qp();
                qa.connect(&qb.endpoint().unwrap()).unwrap();
                qb.connect(&qa.endpoint().unwrap()).unwrap();
                let mut src = buf(4096, t + 1);
                let src_mr = a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
                for _ in 0..50 {
                    qa.post_write(
                        t as u64,
                        &[src_mr.sge(0, 4096).unwrap()],
                        dst_mr.addr() as u64 + t as u64 * 4096,
                        dst_mr.rkey(),
                    )
                    .unwrap();
                    assert_eq!(cq.wait_one(WAIT).unwrap().status, WcStatus::Success);
                }
            });
        }
    });
    for t in 0..8 {
        assert!(
            dst.as_slice()[t * 4096..(t + 1) * 4096]
                .iter()
                .all(|&x| x == t as u8 + 1)
        );
    }
    assert_eq!(b.nic.as_soft().unwrap().counters().rejected_accesses, 0);
}

#[test]
fn soft_nic_is_send_and_sync_and_keeps_its_invariants() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Nic>();
    assert_send_sync::<rdma_pool::nic::soft::SoftNic>();
    let bed = default_bed();
    let mut mem = buf(4096, 0);
    let mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut w1 = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    let mut w2 = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    bed.qb
        .bind_mw(1, &mut w1, &mr, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    let k2 = bed
        .qb
        .post_bind_mw(2, &mut w2, &mr, 0, 64, Access::REMOTE_READ)
        .unwrap();
    let soft = bed.b.nic.as_soft().unwrap();
    soft.validate().unwrap();
    bed.qb.post_local_inv(3, k2).unwrap();
    bed.qb
        .bind_mw(4, &mut w1, &mr, 0, 0, Access::empty())
        .unwrap();
    for _ in 0..4 {
        assert_eq!(bed.b.wait().status, WcStatus::Success);
    }
    soft.validate().unwrap();
    drop((w1, w2));
    mr.dereg().unwrap();
    soft.validate().unwrap();
}

#[test]
fn rejected_accesses_are_counted() {
    let bed = default_bed();
    let mut dst = buf(4096, 0);
    let mr = bed
        .b
        .reg(&mut dst, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let mut src = buf(4096, 1);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        write(&bed, &src_mr, 8, mr.addr() as u64, mr.rkey()),
        WcStatus::RemAccessErr
    );
    assert_eq!(bed.b.nic.as_soft().unwrap().counters().rejected_accesses, 1);
}

// ---- Added by mutation testing: rules no earlier test caught when removed. ----

/// A QP pair from `a` into a responder QP in `pd` (another PD of `b`'s device).
fn connect_into_pd(a: &Side, b: &Side, pd: &Pd) -> (Qp, Qp) {
    let qa = a.qp();
    let qb = pd
        .create_qp(
            &b.cq,
            &b.cq,
            QpCaps {
                max_send_sge: 4,
                max_recv_sge: 4,
                ..Default::default()
            },
        )
        .unwrap();
    qa.connect(&qb.endpoint().unwrap()).unwrap();
    qb.connect(&qa.endpoint().unwrap()).unwrap();
    (qa, qb)
}

#[test]
fn window_key_must_belong_to_the_responders_pd() {
    // Kills: keys.rs, window branch of check_and_access, `mw.pd != who.pd` check removed.
    let bed = default_bed();
    let mut mem = buf(4096, 0x5c);
    let mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = bed
        .qb
        .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    // A responder QP in another PD of the same device must not honour the window.
    let pd2 = bed.b.nic.alloc_pd().unwrap();
    let (qa2, _qb2) = connect_into_pd(&bed.a, &bed.b, &pd2);
    let mut dst = buf(4096, 0);
    let dst_mr = bed.a.reg(&mut dst, Access::LOCAL_WRITE).unwrap();
    qa2.post_read(2, &[dst_mr.sge(0, 64).unwrap()], mr.addr() as u64, rkey)
        .unwrap();
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
    // SAFETY: `mem` outlives the region.
    let mr2 = unsafe { pd2.reg_mr(mem.as_mut_ptr(), 4096, RW | Access::MW_BIND) }.unwrap();
    // A type 2 window and its region in pd2, bound through a QP of the bed's PD: the post is
    // accepted, the bind fails when it executes.
    let mut mw2 = pd2.alloc_mw(MwType::Type2).unwrap();
    bed.qb
        .post_bind_mw(1, &mut mw2, &mr2, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(
        bed.b.wait().status,
        WcStatus::MwBindErr,
        "window of another PD"
    );
    // A type 1 window of pd2 unbound through a QP of the bed's PD.
    let (_qa, qb) = connect(&bed.a, &bed.b);
    let mut mw1 = pd2.alloc_mw(MwType::Type1).unwrap();
    qb.bind_mw(2, &mut mw1, &mr2, 0, 0, Access::empty())
        .unwrap();
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
    let mut mem = buf(4096, 0x48);
    let mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    let rkey = bed
        .qb
        .post_bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    // SEND_WITH_INV arriving on another QP of the same PD.
    let (qa2, qb2) = connect(&bed.a, &bed.b);
    let mut rbuf = buf(4096, 0);
    let rmr = bed.b.reg(&mut rbuf, Access::LOCAL_WRITE).unwrap();
    qb2.post_recv(2, &[rmr.sge(0, 4096).unwrap()]).unwrap();
    let mut sbuf = buf(4096, 1);
    let smr = bed.a.reg(&mut sbuf, Access::LOCAL_WRITE).unwrap();
    qa2.post_send_with_inv(3, &[smr.sge(0, 8).unwrap()], rkey)
        .unwrap();
    assert_ne!(bed.a.wait().status, WcStatus::Success);
    let wc = bed.b.wait();
    assert_eq!((wc.wr_id, wc.invalidated_rkey), (2, None));
    assert_ne!(wc.status, WcStatus::Success);
    // The window still works through the QP it is bound to.
    let mut dst = buf(4096, 0);
    let dst_mr = bed.a.reg(&mut dst, Access::LOCAL_WRITE).unwrap();
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
    let mut mem = buf(3 * 4096, 0x31);
    let mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = bed
        .qb
        .bind_mw(1, &mut mw, &mr, 4096, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    let mut dst = buf(4096, 0);
    let dst_mr = bed.a.reg(&mut dst, Access::LOCAL_WRITE).unwrap();
    // Inside the region, before the window.
    assert_eq!(
        read(&bed, &dst_mr, 64, mr.addr() as u64, rkey),
        WcStatus::RemAccessErr
    );
    assert!(dst.as_slice().iter().all(|&x| x == 0));
}

#[test]
fn failed_odp_fault_maps_nothing() {
    // Kills: keys.rs access_mr, the process-protection check of the fault removed (the DMA copy
    // still fails, but the page is left mapped for the NIC).
    let bed = default_bed();
    let soft = bed.b.nic.as_soft().unwrap();
    let mut dst = buf(4096, 0);
    let mr = bed.b.reg(&mut dst, RW | Access::ON_DEMAND).unwrap();
    let mut src = buf(4096, 1);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    // SAFETY: our mapping; made read-only for the process.
    unsafe { libc::mprotect(dst.as_mut_ptr().cast(), 4096, libc::PROT_READ) };
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::RemAccessErr
    );
    assert_eq!(
        soft.resident_pages(mr.lkey()),
        Some(0),
        "a failed fault maps nothing"
    );
    // SAFETY: restore.
    unsafe {
        libc::mprotect(
            dst.as_mut_ptr().cast(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    let (qa, _qb) = connect(&bed.a, &bed.b);
    qa.post_write(
        2,
        &[src_mr.sge(0, 64).unwrap()],
        mr.addr() as u64,
        mr.rkey(),
    )
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    assert_eq!(soft.counters().page_faults, 2, "the page faults again");
    assert!(dst.as_slice()[..64].iter().all(|&x| x == 1));
}

#[test]
fn advise_without_flush_still_checks_its_entries() {
    // Kills: mod.rs advise_mr, the `mr.odp.is_none() || !mr.usable` EINVAL check removed (the
    // postponed prefetch would drop the error).
    let bed = default_bed();
    let mut b = buf(4096, 0);
    let pinned = bed.b.reg(&mut b, Access::LOCAL_WRITE).unwrap();
    for flags in [AdviseFlags::empty(), AdviseFlags::FLUSH] {
        let e = bed
            .b
            .pd
            .advise_mr(Advice::Prefetch, flags, &[pinned.sge(0, 4096).unwrap()])
            .unwrap_err();
        assert_eq!(e.errno(), Some(libc::EINVAL), "{flags:?}: {e}");
    }
}

#[test]
fn advise_without_flush_is_best_effort() {
    // Kills: mod.rs advise_mr, prefetch always synchronous (FLUSH ignored).
    // ibv_advise_mr(3): only FLUSH makes the prefetch synchronous; errors of a postponed
    // prefetch are not reported.
    let bed = default_bed();
    let mut c = buf(2 * 4096, 0);
    let odp = bed
        .b
        .reg(&mut c, Access::LOCAL_WRITE | Access::ON_DEMAND)
        .unwrap();
    // SAFETY: our mapping; its second page becomes inaccessible.
    unsafe { libc::mprotect(c.as_mut_ptr().add(4096).cast(), 4096, libc::PROT_NONE) };
    let sge = [odp.sge(0, 2 * 4096).unwrap()];
    let postponed = bed
        .b
        .pd
        .advise_mr(Advice::Prefetch, AdviseFlags::empty(), &sge);
    let flushed = bed
        .b
        .pd
        .advise_mr(Advice::Prefetch, AdviseFlags::FLUSH, &sge);
    // SAFETY: restore.
    unsafe {
        libc::mprotect(
            c.as_mut_ptr().add(4096).cast(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    postponed.expect("a postponed prefetch does not report page errors");
    assert_eq!(flushed.unwrap_err().errno(), Some(libc::EFAULT));
}

#[test]
fn max_mw_is_enforced_while_key_slots_are_free() {
    // Kills: mod.rs alloc_mw, the `max_mw` count check removed (the existing limits test is
    // saved by the full key table).
    let nic = Nic::soft_with(SoftConfig {
        max_mr: 8,
        max_mw: 1,
        ..Default::default()
    });
    let pd = nic.alloc_pd().unwrap();
    let _w = pd.alloc_mw(MwType::Type1).unwrap();
    assert_eq!(
        pd.alloc_mw(MwType::Type2).unwrap_err().errno(),
        Some(libc::ENOMEM)
    );
}

#[test]
fn access_flags_are_checked_before_the_device_is_asked() {
    // Kills: mod.rs check_mr_access, either of its two checks removed (the soft device checks
    // the same flags, so only the error's origin shows the difference).
    let nic = Nic::soft();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let mut a = buf(4096, 0);
    soft.fail_next(Verb::RegMr, 1, libc::EAGAIN);
    for access in [
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
        Access::LOCAL_WRITE | Access::ZERO_BASED,
    ] {
        // SAFETY: `a` outlives any region.
        let e = unsafe { pd.reg_mr(a.as_mut_ptr(), 4096, access) }.unwrap_err();
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
    // SAFETY: as above.
    let mut mr = unsafe { pd.reg_mr(a.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }.unwrap();
    for access in [
        Access::REMOTE_WRITE,
        Access::LOCAL_WRITE | Access::ZERO_BASED,
    ] {
        // SAFETY: no translation change.
        let e = unsafe {
            mr.rereg(
                ReregFlags::CHANGE_ACCESS,
                None,
                std::ptr::null_mut(),
                0,
                access,
            )
        }
        .unwrap_err();
        assert_eq!(
            (e.kind, e.errno()),
            (ReregErrorKind::Input, Some(libc::EINVAL)),
            "{access:?}"
        );
        assert!(!mr.is_poisoned());
    }
    assert_eq!(soft.counters().reregs, 0);
}

// ---- Added after review: cross-device handles, RC ordering, responder state, limits. ----

#[test]
fn handles_of_another_device_are_refused_not_confused() {
    let bed = default_bed();
    let mut mem = buf(4096, 0);
    // A region of the *requester's* device, bound through the responder's QP.
    let foreign = bed.a.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    let e = bed
        .qb
        .bind_mw(1, &mut mw, &foreign, 0, 4096, Access::REMOTE_READ)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let e = bed
        .b
        .pd
        .create_qp(&bed.a.cq, &bed.b.cq, QpCaps::default())
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

#[test]
fn a_poisoned_region_cannot_be_bound() {
    let bed = soft_bed(SoftConfig {
        rereg: ReregMode::Unsupported,
        ..Default::default()
    });
    let mut mem = buf(4096, 0);
    let mut mr = bed.b.reg(&mut mem, RW | Access::MW_BIND).unwrap();
    // SAFETY: no translation change.
    unsafe { mr.rereg(ReregFlags::CHANGE_ACCESS, None, std::ptr::null_mut(), 0, RW) }.unwrap_err();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    let e = bed
        .qb
        .bind_mw(1, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
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
    bed.qb
        .bind_mw(1, &mut mw, &mr_a, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert!(mw.settle(bed.b.wait().status));
    bed.qb
        .bind_mw(2, &mut mw, &mr_b, 0, 4096, Access::REMOTE_READ)
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
    bed.qb
        .post_bind_mw(3, &mut mw2, &mr_c, 0, 64, Access::REMOTE_READ)
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
fn messages_beyond_2gib_are_length_errors_without_allocating() {
    let bed = default_bed();
    let mut src = buf(4096, 0);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    let mut dst = buf(4096, 0);
    let dst_mr = bed.b.reg(&mut dst, RW).unwrap();
    let huge = Sge {
        addr: src_mr.addr() as u64,
        length: u32::MAX,
        lkey: src_mr.lkey(),
    };
    bed.qa
        .post_write(1, &[huge], dst_mr.addr() as u64, dst_mr.rkey())
        .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::LocLenErr);
}

#[test]
fn a_bogus_huge_sge_is_a_protection_error_before_any_buffer_is_made() {
    let bed = default_bed();
    let mut dst = buf(4096, 0);
    let dst_mr = bed.b.reg(&mut dst, RW).unwrap();
    let bogus = Sge {
        addr: 0x1000,
        length: 1 << 30,
        lkey: Lkey(0),
    };
    bed.qa
        .post_write(1, &[bogus], dst_mr.addr() as u64, dst_mr.rkey())
        .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::LocProtErr);
}

#[test]
fn zero_length_rdma_does_not_check_the_rkey() {
    let bed = default_bed();
    bed.qa.post_write(1, &[], 0, Rkey(0)).unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success, "C9-88");
    bed.qa.post_read(2, &[], 0, Rkey(0)).unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
}

#[test]
fn a_responder_that_is_not_ready_drops_requests() {
    let (a, b) = (Side::new(Nic::soft()), Side::new(Nic::soft()));
    let (qa, qb) = (a.qp(), b.qp());
    qa.connect(&qb.endpoint().unwrap()).unwrap(); // the responder side never connects
    let mut src = buf(4096, 1);
    let src_mr = a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    let mut dst = buf(4096, 0);
    let dst_mr = b.reg(&mut dst, RW).unwrap();
    qa.post_write(
        1,
        &[src_mr.sge(0, 64).unwrap()],
        dst_mr.addr() as u64,
        dst_mr.rkey(),
    )
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
    bed.qa.post_write(1, &[], 0, Rkey(0)).unwrap();
    bed.a.wait();
    let mut src = buf(4096, 1);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    bed.qa
        .post_write(2, &[src_mr.sge(0, 8).unwrap()], 0, Rkey(0))
        .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::RemAccessErr);
    let e = bed.qa.connect(&bed.qb.endpoint().unwrap()).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL));
    assert_eq!(bed.qa.state().unwrap(), QpState::Error);
}

#[test]
fn requests_behind_a_waiting_send_keep_rc_order() {
    let bed = default_bed();
    let mut s = buf(4096, 7);
    let smr = bed.a.reg(&mut s, Access::LOCAL_WRITE).unwrap();
    let mut d = buf(4096, 0);
    let dmr = bed.b.reg(&mut d, RW).unwrap();
    bed.qa.post_send(1, &[smr.sge(0, 16).unwrap()]).unwrap();
    bed.qa
        .post_write(
            2,
            &[smr.sge(0, 64).unwrap()],
            dmr.addr() as u64 + 1024,
            dmr.rkey(),
        )
        .unwrap();
    assert!(
        bed.a.cq.poll_one().unwrap().is_none(),
        "both wait for the receive"
    );
    assert!(
        d.as_slice()[1024..1088].iter().all(|&x| x == 0),
        "the WRITE waits behind the SEND"
    );
    bed.qb.post_recv(9, &[dmr.sge(0, 1024).unwrap()]).unwrap();
    let ids: Vec<_> = (0..2)
        .map(|_| bed.a.wait())
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(ids, vec![(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert!(d.as_slice()[1024..1088].iter().all(|&x| x == 7));
}

#[test]
fn a_failing_responder_fails_the_sends_waiting_there() {
    let bed = default_bed();
    let mut s = buf(4096, 7);
    let smr = bed.a.reg(&mut s, Access::LOCAL_WRITE).unwrap();
    bed.qa.post_send(1, &[smr.sge(0, 16).unwrap()]).unwrap();
    bed.qa.post_send(2, &[smr.sge(0, 16).unwrap()]).unwrap();
    // Put the responder in the error state with a bind that must fail.
    let mut mem = buf(4096, 0);
    let mr = bed.b.reg(&mut mem, RW).unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    bed.qb
        .bind_mw(3, &mut mw, &mr, 0, 4096, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::MwBindErr);
    let got: Vec<_> = (0..2)
        .map(|_| bed.a.wait())
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        got,
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(bed.qa.state().unwrap(), QpState::Error);
}

#[test]
fn a_destroyed_requester_never_delivers_its_waiting_sends() {
    let bed = default_bed();
    let mut s = buf(4096, 7);
    let smr = bed.a.reg(&mut s, Access::LOCAL_WRITE).unwrap();
    let (qa2, qb2) = connect(&bed.a, &bed.b);
    qa2.post_send(1, &[smr.sge(0, 16).unwrap()]).unwrap();
    drop(qa2);
    let mut r = buf(4096, 0);
    let rmr = bed.b.reg(&mut r, Access::LOCAL_WRITE).unwrap();
    qb2.post_recv(5, &[rmr.sge(0, 4096).unwrap()]).unwrap();
    assert!(
        bed.b.cq.poll_one().unwrap().is_none(),
        "the receive stays posted"
    );
    assert!(r.as_slice().iter().all(|&x| x == 0));
}

#[test]
fn the_send_queue_depth_is_enforced_behind_a_waiting_send() {
    let (a, b) = (Side::new(Nic::soft()), Side::new(Nic::soft()));
    let caps = QpCaps {
        max_send_wr: 2,
        ..Default::default()
    };
    let qa = a.pd.create_qp(&a.cq, &a.cq, caps).unwrap();
    let qb = b.qp();
    qa.connect(&qb.endpoint().unwrap()).unwrap();
    qb.connect(&qa.endpoint().unwrap()).unwrap();
    let mut s = buf(4096, 7);
    let smr = a.reg(&mut s, Access::LOCAL_WRITE).unwrap();
    qa.post_send(1, &[smr.sge(0, 8).unwrap()]).unwrap();
    qa.post_send(2, &[smr.sge(0, 8).unwrap()]).unwrap();
    let e = qa.post_send(3, &[smr.sge(0, 8).unwrap()]).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOMEM));
}

#[test]
fn invalidating_any_range_never_panics() {
    let nic = Nic::soft();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let mut b = buf(4096, 0);
    let _mr = unsafe {
        pd.reg_mr(
            b.as_mut_ptr(),
            4096,
            Access::LOCAL_WRITE | Access::ON_DEMAND,
        )
    }
    .unwrap();
    soft.invalidate_odp_range(usize::MAX, 2);
    soft.invalidate_odp_range(0, usize::MAX);
    assert!(Buffer::huge(usize::MAX).is_err());
}

#[test]
fn windows_grant_remote_rights_their_region_does_not_have() {
    // IB C10-73/74: binding needs MW_BIND, writable windows need LOCAL_WRITE on the region; the
    // region itself needs no remote rights: that is how one buffer is granted, and only it.
    let bed = default_bed();
    let mut mem = buf(2 * 4096, 0);
    let mr = bed
        .b
        .reg(&mut mem, Access::LOCAL_WRITE | Access::MW_BIND)
        .unwrap();
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = bed
        .qb
        .bind_mw(1, &mut mw, &mr, 4096, 4096, Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    let mut src = buf(4096, 3);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64 + 4096, rkey),
        WcStatus::Success
    );
    assert!(mem.as_slice()[4096..4160].iter().all(|&x| x == 3));
    let (qa2, _qb2) = connect(&bed.a, &bed.b);
    qa2.post_write(
        2,
        &[src_mr.sge(0, 64).unwrap()],
        mr.addr() as u64,
        mr.rkey(),
    )
    .unwrap();
    assert_eq!(
        bed.a.wait().status,
        WcStatus::RemAccessErr,
        "the region's own rkey grants nothing"
    );
}

#[test]
fn sends_both_ways_from_many_threads_neither_deadlock_nor_reorder() {
    // Two QPs sending to each other while both post receives from other threads: every lock
    // path of the send engine and the receive side at once. A watchdog turns a deadlock into a
    // failure instead of a hang.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        const N: u64 = 300;
        let side = |nic: Nic| {
            let pd = nic.alloc_pd().unwrap();
            let cq = nic.create_cq(4 * N as u32).unwrap();
            Side { nic, pd, cq }
        };
        let (a, b) = (side(Nic::soft()), side(Nic::soft()));
        let caps = QpCaps {
            max_send_wr: 2 * N as u32,
            max_recv_wr: 2 * N as u32,
            ..Default::default()
        };
        let qa = a.pd.create_qp(&a.cq, &a.cq, caps).unwrap();
        let qb = b.pd.create_qp(&b.cq, &b.cq, caps).unwrap();
        qa.connect(&qb.endpoint().unwrap()).unwrap();
        qb.connect(&qa.endpoint().unwrap()).unwrap();
        let bed = Bed { a, b, qa, qb };
        let mut sa = buf(4096, 1);
        let mut sb = buf(4096, 2);
        let mut ra = buf(N as usize * 8, 0);
        let mut rb = buf(N as usize * 8, 0);
        let (sa_mr, sb_mr) = (
            bed.a.reg(&mut sa, Access::LOCAL_WRITE).unwrap(),
            bed.b.reg(&mut sb, Access::LOCAL_WRITE).unwrap(),
        );
        let (ra_mr, rb_mr) = (
            bed.a.reg(&mut ra, Access::LOCAL_WRITE).unwrap(),
            bed.b.reg(&mut rb, Access::LOCAL_WRITE).unwrap(),
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                (0..N).for_each(|i| bed.qa.post_send(i, &[sa_mr.sge(0, 8).unwrap()]).unwrap())
            });
            s.spawn(|| {
                (0..N).for_each(|i| bed.qb.post_send(i, &[sb_mr.sge(0, 8).unwrap()]).unwrap())
            });
            s.spawn(|| {
                (0..N).for_each(|i| {
                    bed.qb
                        .post_recv(1000 + i, &[rb_mr.sge(i as usize * 8, 8).unwrap()])
                        .unwrap()
                })
            });
            s.spawn(|| {
                (0..N).for_each(|i| {
                    bed.qa
                        .post_recv(1000 + i, &[ra_mr.sge(i as usize * 8, 8).unwrap()])
                        .unwrap()
                })
            });
        });
        // Each CQ holds N send and N receive completions, each kind in posting order.
        for (side, fill, rbuf) in [(&bed.a, 2u8, &ra), (&bed.b, 1u8, &rb)] {
            let (mut sends, mut recvs) = (Vec::new(), Vec::new());
            for _ in 0..2 * N {
                let wc = side.wait();
                assert_eq!(wc.status, WcStatus::Success);
                if wc.opcode == WcOpcode::Recv {
                    recvs.push(wc.wr_id)
                } else {
                    sends.push(wc.wr_id)
                }
            }
            assert_eq!(sends, (0..N).collect::<Vec<_>>());
            assert_eq!(recvs, (1000..1000 + N).collect::<Vec<_>>());
            assert!(rbuf.as_slice().iter().all(|&x| x == fill));
        }
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("no deadlock, and every check passed");
}
