//! The nightly wrapper of `GlobalPool` as this binary's `#[global_allocator]`, and `&GlobalPool`
//! as an explicit `Allocator`: `Vec::new_in`, `Box::new_in`, zero-size values, growth with a
//! new alignment — all registered memory, one pool.
#![feature(allocator_api)]

use rdma_pool_allocator_api::GlobalPool;
use std::alloc::Layout;

#[global_allocator]
static A: GlobalPool = GlobalPool::new();

#[test]
fn the_wrapper_is_the_global_allocator_and_an_allocator() {
    let plain = vec![3u8; 100_000];
    assert!(rdma_pool::keys_of(plain.as_ptr()).is_some());
    let mut v: Vec<u64, &GlobalPool> = Vec::new_in(&A);
    v.extend(0..200_000u64);
    let k = A.keys_of(v.as_ptr().cast()).expect("registered");
    assert!(k.contains(v.as_ptr() as usize, v.len() * 8));
    v.truncate(10);
    v.shrink_to_fit();
    assert_eq!(&v[..], &(0..10).collect::<Vec<u64>>()[..]);
    let b = Box::new_in([7u32; 1000], &A);
    assert!(rdma_pool::keys_of(b.as_ptr()).is_some());
    let unit = Box::new_in((), &A);
    assert_eq!(*unit, ());
    #[repr(align(4096))]
    struct Page([u8; 4096]);
    let page = Box::new_in(Page([1; 4096]), &A);
    assert_eq!(&*page as *const Page as usize % 4096, 0);
    assert!(rdma_pool::keys_of(page.0.as_ptr()).is_some());
    let s = A.stats();
    assert_eq!(s.degraded_allocations, 0);
    assert!(s.pool.is_some());
}

#[test]
fn grow_to_a_new_alignment_keeps_the_contents() {
    use std::alloc::Allocator;
    let old = Layout::from_size_align(24, 8).unwrap();
    let new = Layout::from_size_align(100_000, 4096).unwrap();
    let p = (&A).allocate(old).unwrap().cast::<u8>();
    // SAFETY: `p` is a live block of `old`; it is grown once and freed once with `new`.
    unsafe {
        p.as_ptr()
            .copy_from_nonoverlapping(b"twenty-four bytes here!!".as_ptr(), 24);
        let q = (&A).grow_zeroed(p, old, new).unwrap().cast::<u8>();
        assert_eq!(q.as_ptr() as usize % 4096, 0);
        let bytes = std::slice::from_raw_parts(q.as_ptr(), 100_000);
        assert_eq!(&bytes[..24], b"twenty-four bytes here!!");
        assert!(bytes[24..].iter().all(|&b| b == 0));
        (&A).deallocate(q, new);
    }
}
