//! allocator-api2 collections on a `Pool`: `Vec` and hashbrown's `HashMap`.

use super::*;
use allocator_api2::vec::Vec as PVec;
use hashbrown::HashMap;

#[test]
fn vec_grows_shrinks_and_stays_registered() {
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let mut v: PVec<u64, &Pool> = PVec::new_in(&pool);
    for i in 0..300_000u64 {
        v.push(i * 3);
        if i.is_power_of_two() {
            let k = pool.keys_of(v.as_ptr().cast()).unwrap();
            assert!(
                k.contains(v.as_ptr() as usize, v.capacity() * 8),
                "straddles at {i}"
            );
        }
    }
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 3));
    v.truncate(10);
    v.shrink_to_fit();
    assert_eq!(&v[..3], &[0, 3, 6]);
    let z: PVec<u8, &Pool> = allocator_api2::vec::from_elem_in(0u8, 100_000, &pool);
    assert!(z.iter().all(|&b| b == 0));
    drop((v, z));
    assert_eq!(pool.live_blocks(), 0);
}

#[test]
fn hashbrown_map_on_a_pool() {
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let mut m: HashMap<u64, PVec<u8, &Pool>, _, &Pool> =
        HashMap::with_hasher_in(hashbrown::DefaultHashBuilder::default(), &pool);
    for i in 0..20_000u64 {
        let mut buf = PVec::with_capacity_in((i % 300) as usize + 1, &pool);
        buf.resize((i % 300) as usize + 1, i as u8);
        m.insert(i, buf);
    }
    for i in (0..20_000u64).step_by(2) {
        m.remove(&i);
    }
    assert_eq!(m.len(), 10_000);
    for (k, v) in &m {
        assert!(v.iter().all(|&b| b == *k as u8));
        assert!(pool.sge_of(v).is_ok());
    }
    drop(m);
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

/// A block allocated over-aligned and resized to a small alignment moves when its class would
/// not be the one a sized free with the new layout finds; a block grown to a larger alignment
/// is aligned for it (found by a hostile review of the fast paths).
#[test]
fn resizing_to_another_alignment_keeps_classes_and_alignment() {
    use std::alloc::Layout;
    let _g = serial();
    let bed = default_bed();
    let pool = pool_on(&bed.a.pd, Access::empty());
    let big = Layout::from_size_align(8, 4096).unwrap();
    let small = Layout::from_size_align(8, 8).unwrap();
    let p = pool.alloc(big);
    // SAFETY: `p` has `big`; the result has `small`.
    let q = unsafe { pool.resize(p, big, small) };
    assert!(!q.is_null());
    assert_ne!(
        q, p,
        "a 4 KiB-class block must not be freed as an 8-byte one"
    );
    // SAFETY: `q` has `small`.
    unsafe { pool.free_sized(q, small) };
    let r = pool.alloc(small);
    assert_ne!(r, p, "the 4 KiB block serves no 8-byte request");
    // SAFETY: `r` has `small`.
    unsafe { pool.free_sized(r, small) };
    assert_eq!(pool.live_blocks(), 0);
    for c in &pool.stats().alloc.classes {
        assert_eq!(c.allocated, 0, "{c:?}");
    }
    // Growing to a larger alignment: every result is aligned for it, whatever the first
    // block's address happened to be.
    for size in [8usize, 24, 100, 1000, 5000] {
        for _ in 0..64 {
            let a = Layout::from_size_align(size, 8).unwrap();
            let b = Layout::from_size_align(size * 3, 256).unwrap();
            let p = pool.alloc(a);
            // SAFETY: `p` has `a`; the result has `b`.
            let q = unsafe { pool.resize(p, a, b) };
            assert_eq!(q as usize % 256, 0, "size {size}");
            // SAFETY: `q` has `b`.
            unsafe { pool.free_sized(q, b) };
        }
    }
    assert!(pool.validate());
}
