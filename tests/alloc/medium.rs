//! Medium blocks (64 KiB – 1 MiB): 8 KiB slots, grown and shrunk in place while the
//! neighbouring slots are free, moved (contents kept) when they are not.

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

#[test]
fn medium_blocks_resize_in_place_while_neighbours_are_free() {
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let l = |n| Layout::from_size_align(n, 8).unwrap();
    let p = pool.alloc(l(100 << 10));
    let usable = pool.usable_size(p).unwrap();
    assert_eq!(usable % (8 << 10), 0);
    assert!(
        usable >= 100 << 10 && usable - (100 << 10) <= (100 << 10) / 8,
        "{usable}"
    );
    fill(p, 100 << 10, 1);
    // SAFETY: `p` is live with that layout.
    let p2 = unsafe { pool.realloc(p, l(100 << 10), 600 << 10) };
    assert_eq!(p2, p, "grown in place");
    assert!(all(p2, 100 << 10, 1));
    let q = pool.alloc(l(90 << 10));
    assert_eq!(
        q as usize,
        p as usize + (600 << 10),
        "first fit right after it"
    );
    fill(q, 90 << 10, 2);
    // SAFETY: as above.
    let p3 = unsafe { pool.realloc(p2, l(600 << 10), 300 << 10) };
    assert_eq!(p3, p, "shrunk in place");
    assert_eq!(pool.usable_size(p3), Some(304 << 10));
    // SAFETY: as above.
    let p4 = unsafe { pool.realloc(p3, l(300 << 10), 1 << 20) };
    assert_ne!(p4, p, "`q` is in the way: moved");
    assert!(all(p4, 100 << 10, 1), "contents kept across the move");
    assert!(all(q, 90 << 10, 2), "the neighbour is untouched");
    let k = pool.keys_of(p4).unwrap();
    assert!(
        k.contains(p4 as usize, 1 << 20),
        "a medium block lies in one registration"
    );
    // SAFETY: live blocks, freed once.
    unsafe {
        pool.free(p4);
        pool.free_sized(q, l(90 << 10));
    }
    assert_eq!(pool.stats().medium_allocated_bytes, 0);
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn each_size_goes_to_its_kind_of_block() {
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let l = |n, a| Layout::from_size_align(n, a).unwrap();
    // The largest size-class block and the smallest medium one.
    let small = pool.alloc(l(64 << 10, 8));
    assert_eq!(pool.usable_size(small), Some(64 << 10));
    assert_eq!(pool.stats().medium_allocated_bytes, 0);
    let medium = pool.alloc(l((64 << 10) + 1, 8));
    assert_eq!(pool.usable_size(medium), Some(72 << 10));
    assert_eq!(pool.stats().medium_allocated_bytes, 72 << 10);
    // Over-aligned small blocks still come from size classes, not slab runs.
    let aligned = pool.alloc(l(100, 4096));
    assert_eq!(aligned as usize % 4096, 0);
    assert_eq!(pool.usable_size(aligned), Some(4096));
    assert_eq!(
        pool.usable_size(medium.wrapping_add(8 << 10)),
        None,
        "not a block start"
    );
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
    assert_eq!(pool.stats().large_allocated_bytes, 2 << 20);
    assert!(format!("{pool:?}").starts_with("Pool"));
    assert_eq!(pool.live_blocks(), 4);
    for p in [small, medium, aligned, big] {
        // SAFETY: live blocks, freed once.
        unsafe { pool.free(p) };
    }
    assert_eq!(pool.live_blocks(), 0);
}
