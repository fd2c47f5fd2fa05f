//! Rules: on-demand paging — page faults and their cost, prefetch (`ibv_advise_mr`) and its error
//! codes, invalidation, and device support.

use crate::common::*;
use rdma_pool::nic::soft::SoftConfig;
use rdma_pool::nic::*;
use std::time::Duration;

#[test]
fn odp_access_to_an_inaccessible_page_fails() {
    let bed = default_bed();
    let (mut dst, mr) = bed.b.reg_buf(2 * 4096, 0, RW | Access::ON_DEMAND);
    // The second page becomes inaccessible to the process.
    let rc = protect(&mut dst, 4096, 4096, libc::PROT_NONE);
    assert_eq!(rc, 0);
    let (_src, src_mr) = bed.a.reg_buf(4096, 1, Access::LOCAL_WRITE);
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64 + 4096, mr.rkey()),
        WcStatus::RemAccessErr
    );
    let (qa, _qb) = connect(&bed.a, &bed.b);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        qa.post_write(
            1,
            &[src_mr.sge(0, 64).unwrap()],
            mr.addr() as u64,
            mr.rkey(),
        )
    }
    .unwrap();
    assert_eq!(
        bed.a.wait().status,
        WcStatus::Success,
        "the accessible page faults in fine"
    );
    let c = bed.b.nic.as_soft().unwrap().counters();
    assert_eq!(c.page_faults, 2);
    // Restore before the buffer is unmapped.
    unprotect(&mut dst, 4096, 4096);
}

#[test]
fn odp_write_to_a_read_only_page_fails_but_reads_work() {
    let bed = default_bed();
    let (mut mem, mr) = bed.b.reg_buf(4096, 0x15, RW | Access::ON_DEMAND);
    // Made read-only for the process.
    protect(&mut mem, 0, 4096, libc::PROT_READ);
    let (_dst, dst_mr) = bed.a.reg_buf(4096, 0, Access::LOCAL_WRITE);
    assert_eq!(
        read(&bed, &dst_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::Success
    );
    assert_eq!(
        write(&bed, &dst_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::RemAccessErr
    );
    unprotect(&mut mem, 0, 4096);
}

#[test]
fn odp_fault_cost_is_paid_once_per_page_and_prefetch_avoids_it() {
    let cost = Duration::from_millis(5);
    let bed = soft_bed(SoftConfig {
        fault_cost: cost,
        ..Default::default()
    });
    let soft = bed.b.nic.as_soft().unwrap();
    let (_dst, mr) = bed.b.reg_buf(8 * 4096, 0, RW | Access::ON_DEMAND);
    let (_src, src_mr) = bed.a.reg_buf(8 * 4096, 1, Access::LOCAL_WRITE);
    bed.b
        .prefetch(Advice::PrefetchWrite, AdviseFlags::FLUSH, &mr, 4 * 4096);
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
    let (_dst, mr) = bed.b.reg_buf(4096, 0, RW | Access::ON_DEMAND);
    bed.b
        .prefetch(Advice::Prefetch, AdviseFlags::FLUSH, &mr, 4096);
    let (_src, src_mr) = bed.a.reg_buf(4096, 1, Access::LOCAL_WRITE);
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
    let (_dst, mr) = bed.b.reg_buf(64 * 4096, 0, RW | Access::ON_DEMAND);
    bed.b
        .prefetch(Advice::PrefetchWrite, AdviseFlags::empty(), &mr, 64 * 4096);
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
        .prefetch(Advice::PrefetchNoFault, AdviseFlags::FLUSH, &mr, 8 * 4096);
    assert_eq!(soft.resident_pages(mr.lkey()), Some(2));
}

#[test]
fn odp_invalidation_makes_pages_fault_again() {
    let bed = default_bed();
    let soft = bed.b.nic.as_soft().unwrap();
    let (_mem, mr) = bed.b.reg_buf(4 * 4096, 0, RW | Access::ON_DEMAND);
    bed.b
        .prefetch(Advice::PrefetchWrite, AdviseFlags::FLUSH, &mr, 4 * 4096);
    soft.invalidate_odp_range(mr.addr(), 4096);
    assert_eq!(soft.resident_pages(mr.lkey()), Some(3));
    assert!(!soft.is_resident(mr.lkey(), mr.addr()));
}

#[test]
fn advise_mr_error_codes_follow_the_man_page() {
    let bed = default_bed();
    let pd = &bed.b.pd;
    let (_a, ro) = bed
        .b
        .reg_buf(4 * 4096, 0, Access::ON_DEMAND | Access::REMOTE_READ);
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
    let other = reg_in(&pd2, &mut b, Access::LOCAL_WRITE | Access::ON_DEMAND).unwrap();
    assert_eq!(
        errno(&[other.sge(0, 4096).unwrap()], Advice::Prefetch),
        Some(libc::EPERM)
    );
    // An lkey naming nothing: EFAULT.
    let none = sge(ro.addr() as u64, 64, Lkey(0x00ff_ff00));
    assert_eq!(errno(&[none], Advice::Prefetch), Some(libc::EFAULT));
    // A stale lkey (not consistent with the MR's): ENOENT.
    let stale = Sge {
        lkey: Lkey(ro.lkey().0 ^ 1),
        ..ro.sge(0, 64).unwrap()
    };
    assert_eq!(errno(&[stale], Advice::Prefetch), Some(libc::ENOENT));
    // A window's key: EINVAL.
    let mw = pd.alloc_mw(MwType::Type1).unwrap();
    let mwsge = sge(ro.addr() as u64, 64, Lkey(mw.rkey().0));
    assert_eq!(errno(&[mwsge], Advice::Prefetch), Some(libc::EINVAL));
    // Nothing was prefetched by the failed calls (all entries are checked first).
    assert_eq!(bed.b.nic.as_soft().unwrap().counters().prefetched_pages, 0);
    // Range outside the process address space (inside the MR): EFAULT.
    let (mut c, odp) = bed
        .b
        .reg_buf(2 * 4096, 0, Access::LOCAL_WRITE | Access::ON_DEMAND);
    // Its second page becomes inaccessible.
    protect(&mut c, 4096, 4096, libc::PROT_NONE);
    assert_eq!(
        errno(&[odp.sge(0, 2 * 4096).unwrap()], Advice::Prefetch),
        Some(libc::EFAULT)
    );
    unprotect(&mut c, 4096, 4096);
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
    let (_nic, pd) = soft_pd(SoftConfig {
        advise_mr: false,
        ..Default::default()
    });
    let mut a = buf(4096, 0);
    let mr = reg_in(&pd, &mut a, Access::LOCAL_WRITE | Access::ON_DEMAND).unwrap();
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
    let (_nic, pd) = soft_pd(SoftConfig {
        odp: false,
        ..Default::default()
    });
    let mut a = buf(4096, 0);
    let e = reg_in(&pd, &mut a, Access::LOCAL_WRITE | Access::ON_DEMAND).unwrap_err();
    assert!(e.is_unsupported());
}

#[test]
fn failed_odp_fault_maps_nothing() {
    // Kills: keys.rs access_mr, the process-protection check of the fault removed (the DMA copy
    // still fails, but the page is left mapped for the NIC).
    let bed = default_bed();
    let soft = bed.b.nic.as_soft().unwrap();
    let (mut dst, mr) = bed.b.reg_buf(4096, 0, RW | Access::ON_DEMAND);
    let (_src, src_mr) = bed.a.reg_buf(4096, 1, Access::LOCAL_WRITE);
    // Made read-only for the process.
    protect(&mut dst, 0, 4096, libc::PROT_READ);
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64, mr.rkey()),
        WcStatus::RemAccessErr
    );
    assert_eq!(
        soft.resident_pages(mr.lkey()),
        Some(0),
        "a failed fault maps nothing"
    );
    unprotect(&mut dst, 0, 4096);
    let (qa, _qb) = connect(&bed.a, &bed.b);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        qa.post_write(
            2,
            &[src_mr.sge(0, 64).unwrap()],
            mr.addr() as u64,
            mr.rkey(),
        )
    }
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
    let (_b, pinned) = bed.b.reg_buf(4096, 0, Access::LOCAL_WRITE);
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
    let (mut c, odp) = bed
        .b
        .reg_buf(2 * 4096, 0, Access::LOCAL_WRITE | Access::ON_DEMAND);
    // Its second page becomes inaccessible.
    protect(&mut c, 4096, 4096, libc::PROT_NONE);
    let sge = [odp.sge(0, 2 * 4096).unwrap()];
    let postponed = bed
        .b
        .pd
        .advise_mr(Advice::Prefetch, AdviseFlags::empty(), &sge);
    let flushed = bed
        .b
        .pd
        .advise_mr(Advice::Prefetch, AdviseFlags::FLUSH, &sge);
    unprotect(&mut c, 4096, 4096);
    postponed.expect("a postponed prefetch does not report page errors");
    assert_eq!(flushed.unwrap_err().errno(), Some(libc::EFAULT));
}

#[test]
fn invalidating_any_range_never_panics() {
    let (nic, pd) = soft_pd(SoftConfig::default());
    let soft = nic.as_soft().unwrap();
    let mut b = buf(4096, 0);
    let _mr = reg_in(&pd, &mut b, Access::LOCAL_WRITE | Access::ON_DEMAND).unwrap();
    soft.invalidate_odp_range(usize::MAX, 2);
    soft.invalidate_odp_range(0, usize::MAX);
    assert!(Buffer::huge(usize::MAX).is_err());
}
