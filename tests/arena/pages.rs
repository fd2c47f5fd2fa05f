//! Page kinds (hugetlb → THP → 4 KiB, reported) and the VMA count after many slab commits.

use super::*;
use rdma_pool::arena::Error;

#[test]
fn hugetlb_until_the_pool_runs_dry_then_thp_reported() {
    let _g = serial();
    let bed = bed();
    let free = free_hugepages();
    let arena = arena(&bed, 64 << 20, Hugepages::Prefer, Access::empty());
    let mut runs = Vec::new();
    for i in 0..free + 2 {
        let run = arena.alloc_run(SLAB, 64).unwrap();
        fill(run, SLAB, i as u8);
        runs.push(run);
    }
    let s = arena.stats();
    assert_eq!(
        s.slabs_hugetlb + s.slabs_thp + s.slabs_small,
        free as u64 + 2
    );
    assert!(s.slabs_hugetlb <= free as u64, "{s:?}");
    assert!(
        s.slabs_thp + s.slabs_small >= 2,
        "fell back when hugetlb ran dry: {s:?}"
    );
    if free > 0 {
        assert!(s.slabs_hugetlb > 0, "{s:?}");
    }
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|t| !t.contains("[never]"));
    assert_eq!(s.slabs_thp > 0, thp, "{s:?}");
    // Every slab, whatever its kind, is registered and moves data.
    let (dst_mem, dst) = bed.b.reg_buf(4096, 0xFF, RW);
    for (i, run) in runs.iter().enumerate() {
        let keys = arena.keys_of(run.as_ptr()).unwrap();
        assert_eq!(
            write_out(&bed, keys, run.as_ptr() as usize, 4096, &dst),
            WcStatus::Success
        );
        assert!(dst_mem.as_slice().iter().all(|&b| b == i as u8));
    }
    assert!(arena.validate());
}

#[test]
fn require_fails_cleanly_when_hugetlb_is_empty() {
    let _g = serial();
    let bed = bed();
    let free = free_hugepages();
    let arena = arena(&bed, 64 << 20, Hugepages::Require, Access::empty());
    for _ in 0..free {
        arena.alloc_run(SLAB, 64).unwrap();
    }
    let e = arena.alloc_run(SLAB, 64).unwrap_err();
    assert!(matches!(e, Error::HugepagesUnavailable { .. }), "{e}");
    let s = arena.stats();
    assert_eq!(s.slabs_hugetlb, free as u64);
    assert_eq!(
        s.committed_bytes,
        free as u64 * SLAB as u64,
        "the failed run left nothing"
    );
    assert_eq!(s.slabs_thp + s.slabs_small, 0);
}

#[test]
fn off_commits_small_pages() {
    let _g = serial();
    let bed = bed();
    let arena = arena(&bed, 64 << 20, Hugepages::Off, Access::empty());
    arena.alloc_run(3 * SLAB, 64).unwrap();
    let s = arena.stats();
    assert_eq!((s.slabs_hugetlb, s.slabs_thp, s.slabs_small), (0, 0, 3));
}

/// Thousands of slab commits (hundreds in the 2 GiB guest) add O(chunks) VMAs, not O(slabs).
/// Each slab's keys are handed out (so each is its own region, the worst case for the NIC)
/// and its pages dropped after registration to keep the resident set small.
#[test]
fn vma_count_stays_flat_over_many_slab_commits() {
    let _g = serial();
    let bed = bed();
    let slabs = if on_verbs() { 150 } else { 2000 };
    let chunk = 64usize << 20;
    let arena = arena(&bed, chunk, Hugepages::Prefer, Access::empty());
    let before = vma_count();
    for _ in 0..slabs {
        let run = arena.alloc_run(SLAB, 64).unwrap();
        arena.keys_of(run.as_ptr()).unwrap();
        // SAFETY: test-only: the run's bytes are not used again (the region may go stale).
        unsafe { libc::madvise(run.as_ptr().cast(), SLAB, libc::MADV_DONTNEED) };
    }
    let s = arena.stats();
    let after = vma_count();
    assert_eq!(s.runs, slabs as u64);
    assert!(
        after.saturating_sub(before) <= 3 * s.chunks as usize + 4,
        "{before} → {after} VMAs for {} chunks ({s:?})",
        s.chunks
    );
}

#[test]
fn hugetlb_tails_grow_by_rereg() {
    let _g = serial();
    if free_hugepages() < 2 {
        // Nothing to grow in hugetlb: the other tests cover the refusal path.
        return;
    }
    let bed = rereg_bed(rdma_pool::nic::soft::ReregMode::KeepKeys);
    let arena = arena(&bed, 64 << 20, Hugepages::Require, Access::empty());
    let a = arena.alloc_run(SLAB, 64).unwrap();
    arena.alloc_run(SLAB, 64).unwrap();
    let s = arena.stats();
    assert_eq!((s.slabs_hugetlb, s.reregs, s.mrs), (2, 1, 1), "{s:?}");
    assert_eq!(arena.keys_of(a.as_ptr()).unwrap().len, 2 * SLAB);
}
