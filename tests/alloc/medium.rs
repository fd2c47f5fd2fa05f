//! Medium blocks (64 KiB – 1 MiB) come from size-class pages of the thread's heap, as small
//! ones do: no lock and no scan, at most a slab per page, freed across threads like any block;
//! over-aligned small blocks cost about their alignment; larger blocks are slab runs.

use super::*;
use std::alloc::Layout;

fn fill(p: *mut u8, len: usize, byte: u8) {
    // SAFETY: a live block of at least `len` bytes.
    unsafe { std::ptr::write_bytes(p, byte, len) };
}

fn all(p: *const u8, len: usize, byte: u8) -> bool {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(p, len) }
        .iter()
        .all(|&b| b == byte)
}

fn l(n: usize, a: usize) -> Layout {
    Layout::from_size_align(n, a).unwrap()
}

#[test]
fn medium_sizes_come_from_per_thread_class_pages() {
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    for n in [(64 << 10) + 1, 100 << 10, 300 << 10, 600 << 10, 1 << 20] {
        let p = pool.alloc(l(n, 8));
        let q = pool.alloc(l(n, 8));
        let usable = pool.usable_size(p).unwrap();
        assert!(usable >= n && usable - n <= n / 8, "{n} -> {usable}");
        fill(p, n, 1);
        fill(q, n, 2);
        assert!(all(p, n, 1) && all(q, n, 2));
        let k = pool.keys_of(p).unwrap();
        assert!(
            k.contains(p as usize, usable),
            "a block lies in one registration"
        );
        // Another thread's block of the class comes from its own page.
        let other = std::thread::scope(|s| s.spawn(|| pool.alloc(l(n, 8)) as usize).join()).unwrap()
            as *mut u8;
        // A thread's first four pages of a class hold one block each (at least 64 KiB), its
        // next ones eight, or are one 2 MiB slab: the other thread's block is in neither of
        // this thread's pages.
        let first = usable.next_power_of_two().max(64 << 10);
        let in_page = |x: *mut u8, of: *mut u8, page: usize| {
            x as usize & !(page - 1) == of as usize & !(page - 1)
        };
        for mine in [p, q] {
            assert!(!in_page(other, mine, first), "{n}: threads share a page");
        }
        if first > 64 << 10 {
            assert!(!in_page(p, q, first), "{n}: two blocks on a one-block page");
        }
        // SAFETY: live blocks of this pool with these layouts, each freed once.
        unsafe {
            pool.free_sized(p, l(n, 8));
            pool.free(q);
            pool.free(other);
        }
    }
    let s = pool.stats();
    assert_eq!(
        s.alloc.large_allocated_bytes, 0,
        "no slab run for a block up to 1 MiB"
    );
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn medium_blocks_freed_by_other_threads_are_reused_by_their_owner() {
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let layout = l(200 << 10, 8);
    let blocks: Vec<usize> = (0..64)
        .map(|i| {
            let p = pool.alloc(layout);
            fill(p, 200 << 10, i as u8);
            p as usize
        })
        .collect();
    let committed = pool.stats().alloc.arena.committed_bytes;
    std::thread::scope(|s| {
        // Joined explicitly: that waits for the thread's exit (its heap given back), where
        // the end of the scope only waits for its closure.
        s.spawn(|| {
            for (i, &p) in blocks.iter().enumerate() {
                assert!(all(p as *const u8, 200 << 10, i as u8));
                // SAFETY: live blocks of this pool, freed once (by this other thread).
                unsafe { pool.free_sized(p as *mut u8, layout) };
            }
        })
        .join()
        .unwrap();
    });
    // The owner collects them (or the freeing thread retired the pages it emptied): a second
    // round needs no new memory, and its blocks lie in the pages (2 MiB slabs) of the first.
    let again: Vec<*mut u8> = (0..64).map(|_| pool.alloc(layout)).collect();
    let slab = |p: usize| p >> 21;
    assert!(
        again
            .iter()
            .all(|p| blocks.iter().any(|&b| slab(b) == slab(*p as usize)))
    );
    assert_eq!(pool.stats().alloc.arena.committed_bytes, committed);
    for p in again {
        // SAFETY: as above.
        unsafe { pool.free_sized(p, layout) };
    }
    assert_eq!(pool.live_blocks(), 0);
}

#[test]
fn a_vec_grows_through_the_medium_sizes_with_its_contents() {
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let mut v: allocator_api2::vec::Vec<u64, &Pool> = allocator_api2::vec::Vec::new_in(&pool);
    for i in 0..(3 << 20) / 8 {
        v.push(i as u64);
    }
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    assert!(pool.keys_of(v.as_ptr().cast()).is_some());
    v.truncate(10_000);
    v.shrink_to_fit();
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    drop(v);
    assert_eq!(pool.live_blocks(), 0);
}

#[test]
fn over_aligned_small_blocks_cost_about_their_alignment() {
    let _g = serial();
    let bed = default_bed();
    let pool = Pool::with_config(
        &bed.a.pd,
        ArenaConfig {
            reserve: 1 << 34,
            chunk: 1 << 28,
            hugepages: Hugepages::Off,
            purge_delay: None,
            ..Default::default()
        },
    )
    .unwrap();
    // 1000 × 64 B at 128 KiB alignment used to take a 2 MiB slab each (2 GiB).
    let held: Vec<*mut u8> = (0..1000)
        .map(|_| {
            let p = pool.alloc(l(64, 128 << 10));
            assert_eq!(p as usize % (128 << 10), 0);
            fill(p, 64, 9);
            p
        })
        .collect();
    let committed = pool.stats().alloc.arena.committed_bytes;
    // The heap's first page of the class holds one block: it cuts a slab of such pages.
    assert!(
        committed <= 1000 * (128 << 10) + (8 << 20),
        "{} MiB for 1000 blocks at 128 KiB alignment",
        committed >> 20
    );
    for align in [4096, 64 << 10, 256 << 10, 1 << 20] {
        let p = pool.alloc(l(100, align));
        assert_eq!(p as usize % align, 0);
        assert!(pool.usable_size(p).unwrap() <= align.max(4096), "{align}");
        // SAFETY: a live block with this layout.
        unsafe { pool.free_sized(p, l(100, align)) };
    }
    // Beyond 1 MiB alignment a block is a slab run, aligned as asked.
    let big = pool.alloc(l(100, 4 << 20));
    assert_eq!(big as usize % (4 << 20), 0);
    // SAFETY: live blocks, freed once.
    unsafe {
        pool.free(big);
        for p in held {
            pool.free_sized(p, l(64, 128 << 10));
        }
    }
    assert_eq!(pool.live_blocks(), 0);
}

#[test]
fn each_size_goes_to_its_kind_of_block() {
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let small = pool.alloc(l(64 << 10, 8));
    assert_eq!(pool.usable_size(small), Some(64 << 10));
    let medium = pool.alloc(l((64 << 10) + 1, 8));
    assert_eq!(pool.usable_size(medium), Some(72 << 10));
    let aligned = pool.alloc(l(100, 4096));
    assert_eq!(aligned as usize % 4096, 0);
    assert_eq!(pool.usable_size(aligned), Some(4096));
    // SAFETY: the block is live and 64 KiB + 1 long.
    let sge = pool
        .sge_of(unsafe { std::slice::from_raw_parts(medium, 1000) })
        .unwrap();
    assert_eq!((sge.addr, sge.length), (medium as u64, 1000));
    assert_eq!(sge.lkey, pool.keys_of(medium).unwrap().lkey);
    let big = pool.alloc(l((1 << 20) + 1, 8));
    // Memory-checker mode keeps a guard page after a large run, outside its usable bytes.
    let guard = rdma_pool::alloc::LARGE_GUARD;
    assert_eq!(pool.usable_size(big), Some((2 << 20) - guard));
    assert_eq!(pool.stats().alloc.large_allocated_bytes, 2 << 20);
    assert!(format!("{pool:?}").starts_with("Pool"));
    assert_eq!(pool.live_blocks(), 4);
    for p in [small, medium, aligned, big] {
        // SAFETY: live blocks, freed once.
        unsafe { pool.free(p) };
    }
    assert_eq!(pool.live_blocks(), 0);
}
