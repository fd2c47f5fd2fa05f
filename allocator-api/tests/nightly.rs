//! `std` collections on the nightly `Allocator`: `Vec::new_in`, `Box::new_in`, growth,
//! zeroed growth, shrinking, over-aligned values — all registered memory.
#![feature(allocator_api)]

use rdma_pool::arena::{ArenaConfig, Hugepages};
use rdma_pool::nic::Nic;
use rdma_pool_allocator_api::Pool;

fn pool() -> (Nic, Pool) {
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let cfg = ArenaConfig {
        reserve: 1 << 34,
        hugepages: Hugepages::Off,
        ..Default::default()
    };
    let pool = Pool::with_config(&pd, cfg).unwrap();
    (nic, pool)
}

#[test]
fn std_vec_and_box_live_in_registered_memory() {
    let (_nic, pool) = pool();
    let mut v: Vec<u32, &Pool> = Vec::new_in(&pool);
    for i in 0..500_000u32 {
        v.push(i);
    }
    assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32));
    let k = pool.keys_of(v.as_ptr().cast()).unwrap();
    assert!(k.contains(v.as_ptr() as usize, v.len() * 4));
    v.truncate(3);
    v.shrink_to_fit();
    assert_eq!(&v[..], &[0, 1, 2]);

    let b = Box::new_in([7u64; 64], &pool);
    assert!(pool.keys_of(b.as_ptr().cast()).is_some());
    assert_eq!(b.iter().sum::<u64>(), 7 * 64);

    #[repr(align(4096))]
    struct Page([u8; 4096]);
    let page = Box::new_in(Page([1; 4096]), &pool);
    assert_eq!(&*page as *const Page as usize % 4096, 0);
    assert_eq!(page.0[4095], 1);

    let z: Vec<u8, &Pool> = {
        let mut z = Vec::with_capacity_in(10, &pool);
        z.resize(200_000, 0);
        z
    };
    assert!(z.iter().all(|&x| x == 0));
    drop((v, b, page, z));
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}
