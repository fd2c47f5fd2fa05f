//! Rules: the mlx5 behaviour the soft NIC models — which re-registrations keep keys and the
//! revoke window while they update, windows above 2 GiB, the DEVX UMEM access flags.

mod common;

use common::*;
use rdma_pool::nic::soft::{ReregMode, SoftConfig};
use rdma_pool::nic::*;
use std::time::Duration;

fn mlx5_bed(revoke: Duration) -> Bed {
    soft_bed(SoftConfig {
        rereg: ReregMode::Mlx5,
        umr_revoke_time: revoke,
        ..Default::default()
    })
}

/// Re-register `mr` onto `[ptr, ptr + len)`; returns whether the keys were kept.
fn move_to(mr: &mut Mr, ptr: *mut u8, len: usize) -> bool {
    let keys = (mr.lkey(), mr.rkey());
    // SAFETY: every caller keeps the new range alive longer than the region.
    unsafe {
        mr.rereg(
            ReregFlags::CHANGE_TRANSLATION,
            None,
            ptr,
            len,
            Access::empty(),
        )
    }
    .unwrap();
    (mr.lkey(), mr.rkey()) == keys
}

#[test]
fn a_pinned_region_keeps_its_keys_while_it_fits_its_cache_entry() {
    let bed = mlx5_bed(Duration::ZERO);
    let mut big = buf(16 * 4096, 0);
    // 3 pages: the 4-descriptor cache entry.
    // SAFETY: `big` outlives the region.
    let mut mr = unsafe { bed.b.pd.reg_mr(big.as_mut_ptr(), 3 * 4096, RW) }.unwrap();
    let old = mr.rkey();
    assert!(
        move_to(&mut mr, big.as_mut_ptr(), 4 * 4096),
        "4 pages fit 4 descriptors"
    );
    assert!(
        !move_to(&mut mr, big.as_mut_ptr(), 5 * 4096),
        "5 pages do not"
    );
    // The old keys are dead, the new ones work.
    let (mut src, src_mr) = bed.a.reg_buf(4096, 0x61, Access::LOCAL_WRITE);
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64, old),
        WcStatus::RemAccessErr
    );
    let bed = mlx5_bed(Duration::ZERO);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    let mut mr = bed.b.reg(&mut big, RW).unwrap();
    assert!(
        move_to(&mut mr, big.as_mut_ptr(), 16 * 4096),
        "16 pages: entry 16"
    );
    assert_eq!(
        write(&bed, &src_mr, 64, mr.addr() as u64 + 15 * 4096, mr.rkey()),
        WcStatus::Success
    );
    assert!(
        big.as_slice()[15 * 4096..15 * 4096 + 64]
            .iter()
            .all(|&x| x == 0x61)
    );
    // The entry stays the region's own: shrinking and growing back keeps the keys.
    assert!(move_to(&mut mr, big.as_mut_ptr(), 4096));
    assert!(move_to(&mut mr, big.as_mut_ptr(), 16 * 4096));
}

#[test]
fn an_odp_region_gets_new_keys_on_every_translation_change() {
    let bed = mlx5_bed(Duration::ZERO);
    let mut a = buf(2 * 4096, 0);
    let mut mr = bed.b.reg(&mut a, RW | Access::ON_DEMAND).unwrap();
    assert!(!move_to(&mut mr, a.as_mut_ptr(), 4096));
    assert!(!move_to(&mut mr, a.as_mut_ptr(), 4096));
}

#[test]
fn access_changes_keep_keys_only_within_what_umr_can_change() {
    let bed = mlx5_bed(Duration::ZERO);
    let mut a = buf(4096, 0);
    let mut mr = bed.b.reg(&mut a, RW).unwrap();
    let mut rereg = |access| {
        let keys = mr.rkey();
        // SAFETY: no translation change.
        unsafe {
            mr.rereg(
                ReregFlags::CHANGE_ACCESS,
                None,
                std::ptr::null_mut(),
                0,
                access,
            )
        }
        .unwrap();
        mr.rkey() == keys
    };
    assert!(rereg(RW | Access::REMOTE_ATOMIC));
    assert!(rereg(Access::LOCAL_WRITE));
    assert!(
        !rereg(Access::LOCAL_WRITE | Access::MW_BIND),
        "MW_BIND: a new mkey"
    );
    assert!(!rereg(Access::LOCAL_WRITE), "and back");
}

#[test]
fn traffic_fails_while_a_kept_key_region_is_revoked() {
    let bed = mlx5_bed(Duration::from_millis(600));
    let mut a = buf(2 * 4096, 0);
    let mut mr = bed.b.reg(&mut a, RW).unwrap();
    let (addr, rkey) = (mr.addr() as u64, mr.rkey());
    let target = a.as_mut_ptr() as usize;
    let updater = std::thread::spawn(move || {
        // SAFETY: `a` outlives the thread: it is joined below, before `a` drops.
        let kept = move_to(&mut mr, target as *mut u8, 2 * 4096);
        (kept, mr)
    });
    std::thread::sleep(Duration::from_millis(150));
    let (_src, src_mr) = bed.a.reg_buf(4096, 0x62, Access::LOCAL_WRITE);
    assert_eq!(
        write(&bed, &src_mr, 64, addr, rkey),
        WcStatus::RemAccessErr,
        "the mkey is revoked during the update"
    );
    let (kept, mr) = updater.join().unwrap();
    assert!(kept, "1 → 2 pages fits the 4-descriptor entry");
    assert_eq!(mr.rkey(), rkey);
    let (qa, _qb) = connect(&bed.a, &bed.b);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { qa.post_write(1, &[src_mr.sge(0, 64).unwrap()], addr, rkey) }.unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success, "usable again");
}

#[test]
fn keep_keys_and_change_keys_modes_do_what_they_say() {
    for (mode, kept) in [(ReregMode::KeepKeys, true), (ReregMode::ChangeKeys, false)] {
        let bed = soft_bed(SoftConfig {
            rereg: mode,
            ..Default::default()
        });
        let mut a = buf(64 * 4096, 0);
        let mut mr = bed.b.reg(&mut a, RW | Access::ON_DEMAND).unwrap();
        assert_eq!(
            move_to(&mut mr, a.as_mut_ptr(), 64 * 4096),
            kept,
            "{mode:?}"
        );
    }
}

#[test]
fn windows_above_2_gib_are_refused_at_the_call() {
    let bed = default_bed();
    let len = (1usize << 31) + 4096;
    // An ODP region over reserved, never-touched memory.
    let (_reserve, mr) = bed
        .b
        .reg_reserved(len, RW | Access::MW_BIND | Access::ON_DEMAND);
    let mut mw = bed.b.pd.alloc_mw(MwType::Type1).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let e = unsafe { bed.qb.bind_mw(1, &mut mw, &mr, 0, len, Access::REMOTE_READ) }.unwrap_err();
    assert!(e.is_unsupported(), "{e}");
    let mut mw2 = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let e = unsafe {
        bed.qb
            .post_bind_mw(2, &mut mw2, &mr, 0, len, Access::REMOTE_READ)
    }
    .unwrap_err();
    assert!(e.is_unsupported(), "{e}");
    assert!(bed.b.cq.poll_one().unwrap().is_none(), "nothing was posted");
    // Exactly 2 GiB is fine.
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .bind_mw(3, &mut mw, &mr, 0, 1 << 31, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
}

#[test]
fn umem_takes_exactly_the_access_flags_devx_allows() {
    let nic = Nic::soft();
    let mut b = buf(4 * 4096, 0);
    let mut reg = |access| {
        // SAFETY: `b` outlives the UMEM, dropped at once.
        unsafe { nic.umem_reg(b.as_mut_ptr(), 4 * 4096, access, 1 << 12) }
    };
    for ok in [
        Access::empty(),
        Access::LOCAL_WRITE,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        Access::REMOTE_READ | Access::RELAXED_ORDERING,
    ] {
        reg(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
    }
    for bad in [
        Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
        Access::LOCAL_WRITE | Access::MW_BIND,
        Access::ON_DEMAND,
        Access::HUGETLB,
        Access::REMOTE_WRITE, // ib_check_mr_access: needs LOCAL_WRITE
    ] {
        assert_eq!(reg(bad).unwrap_err().errno(), Some(libc::EINVAL), "{bad:?}");
    }
}

#[test]
fn a_window_of_exactly_2_gib_is_taken_by_both_binds() {
    let bed = default_bed();
    let len = 1usize << 31;
    let (_reserve, mr) = bed
        .b
        .reg_reserved(len, RW | Access::MW_BIND | Access::ON_DEMAND);
    let mut mw2 = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .post_bind_mw(1, &mut mw2, &mr, 0, len, Access::REMOTE_READ)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
}

/// Re-register `mr` with `flags`/`access` on a thread while a WRITE goes through its old rkey;
/// returns the WRITE's status.
fn write_during_rereg(bed: &Bed, mut mr: Mr, flags: ReregFlags, access: Access) -> WcStatus {
    let (addr, rkey) = (mr.addr() as u64, mr.rkey());
    let (ptr, len) = (mr.addr(), mr.len());
    let updater = std::thread::spawn(move || {
        // SAFETY: the range is the region's own, alive for the whole test.
        unsafe { mr.rereg(flags, None, ptr as *mut u8, len, access) }.unwrap();
        mr
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut src = buf(4096, 0x63);
    let src_mr = bed.a.reg(&mut src, Access::LOCAL_WRITE).unwrap();
    let status = write(bed, &src_mr, 64, addr, rkey);
    drop(updater.join().unwrap());
    status
}

#[test]
fn only_an_mlx5_translation_update_revokes_the_region() {
    let revoke = Duration::from_millis(500);
    // KeepKeys stands for no real device: no revoke window.
    let bed = soft_bed(SoftConfig {
        rereg: ReregMode::KeepKeys,
        umr_revoke_time: revoke,
        ..Default::default()
    });
    let mut a = buf(2 * 4096, 0);
    let mr = bed.b.reg(&mut a, RW).unwrap();
    let status = write_during_rereg(&bed, mr, ReregFlags::CHANGE_TRANSLATION, Access::empty());
    assert_eq!(status, WcStatus::Success);
    // mlx5 changes access in place with a UMR that does not revoke the mkey.
    let bed = mlx5_bed(revoke);
    let mr = bed.b.reg(&mut a, RW).unwrap();
    let status = write_during_rereg(
        &bed,
        mr,
        ReregFlags::CHANGE_ACCESS,
        RW | Access::REMOTE_ATOMIC,
    );
    assert_eq!(status, WcStatus::Success);
}

#[test]
fn hugetlb_regions_count_descriptors_in_huge_pages_when_aligned() {
    let Ok(mut huge) = Buffer::huge(4 << 21) else {
        eprintln!("no huge pages reserved: the huge-page block count cannot be checked here");
        assert!(Buffer::huge(4 << 21).is_err());
        return;
    };
    let bed = mlx5_bed(Duration::ZERO);
    let p = huge.as_mut_ptr();
    // Aligned to its huge page: 1 block of 2 MiB, the 4-descriptor entry; 4 huge pages fit it
    // (counted in 4 KiB pages it would be 512 → 2048 and outgrow its entry).
    // SAFETY (all calls): `huge` outlives the regions.
    let mut mr = unsafe { bed.b.pd.reg_mr(p, 1 << 21, RW) }.unwrap();
    assert!(
        move_to(&mut mr, p, 4 << 21),
        "4 huge pages fit 4 descriptors"
    );
    drop(mr);
    // Not aligned to its huge page: mlx5 falls back to 4 KiB blocks, and 5 of them outgrow
    // the 4-descriptor entry although they lie in one huge page.
    let q = p.wrapping_add(4096);
    let mut mr = unsafe { bed.b.pd.reg_mr(q, 4096, RW) }.unwrap();
    assert!(!move_to(&mut mr, q, 5 * 4096), "5 pages of 4 KiB");
}
