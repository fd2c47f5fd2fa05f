//! Sparse classes: a thread holding a few blocks of many small classes holds a few pages (its
//! first blocks of a class live on the page of the class's group leader, the power of two
//! above it), and a class it uses a lot gets pages of its own. Blocks stay usable, aligned,
//! zeroed when asked, and go back by sized and unsized frees alike.

use super::*;
use std::alloc::Layout;

/// Every class size from 16 to 512 bytes, from the pool's own table.
fn small_class_sizes(pool: &Pool) -> Vec<usize> {
    pool.stats()
        .alloc
        .classes
        .iter()
        .map(|c| c.block_size as usize)
        .filter(|&s| (16..=512).contains(&s))
        .collect()
}

/// Pages of classes of at most 512 bytes the pool has.
fn small_pages(pool: &Pool) -> u64 {
    pool.stats()
        .alloc
        .classes
        .iter()
        .filter(|c| c.block_size <= 512)
        .map(|c| c.pages)
        .sum()
}

#[test]
fn a_thread_holding_two_blocks_of_each_of_thirty_classes_holds_a_few_pages() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = pool_on(&pd, Access::empty());
    let sizes = small_class_sizes(&pool);
    assert!(sizes.len() >= 30, "{sizes:?}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut held = Vec::new();
            for (k, &size) in sizes.iter().enumerate() {
                for i in 0..2 {
                    // Every other block over-aligned to 16 bytes.
                    let align = if i == 1 && size % 16 == 0 { 16 } else { 8 };
                    let layout = Layout::from_size_align(size, align).unwrap();
                    let p = pool.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "{layout:?}");
                    // SAFETY: a fresh block of `layout`.
                    unsafe { p.write_bytes(pattern(k as u64, i), size) };
                    held.push((p, layout, pattern(k as u64, i)));
                }
            }
            // Groups (8, 16], (16, 32], … (256, 512]: six leaders' pages and the few more
            // the largest groups fill (16 blocks of up to 512 bytes are 8 KiB); a page per
            // class would be thirty-one.
            let pages = small_pages(&pool);
            assert!(
                pages <= 10,
                "{} blocks of {} classes on {pages} pages",
                held.len(),
                sizes.len()
            );
            for (k, &(p, layout, v)) in held.iter().enumerate() {
                // SAFETY: the block written above, still live.
                let bytes = unsafe { std::slice::from_raw_parts(p, layout.size()) };
                assert!(
                    bytes.iter().all(|&b| b == v),
                    "block {k} of {layout:?} overwritten"
                );
                // SAFETY: a block of `pool` with `layout`, freed once; every other one by the
                // unsized free.
                unsafe {
                    if k % 2 == 0 {
                        pool.free_sized(p, layout);
                    } else {
                        pool.free(p);
                    }
                }
            }
        });
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn a_class_a_thread_uses_a_lot_gets_pages_of_its_own_and_zeroed_blocks_stay_zero() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = pool_on(&pd, Access::empty());
    let layout = Layout::from_size_align(40, 8).unwrap();
    let of_40 = |pool: &Pool| {
        let s = pool.stats().alloc;
        s.classes.iter().find(|c| c.block_size == 40).unwrap().pages
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            // A few: on the page of the 64-byte class, none of its own.
            let few: Vec<*mut u8> = (0..4).map(|_| pool.alloc(layout)).collect();
            assert_eq!(of_40(&pool), 0);
            // A block of the group freed dirty and asked back zeroed reads zero.
            for &p in &few {
                // SAFETY: fresh blocks of `layout`.
                unsafe { p.write_bytes(0xEE, 40) };
            }
            for &p in &few {
                // SAFETY: blocks of `pool` with `layout`, freed once.
                unsafe { pool.free_sized(p, layout) };
            }
            for _ in 0..64 {
                let z = pool.alloc_zeroed(layout);
                assert!(!z.is_null());
                // SAFETY: a live block of 40 bytes.
                assert!(
                    unsafe { std::slice::from_raw_parts(z, 40) }
                        .iter()
                        .all(|&b| b == 0)
                );
                // SAFETY: dirtied, then freed once.
                unsafe {
                    z.write_bytes(0xEE, 40);
                    pool.free(z);
                }
            }
            // Many: the class takes pages of its own.
            let many: Vec<*mut u8> = (0..4000).map(|_| pool.alloc(layout)).collect();
            assert!(many.iter().all(|p| !p.is_null()));
            assert!(
                of_40(&pool) > 0,
                "4000 blocks of 40 bytes on no page of their class"
            );
            let mut seen = std::collections::HashSet::new();
            for &p in &many {
                assert!(seen.insert(p as usize), "{p:p} handed out twice");
                // SAFETY: a block of `pool` with `layout`, freed once.
                unsafe { pool.free_sized(p, layout) };
            }
        });
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn a_sparse_block_resizes_in_place_to_its_leaders_class_and_its_sized_free_is_seen() {
    use rdma_pool::alloc::FreeError;
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = pool_on(&pd, Access::empty());
    let l = |n| Layout::from_size_align(n, 8).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let p = pool.alloc(l(40));
            assert!(!p.is_null());
            // A block of the 64-byte leader's page.
            assert_eq!(pool.usable_size(p), Some(64));
            // SAFETY: fresh, then resized with its current layout each time; freed once.
            unsafe {
                p.write_bytes(0x5A, 40);
                // To its leader's class (its page's): in place, contents kept.
                let q = pool.realloc(p, l(40), 60);
                assert_eq!(q, p);
                assert!(std::slice::from_raw_parts(q, 36).iter().all(|&b| b == 0x5A));
                // Beyond the group: moved.
                let r = pool.realloc(q, l(60), 100);
                assert_ne!(r, p);
                assert!(std::slice::from_raw_parts(r, 36).iter().all(|&b| b == 0x5A));
                pool.free_sized(r, l(100));
                assert_eq!(pool.try_free(r), Err(FreeError::NotLive));
            }
            // Freed with the size it was asked with: in the 40-byte class's cache, and a second
            // checked free is refused.
            let b = pool.alloc(l(40));
            // SAFETY: a block of `pool` with this layout, freed once.
            unsafe { pool.free_sized(b, l(40)) };
            // SAFETY: `b` was freed: the checked free must refuse it, not free it again.
            assert_eq!(unsafe { pool.try_free(b) }, Err(FreeError::NotLive));
            // The cached block is handed out again, once.
            let c = pool.alloc(l(40));
            let d = pool.alloc(l(40));
            assert_ne!(c, d);
            // SAFETY: blocks of `pool` with this layout, freed once.
            unsafe {
                pool.free(c);
                pool.free(d);
            }
        });
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}
