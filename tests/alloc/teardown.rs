//! Teardown: a dropped pool never unmaps live blocks; an exiting thread hands its pages back.

use super::*;
use std::alloc::Layout;

#[test]
fn dropping_a_pool_with_live_blocks_keeps_them_valid() {
    let _g = serial();
    let bed = default_bed();
    let soft = bed.a.nic.as_soft().unwrap();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let p = pool.alloc(Layout::from_size_align(4096, 64).unwrap());
    // SAFETY: a live block.
    unsafe { std::ptr::write_bytes(p, 0x3C, 4096) };
    let deregs = soft.counters().deregistrations;
    drop(pool);
    // The memory is still mapped and registered: readable, writable, no region was dropped.
    // SAFETY: the pool promised to keep live blocks mapped.
    unsafe {
        assert_eq!(*p.add(4095), 0x3C);
        *p = 1;
    }
    assert_eq!(soft.counters().deregistrations, deregs);
}

#[test]
fn dropping_an_idle_pool_releases_its_regions() {
    let _g = serial();
    let bed = default_bed();
    let soft = bed.a.nic.as_soft().unwrap();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let ps: Vec<_> = (0..100)
        .map(|i| pool.alloc(Layout::from_size_align(100 * i + 1, 8).unwrap()))
        .collect();
    for p in ps {
        // SAFETY: blocks of the pool, freed once.
        unsafe { pool.free(p) };
    }
    let mrs = pool.stats().alloc.arena.mrs;
    assert!(mrs > 0);
    let deregs = soft.counters().deregistrations;
    drop(pool);
    assert_eq!(soft.counters().deregistrations - deregs, mrs);
}

#[test]
fn an_exiting_thread_hands_its_pages_back() {
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let layout = Layout::from_size_align(48, 8).unwrap();
    let first = std::thread::scope(|s| {
        s.spawn(|| {
            let ps: Vec<_> = (0..5000).map(|_| pool.alloc(layout)).collect();
            let kept = ps[0];
            for &p in &ps[1..] {
                // SAFETY: blocks of the pool, freed once.
                unsafe { pool.free(p) };
            }
            kept as usize
        })
        .join()
        .unwrap()
    });
    let s = pool.stats();
    assert!(
        s.alloc.empty_pages > 0,
        "empty pages of the exited thread went back: {s:?}"
    );
    let pages_before = s.alloc.classes.iter().map(|c| c.pages).sum::<u64>() + s.alloc.empty_pages;
    // The main thread frees the block the exited thread kept (a remote free), and a new
    // thread reuses the handed-back pages instead of carving new ones.
    // SAFETY: the kept block, freed once.
    unsafe { pool.free(first as *mut u8) };
    std::thread::scope(|s| {
        s.spawn(|| {
            let ps: Vec<_> = (0..5000).map(|_| pool.alloc(layout)).collect();
            for p in ps {
                // SAFETY: as above.
                unsafe { pool.free(p) };
            }
        });
    });
    let s = pool.stats();
    let pages_after = s.alloc.classes.iter().map(|c| c.pages).sum::<u64>() + s.alloc.empty_pages;
    assert_eq!(pages_after, pages_before, "no new pages carved: {s:?}");
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}
