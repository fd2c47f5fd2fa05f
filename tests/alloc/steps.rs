//! Pinned steps: a pinned pool registers its slabs of small pages a 256 KiB step at a time, as
//! their pages are used, and gives a step back — region first — once every page in it is free.

use super::*;
use rdma_pool::arena::{Registration, RegistrationPolicy};
use std::alloc::Layout;
use std::collections::BTreeSet;
use std::time::Duration;

/// A pinned pool on `pd` on 4 KiB pages (its slabs of small pages registered in steps) with
/// `policy`, purging after `delay` (`None`: on request only).
pub(super) fn stepped_pool(pd: &Pd, delay: Option<Duration>, policy: RegistrationPolicy) -> Pool {
    Pool::with_config(
        pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            registration: Registration::Pinned,
            policy,
            purge_delay: delay,
            // A thread's own pages are what these tests look at.
            shared_bytes: 0,
            ..Default::default()
        },
    )
    .unwrap()
}

/// [`stepped_pool`] purging on request, degrading what it cannot register.
pub(super) fn pinned_pool(pd: &Pd) -> Pool {
    stepped_pool(pd, None, RegistrationPolicy::Degrade)
}

pub(super) fn step(p: *const u8) -> usize {
    p as usize / STEP_BYTES
}

/// 2 KiB blocks: 64 KiB pages of 32 blocks, four pages a step (once a thread holds its first
/// pages of the class: [`warm`]).
pub(super) const BLOCK: usize = 2 << 10;

/// What [`warm`] holds: `(block, its layout)`.
pub(super) struct Warm(Vec<(usize, Layout)>);

/// Warm the calling thread up so that its next `BLOCK`-sized block takes a dense page (64 KiB:
/// 32 blocks, four pages a step) whose step is the next registration: a first block of
/// another class, and the `BLOCK` class's first pages (4 KiB pages of two blocks), on 4 KiB
/// pages of a slab of their own ([`Warm::steps`]). Keep it until [`cool`].
pub(super) fn warm(pool: &Pool) -> Warm {
    let small = Layout::from_size_align(16, 8).unwrap();
    let l = Layout::from_size_align(BLOCK, 8).unwrap();
    let mut held = vec![(pool.alloc(small) as usize, small)];
    held.extend((0..8).map(|_| (pool.alloc(l) as usize, l)));
    for &(p, l) in &held {
        assert_ne!(p, 0);
        let k = pool.keys_of(p as *const u8).expect("registered");
        assert!(k.contains(p, l.size()));
    }
    Warm(held)
}

impl Warm {
    /// The steps the warm-up blocks lie in.
    pub(super) fn steps(&self) -> BTreeSet<usize> {
        self.0.iter().map(|&(p, _)| step(p as *const u8)).collect()
    }
}

/// Free what [`warm`] holds.
pub(super) fn cool(pool: &Pool, w: Warm) {
    for (p, l) in w.0 {
        // SAFETY: a block of `pool` with `l`, freed once.
        unsafe { pool.free_sized(p as *mut u8, l) };
    }
}

#[test]
fn a_free_step_goes_back_region_first_and_comes_back_registered_anew() {
    let nic = Nic::soft();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = pinned_pool(&pd);
    let l = Layout::from_size_align(BLOCK, 8).unwrap();
    // One thread of its own: the test harness's thread holds nothing of the pool.
    std::thread::scope(|s| {
        s.spawn(|| {
            let w = warm(&pool);
            let warm = w.steps().len();
            let blocks: Vec<*mut u8> = (0..512).map(|_| pool.alloc(l)).collect();
            for (i, &p) in blocks.iter().enumerate() {
                assert!(!p.is_null());
                // SAFETY: a fresh block of BLOCK bytes.
                unsafe { p.write_bytes((i as u8).wrapping_add(1), BLOCK) };
            }
            let steps: BTreeSet<usize> = blocks.iter().map(|&p| step(p)).collect();
            assert!(
                steps.len() >= 4,
                "1 MiB of blocks spans at least four steps"
            );
            assert!(steps.is_disjoint(&w.steps()));
            let stats = pool.stats().alloc.arena;
            assert_eq!(stats.step_regions, (steps.len() + warm) as u64, "{stats:?}");
            assert_eq!(
                soft.pinned_bytes(),
                ((steps.len() + warm) * STEP_BYTES) as u64
            );
            let keys: Vec<_> = blocks.iter().map(|&p| pool.keys_of(p).unwrap()).collect();
            for (k, &p) in keys.iter().zip(&blocks) {
                assert_eq!(k.len, STEP_BYTES);
                assert!(k.contains(p as usize, BLOCK), "no block crosses a step");
            }
            // Keep one block; free the rest: every other step is wholly free.
            let keep = blocks[0];
            for &p in &blocks[1..] {
                // SAFETY: a block of `pool`, freed once.
                unsafe { pool.free_sized(p, l) };
            }
            pool.purge();
            let stats = pool.stats().alloc.arena;
            if cfg!(feature = "memcheck") {
                // The memory checker keeps freed pages as they are (their fill is what it
                // checks): no step goes back while its slab is in use.
                assert_eq!(stats.step_regions, (steps.len() + warm) as u64, "{stats:?}");
                for &p in &blocks[1..] {
                    assert!(pool.keys_of(p).is_some_and(|k| k.len == STEP_BYTES));
                }
                // SAFETY: a block of `pool`, freed once.
                unsafe { pool.free_sized(keep, l) };
                cool(&pool, w);
                return;
            }
            assert_eq!(stats.step_regions, 1 + warm as u64, "{stats:?}");
            assert_eq!(
                soft.pinned_bytes(),
                ((1 + warm) * STEP_BYTES) as u64,
                "only the kept block's step, and the warm-up's"
            );
            assert!(pool.stats().alloc.discarded_bytes >= ((steps.len() - 1) * STEP_BYTES) as u64);
            // The kept block, its keys and its bytes are as they were; memory of a step that
            // went has no keys (its region is gone: an old key reaches nothing).
            assert_eq!(pool.keys_of(keep), Some(keys[0]));
            // SAFETY: the live block.
            assert!(
                unsafe { std::slice::from_raw_parts(keep, BLOCK) }
                    .iter()
                    .all(|&b| b == 1)
            );
            let gone = blocks.iter().position(|&p| step(p) != step(keep)).unwrap();
            assert_eq!(pool.keys_of(blocks[gone]), None);
            // Used again: zero, registered anew, pinned again.
            let again: Vec<*mut u8> = (0..511).map(|_| pool.alloc_zeroed(l)).collect();
            for &p in &again {
                assert!(!p.is_null());
                // SAFETY: a fresh zeroed block.
                let b = unsafe { std::slice::from_raw_parts(p, BLOCK) };
                assert!(b.iter().all(|&x| x == 0));
                let k = pool.keys_of(p).unwrap();
                assert!(k.contains(p as usize, BLOCK));
                assert_eq!(k.len, STEP_BYTES);
            }
            let back: BTreeSet<usize> = again.iter().chain([&keep]).map(|&p| step(p)).collect();
            assert_eq!(
                pool.stats().alloc.arena.step_regions,
                (back.len() + warm) as u64
            );
            for &p in again.iter().chain([&keep]) {
                // SAFETY: a block of `pool`, freed once.
                unsafe { pool.free_sized(p, l) };
            }
            cool(&pool, w);
        })
        .join()
        .unwrap();
    });
    pool.purge();
    assert_eq!(soft.pinned_bytes(), 0, "everything went back");
    assert_eq!(pool.stats().alloc.arena.step_regions, 0);
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn threads_using_and_freeing_steps_while_another_thread_purges_lose_nothing() {
    let nic = Nic::soft();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = pinned_pool(&pd);
    let sizes = [
        16usize,
        200,
        1024,
        2048,
        8 << 10,
        40 << 10,
        100 << 10,
        200 << 10,
    ];
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                pool.purge();
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..8)
            .map(|t| {
                let pool = &pool;
                s.spawn(move || {
                    // Twelve rounds (three in the emulated guest: `common::scaled`).
                    for round in 0..common::scaled(12).max(3) {
                        let held: Vec<(*mut u8, Layout, u8)> = (0..64)
                            .map(|i| {
                                let n = sizes[(i + t + round) % sizes.len()];
                                let l = Layout::from_size_align(n, 8).unwrap();
                                let p = pool.alloc(l);
                                assert!(!p.is_null());
                                let k = pool.keys_of(p).expect("a pinned block has keys");
                                assert!(k.contains(p as usize, n), "{n} bytes in one region");
                                let v = (t * 31 + round * 7 + i) as u8;
                                // SAFETY: a fresh block of `n` bytes.
                                unsafe { p.write_bytes(v, n) };
                                (p, l, v)
                            })
                            .collect();
                        for &(p, l, v) in &held {
                            // SAFETY: the block written above.
                            let b = unsafe { std::slice::from_raw_parts(p, l.size()) };
                            assert!(b.iter().all(|&x| x == v), "a live block changed");
                            // SAFETY: a block of `pool`, freed once.
                            unsafe { pool.free_sized(p, l) };
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    pool.purge();
    assert_eq!(pool.live_blocks(), 0);
    // Every step went back; what stays pinned is whole-slab regions (pages of more than a
    // step) a refused purge kept: an exposed region that covered live memory then.
    let arena = pool.stats().alloc.arena;
    assert_eq!(arena.step_regions, 0, "{arena:?}");
    assert_eq!(soft.pinned_bytes(), arena.registered_bytes, "{arena:?}");
    assert!(pool.validate());
}

#[test]
fn a_free_step_goes_back_on_the_clock_while_the_program_makes_no_call() {
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let pool = stepped_pool(
        &pd,
        Some(Duration::from_millis(30)),
        RegistrationPolicy::Degrade,
    );
    let l = Layout::from_size_align(BLOCK, 8).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let blocks: Vec<*mut u8> = (0..512).map(|_| pool.alloc(l)).collect();
            assert!(blocks.iter().all(|p| !p.is_null()));
            let steps: BTreeSet<usize> = blocks.iter().map(|&p| step(p)).collect();
            assert!(steps.len() >= 4);
            for &p in &blocks[1..] {
                // SAFETY: a block of `pool`, freed once.
                unsafe { pool.free_sized(p, l) };
            }
            // No call into the pool from here but `stats()`, which purges nothing: the clock
            // finds the free steps, and gives them back a delay later. This thread's cache
            // keeps up to 32 KiB of the class (one page, one more step) until it trims.
            let t = std::time::Instant::now();
            let regions = || pool.stats().alloc.arena.step_regions;
            let checked = !cfg!(feature = "memcheck"); // which keeps freed pages as they are
            while checked && regions() > 2 && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if checked {
                assert!(regions() <= 2, "{:?}", pool.stats().alloc.arena);
            }
            assert!(
                pool.keys_of(blocks[0]).is_some(),
                "the kept block's step stays"
            );
            // SAFETY: a block of `pool`, freed once.
            unsafe { pool.free_sized(blocks[0], l) };
        })
        .join()
        .unwrap();
    });
    assert!(pool.validate());
}

/// A step goes back one purge delay after its last page came back, not one delay after a pass
/// first found it free: the heap that gives the page back stamps its step. Here a thread fills
/// steps of a slab and frees all but one block before it exits; the slab stays in use, and the
/// first due pass after the delay, made by a slow path (no clock), gives back every step but
/// the kept block's. Stamped only by that pass, they stayed registered for another delay.
#[test]
fn a_step_goes_back_one_delay_after_its_last_page_came_back() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let delay = Duration::from_millis(500);
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            registration: Registration::Pinned,
            policy: RegistrationPolicy::Degrade,
            purge_delay: Some(delay),
            purge_thread: false,
            // The thread's own pages, which its exit gives back (a shared heap's emptied pages
            // go back when a pass collects that heap).
            shared_bytes: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let l = Layout::from_size_align(BLOCK, 8).unwrap();
    // The last block lies in a dense page (the class's first pages are 4 KiB pages of a slab
    // of their own, which goes back whole): its slab stays in use.
    let kept = std::thread::scope(|s| {
        s.spawn(|| {
            let blocks: Vec<*mut u8> = (0..512).map(|_| pool.alloc(l)).collect();
            assert!(blocks.iter().all(|p| !p.is_null()));
            let steps: BTreeSet<usize> = blocks.iter().map(|&p| step(p)).collect();
            assert!(steps.len() >= 4, "{steps:?}");
            for &p in &blocks[..511] {
                // SAFETY: a block of `pool`, freed once.
                unsafe { pool.free_sized(p, l) };
            }
            blocks[511] as usize
        })
        .join()
        .unwrap()
    });
    let before = pool.stats().alloc;
    assert!(before.arena.step_regions >= 4, "{:?}", before.arena);
    std::thread::sleep(delay + Duration::from_millis(50));
    // One slow path (a large block's free), which runs the due pass.
    let big = Layout::from_size_align(8 << 20, 8).unwrap();
    let p = pool.alloc(big);
    assert!(!p.is_null());
    // SAFETY: a block of `pool` with `big`, freed once.
    unsafe { pool.free_sized(p, big) };
    let after = pool.stats().alloc;
    assert!(after.purge_passes > before.purge_passes, "{after:?}");
    // The thread's work took less than the delay (no pass ran before it exited, none while
    // this thread slept): the pass that ran found the steps free since their pages came back,
    // a delay ago. (memcheck keeps freed pages as they are: no step goes.)
    if before.purge_passes == 0 && !cfg!(feature = "memcheck") {
        assert_eq!(after.arena.step_regions, 1, "{:?}", after.arena);
    }
    assert!(
        pool.keys_of(kept as *const u8).is_some(),
        "the kept block's step stays"
    );
    // SAFETY: a block of `pool` with `l`, freed once.
    unsafe { pool.free_sized(kept as *mut u8, l) };
    assert!(pool.validate());
}
