//! Pages smaller than 64 KiB: a thread's first four pages of a class of blocks up to 1 KiB are
//! 4 KiB granules (so a thread holding a few blocks of many classes commits — and in pinned
//! mode pins — 4 KiB per class, not 64 KiB, and up to 16 KiB of a class on 4 KiB pages, not
//! 4 KiB + 64 KiB), and free pages inside a slab still in use go
//! back to the system on a purge in an ODP pool (a few live blocks keep their own 4 KiB
//! pages, not the slab of pages freed around them), never in a pinned one (nor under the
//! `memcheck` feature, whose fill of freed blocks is what it checks).

use super::*;
use rdma_pool::arena::{Registration, SLAB};
use std::alloc::Layout;
use std::sync::Barrier;

fn pool_with(pd: &Pd, registration: Registration) -> Pool {
    Pool::with_config(
        pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            registration,
            purge_delay: None,
            // A thread's own pages are what these tests look at.
            shared_bytes: 0,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Sizes of eight classes up to 1 KiB.
const SIZES: [usize; 8] = [16, 48, 96, 160, 256, 384, 640, 1024];

/// 64-byte blocks a heap's four 4 KiB first pages of the class hold.
const FIRST: usize = 4 * 64;

#[test]
fn threads_holding_a_few_small_blocks_of_many_classes_pin_4_kib_pages() {
    // 32 threads × 8 classes × 4 KiB = 1 MiB of pages: one slab of 4 KiB pages. With 64 KiB
    // first pages it was 16 MiB (eight slabs), all pinned.
    let grew = committed_by_threads_holding(|_| 3);
    assert!(grew <= 2 * SLAB as u64, "committed {} KiB", grew >> 10);
}

#[test]
fn threads_holding_8_kib_of_each_class_stay_on_4_kib_pages() {
    // 8 KiB of each class: two or three 4 KiB pages a class, 3 MiB of pages for 32 threads ×
    // 8 classes (two slabs). With one 4 KiB page and then 64 KiB ones it was 17 MiB.
    let grew = committed_by_threads_holding(|n| (8 << 10) / n);
    assert!(grew <= 2 * SLAB as u64, "committed {} KiB", grew >> 10);
}

/// What 32 threads of a pinned pool commit while each holds `count(n)` blocks of `n` bytes of
/// every size in [`SIZES`]; the blocks are written, checked and freed afterwards.
fn committed_by_threads_holding(count: impl Fn(usize) -> usize + Sync) -> u64 {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = pool_with(&pd, Registration::Pinned);
    const THREADS: usize = 32;
    let held = Barrier::new(THREADS + 1);
    let done = Barrier::new(THREADS + 1);
    let one_at_a_time = std::sync::Mutex::new(());
    let before = pool.stats().alloc.arena.committed_bytes;
    let grew = std::thread::scope(|s| {
        let mut threads = Vec::new();
        for t in 0..THREADS {
            let (held, done, one_at_a_time, pool, count) =
                (&held, &done, &one_at_a_time, &pool, &count);
            threads.push(s.spawn(move || {
                // One thread allocates at a time: what is measured is each thread's pages,
                // not how many slabs threads racing for an empty list cut.
                let turn = one_at_a_time.lock().unwrap();
                let blocks: Vec<(*mut u8, Layout)> = SIZES
                    .iter()
                    .flat_map(|&n| {
                        let l = Layout::from_size_align(n, 8).unwrap();
                        (0..count(n)).map(move |_| (pool.alloc(l), l))
                    })
                    .collect();
                drop(turn);
                for (i, &(p, l)) in blocks.iter().enumerate() {
                    assert!(!p.is_null());
                    // SAFETY: a fresh block of `l.size()` bytes.
                    unsafe { p.write_bytes(pattern(t as u64, i), l.size()) };
                }
                held.wait();
                done.wait();
                for (i, &(p, l)) in blocks.iter().enumerate() {
                    // SAFETY: the block written above, still live.
                    let b = unsafe { std::slice::from_raw_parts(p, l.size()) };
                    assert!(b.iter().all(|&x| x == pattern(t as u64, i)));
                    // SAFETY: a block of `pool` with `l`, freed once.
                    unsafe { pool.free_sized(p, l) };
                }
            }));
        }
        held.wait();
        let grew = pool.stats().alloc.arena.committed_bytes - before;
        done.wait();
        for t in threads {
            t.join().unwrap();
        }
        grew
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
    grew
}

/// Whether every 4 KiB page of `[addr, addr + len)` is resident.
fn resident_pages(addr: usize, len: usize) -> usize {
    let mut v = vec![0u8; len / 4096];
    // SAFETY: a mapped range of the pool's (page-aligned), and a vector of one byte per page.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) };
    assert_eq!(r, 0);
    v.iter().filter(|&&b| b & 1 != 0).count()
}

#[test]
fn free_pages_of_a_slab_in_use_go_back_on_a_purge_in_an_odp_pool_only() {
    let pd = Nic::soft().alloc_pd().unwrap();
    for registration in [Registration::Odp, Registration::Pinned] {
        let pool = pool_with(&pd, registration);
        let l = Layout::from_size_align(64, 8).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                // Four 4 KiB pages (64 blocks each), then 64 KiB pages of 1024 blocks: four of
                // them, filled.
                let blocks: Vec<*mut u8> = (0..FIRST + 4 * 1024).map(|_| pool.alloc(l)).collect();
                for &p in &blocks {
                    assert!(!p.is_null());
                    // SAFETY: a fresh block of 64 bytes.
                    unsafe { p.write_bytes(0x5a, 64) };
                }
                let page = |k: usize| blocks[FIRST + k * 1024] as usize & !((64 << 10) - 1);
                let pages: Vec<usize> = (0..4).map(page).collect();
                // The first 64 KiB page keeps one block; the other three empty.
                let keep = blocks[FIRST + 5];
                for &p in &blocks {
                    if p != keep {
                        // SAFETY: a block of `pool`, freed once.
                        unsafe { pool.free_sized(p, l) };
                    }
                }
                let before = pool.stats().alloc.discarded_bytes;
                let resident_before: usize = pages[1..]
                    .iter()
                    .map(|&a| resident_pages(a, 64 << 10))
                    .sum();
                assert_eq!(resident_before, 3 * 16, "{registration:?}");
                pool.purge();
                let gone = pool.stats().alloc.discarded_bytes - before;
                let resident: usize = pages[1..]
                    .iter()
                    .map(|&a| resident_pages(a, 64 << 10))
                    .sum();
                // The memory checker's builds keep freed pages as they are (their fill is
                // what it checks): nothing is given back there.
                let step = |a: usize| a / STEP_BYTES;
                if cfg!(feature = "memcheck") {
                    assert_eq!(gone, 0, "the memory checker keeps freed pages");
                    assert_eq!(resident, 3 * 16);
                } else if registration == Registration::Odp {
                    assert!(gone >= 3 * (64 << 10), "{gone} bytes given back");
                    assert_eq!(resident, 0, "the empty pages went back");
                } else {
                    // Pinned: an empty page goes back with its step, region first, unless a
                    // live block shares the step (its region pins it whole).
                    let mut freed: Vec<usize> = pages[1..]
                        .iter()
                        .map(|&a| step(a))
                        .filter(|&s| s != step(keep as usize))
                        .collect();
                    freed.sort_unstable();
                    freed.dedup();
                    assert!(gone >= (freed.len() * STEP_BYTES) as u64, "{gone}");
                    for &a in &pages[1..] {
                        let kept = step(a) == step(keep as usize);
                        assert_eq!(resident_pages(a, 64 << 10), if kept { 16 } else { 0 });
                    }
                    assert!(pool.keys_of(keep).is_some_and(|k| k.len == STEP_BYTES));
                }
                // The live block is intact, and the pages serve again: zeroed blocks read zero,
                // written ones hold what was written.
                // SAFETY: the live block, 64 bytes.
                let kept = unsafe { std::slice::from_raw_parts(keep, 64) };
                assert!(kept.iter().all(|&b| b == 0x5a));
                let again: Vec<*mut u8> = (0..4 * 1024).map(|_| pool.alloc_zeroed(l)).collect();
                for &p in &again {
                    assert!(!p.is_null());
                    // SAFETY: a fresh zeroed block of 64 bytes.
                    let b = unsafe { std::slice::from_raw_parts(p, 64) };
                    assert!(b.iter().all(|&x| x == 0), "{registration:?}");
                    // SAFETY: as above.
                    unsafe { p.write_bytes(0xc3, 64) };
                }
                for &p in &again {
                    // SAFETY: the block written above.
                    let b = unsafe { std::slice::from_raw_parts(p, 64) };
                    assert!(b.iter().all(|&x| x == 0xc3));
                    // SAFETY: a block of `pool`, freed once.
                    unsafe { pool.free_sized(p, l) };
                }
                // SAFETY: as above.
                unsafe { pool.free_sized(keep, l) };
            })
            .join()
            .unwrap();
        });
        assert_eq!(pool.live_blocks(), 0);
        assert!(pool.validate());
    }
}
