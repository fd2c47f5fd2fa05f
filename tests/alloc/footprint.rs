//! What a thread keeps: its caches of freed blocks are bounded per class — at most 32 blocks
//! and no more than 32 KiB of a class (at least one block) — whatever it frees, by sized and
//! unsized frees alike.

use super::*;
use std::alloc::Layout;
use std::sync::Barrier;

#[test]
fn a_threads_caches_hold_at_most_32_kib_of_each_class() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = pool_on(&pd, Access::empty());
    let sizes = [
        16usize,
        64,
        256,
        1024,
        1280,
        2048,
        4096,
        8192,
        16 << 10,
        32 << 10,
    ];
    let freed = Barrier::new(2);
    let read = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            for (k, &size) in sizes.iter().enumerate() {
                let layout = Layout::from_size_align(size, 8).unwrap();
                let blocks: Vec<*mut u8> = (0..40).map(|_| pool.alloc(layout)).collect();
                assert!(blocks.iter().all(|p| !p.is_null()));
                for (i, &p) in blocks.iter().enumerate() {
                    // SAFETY: blocks of `pool` with `layout`, freed once; every other size
                    // by the unsized free.
                    unsafe {
                        if (i + k) % 2 == 0 {
                            pool.free_sized(p, layout);
                        } else {
                            pool.free(p);
                        }
                    }
                }
            }
            freed.wait();
            // Alive while the main thread reads what its caches hold.
            read.wait();
        });
        freed.wait();
        let stats = pool.stats().alloc;
        read.wait();
        let mut total = 0;
        for &size in &sizes {
            let c = stats
                .classes
                .iter()
                .find(|c| c.block_size as usize >= size)
                .unwrap();
            let bound = (32u64 << 10).div_ceil(c.block_size).clamp(1, 32);
            assert!(
                c.thread_cached >= 1 && c.thread_cached <= bound,
                "{size}-byte blocks: {} cached by the thread (bound {bound}): {c:?}",
                c.thread_cached
            );
            assert!(c.thread_cached * c.block_size <= 32 << 10 || c.thread_cached == 1);
            total += c.thread_cached * c.block_size;
        }
        assert!(
            total <= sizes.len() as u64 * (32 << 10),
            "{total} bytes cached"
        );
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}
