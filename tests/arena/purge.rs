//! Purge and revive: pinned slabs leave their registration before their pages are dropped (the
//! soft NIC's stale-page detector stays at 0), registrations shared with live memory are split
//! only while their keys are private, refusals keep the memory intact, ODP slabs are dropped
//! directly and fault back in on the peer's next WRITE.

use super::odp::arena_as;
use super::*;
use rdma_pool::arena::{RegMode, Registration};
use rdma_pool::nic::soft::{ReregMode, SoftConfig};

/// Whether any page of `[addr, addr + len)` is resident (`mincore`).
fn resident(addr: *const u8, len: usize) -> bool {
    let pages = len / 4096;
    let mut vec = vec![0u8; pages];
    // SAFETY: the range is mapped arena memory; `vec` has one byte per page.
    let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
    assert_eq!(rc, 0);
    vec.iter().any(|&b| b & 1 == 1)
}

fn stale(bed: &Bed) -> u64 {
    bed.a.nic.as_soft().map_or(0, |s| {
        let c = s.counters();
        // Accesses that met dropped pages, and pinned regions released over them (a purge
        // before the deregistration would show here even without an access).
        c.stale_pinned_accesses + c.stale_pinned_releases
    })
}

#[test]
fn purging_pinned_runs_deregisters_before_dropping_and_revives_registered() {
    let _g = serial();
    let bed = bed();
    let arena = arena_as(&bed, Registration::Pinned, Access::REMOTE_WRITE);
    let a = arena.alloc_run(2 * SLAB, 64).unwrap();
    let b = arena.alloc_run(SLAB, 64).unwrap();
    fill(a, 2 * SLAB, 1);
    fill(b, SLAB, 2);
    // (Where the device re-registers, `b` grew `a`'s region: the purge splits it, as no key
    // of it was handed out yet.)
    let before = arena.stats();
    // SAFETY: the test no longer uses `a`.
    let n = unsafe { arena.purge(a.as_ptr(), a.len()) }.unwrap();
    assert_eq!(n, 2 * SLAB);
    assert!(arena.is_purged(a.as_ptr()) && !resident(a.as_ptr(), a.len()));
    let s = arena.stats();
    assert_eq!(s.committed_bytes, before.committed_bytes - 2 * SLAB as u64);
    assert_eq!(
        s.registered_bytes,
        before.registered_bytes - 2 * SLAB as u64
    );
    assert_eq!((s.purged_bytes, s.purges), (2 * SLAB as u64, 1));
    // `b` is untouched: same bytes, registered alone, RDMA through its keys works.
    let kb = arena.keys_of(b.as_ptr()).unwrap();
    assert_eq!((kb.addr, kb.len), (b.as_ptr() as usize, SLAB));
    let (_mem, src) = bed.b.reg_buf(4096, 0x77, RW);
    assert_eq!(
        peer_write(&bed, kb, b.as_ptr() as usize, 4096, &src),
        WcStatus::Success
    );
    assert!(bytes(b, 4096).iter().all(|&x| x == 0x77));
    assert!(bytes(b, SLAB)[4096..].iter().all(|&x| x == 2));
    // Double purge is refused; revive commits and registers again, zero-filled.
    // SAFETY: as above.
    assert!(unsafe { arena.purge(a.as_ptr(), a.len()) }.is_err());
    arena.revive(a.as_ptr(), a.len()).unwrap();
    assert!(!arena.is_purged(a.as_ptr()));
    assert!(bytes(a, 2 * SLAB).iter().all(|&x| x == 0));
    let ka = arena.keys_of(a.as_ptr()).unwrap();
    assert_eq!(
        peer_write(&bed, ka, a.as_ptr() as usize, 4096, &src),
        WcStatus::Success
    );
    assert!(bytes(a, 4096).iter().all(|&x| x == 0x77));
    let s = arena.stats();
    assert_eq!(s.committed_bytes, before.committed_bytes);
    assert_eq!(s.revived_bytes, 2 * SLAB as u64);
    assert_eq!(stale(&bed), 0, "no live pinned region over dropped pages");
    assert!(arena.validate());
}

#[test]
fn a_private_shared_region_is_split_and_an_exposed_one_keeps_its_slabs() {
    let _g = serial();
    let bed = rereg_bed(ReregMode::KeepKeys);
    let arena = arena_as(&bed, Registration::Pinned, Access::REMOTE_WRITE);
    // Three runs grown into one tail region whose keys were never handed out.
    let r: Vec<Run> = (0..3).map(|_| arena.alloc_run(SLAB, 64).unwrap()).collect();
    for (i, run) in r.iter().enumerate() {
        fill(*run, SLAB, i as u8 + 1);
    }
    assert_eq!(arena.stats().mrs, 1);
    // SAFETY: the test no longer uses the middle run.
    assert_eq!(unsafe { arena.purge(r[1].as_ptr(), SLAB) }.unwrap(), SLAB);
    let s = arena.stats();
    assert_eq!(
        (s.mrs, s.purges_refused),
        (2, 0),
        "split into the two live parts"
    );
    let (_mem, src) = bed.b.reg_buf(4096, 0x33, RW);
    for i in [0, 2] {
        let k = arena.keys_of(r[i].as_ptr()).unwrap();
        assert_eq!(k.len, SLAB);
        assert!(bytes(r[i], SLAB).iter().all(|&x| x == i as u8 + 1));
        assert_eq!(
            peer_write(&bed, k, r[i].as_ptr() as usize, 4096, &src),
            WcStatus::Success
        );
    }
    assert_eq!(stale(&bed), 0);

    // Keys handed out: the region keeps its slabs (the purge is refused, counted).
    let bed = rereg_bed(ReregMode::KeepKeys);
    let arena = arena_as(&bed, Registration::Pinned, Access::empty());
    let r: Vec<Run> = (0..2).map(|_| arena.alloc_run(SLAB, 64).unwrap()).collect();
    fill(r[1], SLAB, 9);
    let k = arena.keys_of(r[0].as_ptr()).unwrap();
    // SAFETY: the test no longer uses the second run.
    assert_eq!(unsafe { arena.purge(r[1].as_ptr(), SLAB) }.unwrap(), 0);
    assert_eq!(arena.stats().purges_refused, 1);
    assert!(!arena.is_purged(r[1].as_ptr()));
    assert!(bytes(r[1], SLAB).iter().all(|&x| x == 9));
    assert_eq!(arena.keys_of(r[1].as_ptr()), Some(k));
    assert!(arena.validate());
}

#[test]
fn a_split_whose_registrations_are_refused_keeps_the_region_and_every_live_key() {
    let _g = serial();
    let bed = rereg_bed(ReregMode::KeepKeys);
    let soft = bed.a.nic.as_soft().unwrap();
    let arena = arena_as(&bed, Registration::Pinned, Access::REMOTE_WRITE);
    let r: Vec<Run> = (0..3).map(|_| arena.alloc_run(SLAB, 64).unwrap()).collect();
    for (i, run) in r.iter().enumerate() {
        fill(*run, SLAB, i as u8 + 1);
    }
    assert_eq!(arena.stats().mrs, 1, "one private tail region");
    let live = || {
        let c = soft.counters();
        c.registrations - c.deregistrations
    };
    let live0 = live();
    // The parts' registrations are refused (the first, both, both and the whole again): the
    // purge is refused and the region stays whole, its live runs registered.
    for refused in [1, 2, 3] {
        soft.fail_next(Verb::RegMr, refused, libc::ENOMEM);
        // SAFETY: the test no longer uses the middle run... but the purge is refused, so it
        // stays as it was.
        assert_eq!(unsafe { arena.purge(r[1].as_ptr(), SLAB) }.unwrap(), 0);
        soft.fail_next(Verb::RegMr, 0, 0);
        let s = arena.stats();
        assert_eq!((s.mrs, s.purges_refused), (1, refused as u64), "{s:?}");
        assert_eq!(s.unregistered_bytes, 0);
        assert!(!arena.is_purged(r[1].as_ptr()));
    }
    // A refused deregistration of the region (what a bound window does) after both parts
    // were registered: they go, the region stays.
    soft.fail_next(Verb::DeregMr, 1, libc::EBUSY);
    // SAFETY: as above.
    assert_eq!(unsafe { arena.purge(r[1].as_ptr(), SLAB) }.unwrap(), 0);
    soft.fail_next(Verb::DeregMr, 0, 0);
    assert_eq!(arena.stats().mrs, 1);
    assert_eq!(live(), live0, "no part left behind");
    let s = arena.stats();
    assert_eq!(
        (s.registered_bytes, s.unregistered_bytes),
        (3 * SLAB as u64, 0)
    );
    for (i, run) in r.iter().enumerate() {
        assert!(bytes(*run, SLAB).iter().all(|&x| x == i as u8 + 1));
    }
    // Nothing refused now (and no key handed out yet): split as usual.
    // SAFETY: the test no longer uses the middle run.
    assert_eq!(unsafe { arena.purge(r[1].as_ptr(), SLAB) }.unwrap(), SLAB);
    assert_eq!(arena.stats().mrs, 2);
    assert_eq!(live(), live0 + 1, "two parts for the region");
    let (_mem, src) = bed.b.reg_buf(4096, 0x44, RW);
    for i in [0, 2] {
        let k = arena
            .keys_of(r[i].as_ptr())
            .expect("live memory keeps its keys");
        assert_eq!((k.addr, k.len), (r[i].as_ptr() as usize, SLAB));
        assert!(bytes(r[i], SLAB).iter().all(|&x| x == i as u8 + 1));
        assert_eq!(
            peer_write(&bed, k, r[i].as_ptr() as usize, 4096, &src),
            WcStatus::Success
        );
    }
    assert_eq!(stale(&bed), 0);
    assert!(arena.validate());
}

#[test]
fn a_refused_deregistration_keeps_the_memory_and_its_keys() {
    let _g = serial();
    let bed = default_bed();
    let arena = arena_as(&bed, Registration::Pinned, Access::empty());
    let a = arena.alloc_run(SLAB, 64).unwrap();
    fill(a, SLAB, 5);
    let k = arena.keys_of(a.as_ptr()).unwrap();
    // What a bound window does to dereg_mr (EBUSY; rxe says EINVAL).
    let soft = bed.a.nic.as_soft().unwrap();
    for errno in [libc::EBUSY, libc::EINVAL] {
        soft.fail_next(Verb::DeregMr, 1, errno);
        // SAFETY: the test no longer uses `a`... but the purge is refused, so it may.
        assert_eq!(unsafe { arena.purge(a.as_ptr(), SLAB) }.unwrap(), 0);
        assert_eq!(arena.keys_of(a.as_ptr()), Some(k));
        assert!(bytes(a, SLAB).iter().all(|&x| x == 5));
    }
    let (_mem, dst) = bed.b.reg_buf(4096, 0, RW);
    assert_eq!(
        write_out(&bed, k, a.as_ptr() as usize, 4096, &dst),
        WcStatus::Success
    );
    assert_eq!(arena.stats().purges_refused, 2);
    assert!(arena.validate());
}

#[test]
fn purged_odp_memory_faults_back_in_on_the_peers_write() {
    let _g = serial();
    let bed = bed();
    if !bed.a.nic.caps().odp.explicit {
        return;
    }
    let arena = arena_as(&bed, Registration::Odp, Access::REMOTE_WRITE);
    assert_eq!(arena.stats().mode, RegMode::Odp);
    let a = arena.alloc_run(SLAB, 64).unwrap();
    fill(a, SLAB, 0xEE);
    let k = arena.keys_of(a.as_ptr()).unwrap();
    let regs = arena.stats().regs;
    // SAFETY: the test no longer uses `a`.
    assert_eq!(unsafe { arena.purge(a.as_ptr(), SLAB) }.unwrap(), SLAB);
    // The region stays: same keys, no NIC call.
    assert_eq!(arena.keys_of(a.as_ptr()), Some(k));
    assert_eq!(arena.stats().regs, regs);
    assert!(!resident(a.as_ptr(), SLAB));
    let faults = bed.a.nic.as_soft().map(|s| s.counters().page_faults);
    let (_mem, src) = bed.b.reg_buf(8192, 0x5C, RW);
    let at = a.as_ptr() as usize + 8192; // page-aligned (rxe's ODP needs it)
    assert_eq!(peer_write(&bed, k, at, 8192, &src), WcStatus::Success);
    if let (Some(before), Some(soft)) = (faults, bed.a.nic.as_soft()) {
        assert!(
            soft.counters().page_faults >= before + 2,
            "the NIC faulted the pages in"
        );
    }
    arena.revive(a.as_ptr(), SLAB).unwrap();
    assert_eq!(arena.stats().regs, regs);
    // SAFETY: arena memory owned by the test.
    let got = unsafe { std::slice::from_raw_parts(at as *const u8, 8192) };
    assert!(got.iter().all(|&x| x == 0x5C));
    assert!(
        bytes(a, 8192).iter().all(|&x| x == 0),
        "dropped pages read as zero"
    );
    assert!(arena.validate());
}

#[test]
fn hugetlb_slabs_go_back_to_the_hugetlb_pool() {
    let _g = serial();
    let bed = soft_bed(SoftConfig::default());
    let arena = arena(&bed, 8 << 20, Hugepages::Require, Access::empty());
    let Ok(a) = arena.alloc_run(SLAB, 64) else {
        return; // no hugetlb pages on this machine: the refusal path is tested in pages.rs
    };
    fill(a, SLAB, 3);
    let free = free_hugepages();
    assert_eq!(arena.stats().hugetlb_bytes, SLAB as u64);
    // SAFETY: the test no longer uses `a`.
    assert_eq!(unsafe { arena.purge(a.as_ptr(), SLAB) }.unwrap(), SLAB);
    assert_eq!(free_hugepages(), free + 1);
    assert_eq!(arena.stats().hugetlb_bytes, 0);
    arena.revive(a.as_ptr(), SLAB).unwrap();
    assert_eq!(free_hugepages(), free);
    assert!(arena.keys_of(a.as_ptr()).is_some());
    assert!(bytes(a, SLAB).iter().all(|&x| x == 0));
}

/// Every free hugetlb page of the machine, mapped and populated by this process (until the
/// mappings are dropped).
fn take_all_hugepages() -> Vec<(*mut libc::c_void, usize)> {
    let mut taken = Vec::new();
    loop {
        let len = SLAB;
        // SAFETY: a fresh private mapping, unmapped by the caller.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            break;
        }
        // SAFETY: the mapping above.
        if unsafe { libc::madvise(p, len, libc::MADV_POPULATE_WRITE) } != 0 {
            // SAFETY: the mapping above, unused.
            unsafe { libc::munmap(p, len) };
            break;
        }
        taken.push((p, len));
    }
    taken
}

/// `Hugepages::Require` holds for a purged slab brought back too: with the hugetlb pool dry,
/// the revival fails with `HugepagesUnavailable` (the slab stays purged) instead of coming
/// back on ordinary pages, and succeeds on hugetlb pages once there are some (found by a
/// hostile review).
#[test]
fn a_required_hugetlb_slab_is_never_revived_on_ordinary_pages() {
    let _g = serial();
    let bed = soft_bed(SoftConfig::default());
    let arena = arena(&bed, 8 << 20, Hugepages::Require, Access::empty());
    let Ok(a) = arena.alloc_run(SLAB, 64) else {
        return; // no hugetlb pages on this machine: the refusal path is tested in pages.rs
    };
    // SAFETY: the test no longer uses `a`.
    assert_eq!(unsafe { arena.purge(a.as_ptr(), SLAB) }.unwrap(), SLAB);
    let before = arena.stats();
    let taken = take_all_hugepages();
    let e = arena.revive(a.as_ptr(), SLAB);
    for (p, len) in taken {
        // SAFETY: the mappings taken above.
        unsafe { libc::munmap(p, len) };
    }
    assert!(
        matches!(e, Err(rdma_pool::arena::Error::HugepagesUnavailable { .. })),
        "{e:?}"
    );
    let after = arena.stats();
    assert_eq!(after.slabs_thp, before.slabs_thp);
    assert_eq!(after.slabs_small, before.slabs_small);
    assert_eq!(after.hugetlb_bytes, 0);
    arena.revive(a.as_ptr(), SLAB).unwrap();
    assert_eq!(arena.stats().hugetlb_bytes, SLAB as u64);
    assert!(arena.keys_of(a.as_ptr()).is_some());
    assert!(arena.validate());
}
