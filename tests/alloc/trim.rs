//! Trims asked of live threads: `purge()` asks every other thread, the purge clock asks a
//! quiet one (no free for the purge delay), to give back its cached blocks and empty pages;
//! the thread does it at its next call, and nobody touches its cache before.

use super::purge::{clock_pool_sharing, wait_for};
use super::*;
use rdma_pool::PoolStats;
use rdma_pool::arena::Registration;
use std::alloc::Layout;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

/// Blocks in threads' caches, over all classes.
fn cached(s: &PoolStats) -> u64 {
    s.classes.iter().map(|c| c.thread_cached).sum()
}

/// Pages held by threads for the classes of `sizes`.
fn pages_of(s: &PoolStats, sizes: &[usize]) -> u64 {
    sizes
        .iter()
        .map(|&n| {
            let c = s.classes.iter().find(|c| c.block_size >= n as u64).unwrap();
            c.pages
        })
        .sum()
}

const SIZES: [usize; 4] = [64, 256, 1024, 4096];

/// The worker: fills its cache (16 blocks of each size freed), says so, then on each `go`
/// makes one call (a 64-byte pair: the free is its tick) and says so; returns on hang-up.
fn worker(pool: &Pool, go: Receiver<()>, done: Sender<()>) {
    for n in SIZES {
        let l = Layout::from_size_align(n, 8).unwrap();
        let ps: Vec<_> = (0..16).map(|_| pool.alloc(l)).collect();
        for p in ps {
            assert!(!p.is_null());
            // SAFETY: blocks of `pool` with `l`, freed once.
            unsafe { pool.free_sized(p, l) };
        }
    }
    done.send(()).unwrap();
    let l = Layout::from_size_align(64, 8).unwrap();
    while go.recv().is_ok() {
        let p = pool.alloc(l);
        // SAFETY: as above.
        unsafe { pool.free_sized(p, l) };
        done.send(()).unwrap();
    }
}

/// Runs [`worker`] on a thread of `pool` and hands `test` the stats once the worker's cache is
/// filled, and a call that has the worker make its one call.
fn with_worker(pool: &Pool, test: impl FnOnce(&PoolStats, &dyn Fn())) {
    let (go_tx, go_rx) = channel();
    let (done_tx, done_rx) = channel();
    std::thread::scope(|s| {
        s.spawn(|| worker(pool, go_rx, done_tx));
        done_rx.recv().unwrap();
        let before = pool.stats().alloc;
        assert!(cached(&before) >= 48, "{before:?}");
        assert!(pages_of(&before, &SIZES[1..]) > 0);
        test(&before, &|| {
            go_tx.send(()).unwrap();
            done_rx.recv().unwrap();
        });
        drop(go_tx);
    });
    assert!(pool.validate());
}

/// After its one call the worker has trimmed once: the block of that call may be cached again,
/// nothing else is, and its pages of the other sizes are gone.
fn assert_trimmed(pool: &Pool, before: &PoolStats) -> PoolStats {
    let after = pool.stats().alloc;
    assert_eq!(after.trims, before.trims + 1);
    assert!(cached(&after) <= 1, "{after:?}");
    assert_eq!(pages_of(&after, &SIZES[1..]), 0, "{after:?}");
    after
}

/// Free a run of 1.5 MiB: it puts a purge on the clock.
fn free_a_run(pool: &Pool) {
    let large = Layout::from_size_align(3 << 19, 4096).unwrap();
    let l = pool.alloc(large);
    // SAFETY: a block of the pool, freed once.
    unsafe { pool.free_sized(l, large) };
}

#[test]
fn purge_asks_other_threads_to_give_back_their_caches_at_their_next_call() {
    let _g = serial();
    let bed = bed();
    let pool = clock_pool_sharing(&bed.a.pd, None, Registration::Pinned, false, false);
    with_worker(&pool, |before, call| {
        pool.purge();
        let asked = pool.stats().alloc;
        assert_eq!(asked.trims_requested, before.trims_requested + 1);
        // Nobody but the owner touches its cache.
        assert_eq!(asked.trims, before.trims);
        assert_eq!(cached(&asked), cached(before));
        // A second purge before the thread called asks nothing more.
        pool.purge();
        assert_eq!(pool.stats().alloc.trims_requested, asked.trims_requested);
        call();
        let after = assert_trimmed(&pool, before);
        assert!(after.empty_pages > before.empty_pages);
    });
}

#[test]
fn the_clock_asks_a_quiet_thread_to_trim() {
    let _g = serial();
    let bed = bed();
    let pool = clock_pool_sharing(
        &bed.a.pd,
        Some(Duration::from_millis(30)),
        Registration::Pinned,
        true,
        false,
    );
    with_worker(&pool, |before, call| {
        // A freed run puts a purge on the clock; its looks find the worker quiet.
        free_a_run(&pool);
        assert!(
            wait_for(&pool, 10, |s| s.trims_requested > before.trims_requested),
            "{:?}",
            pool.stats().alloc
        );
        assert_eq!(pool.stats().alloc.trims, before.trims);
        call();
        assert_trimmed(&pool, before);
    });
}

#[test]
fn a_busy_thread_is_not_asked_by_the_clock() {
    let _g = serial();
    let bed = bed();
    let pool = clock_pool_sharing(
        &bed.a.pd,
        Some(Duration::from_millis(30)),
        Registration::Pinned,
        true,
        false,
    );
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let l = Layout::from_size_align(64, 8).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let p = pool.alloc(l);
                // SAFETY: a block of the pool, freed once.
                unsafe { pool.free_sized(p, l) };
            }
        });
        // Runs freed now and then keep purges (and the clock's looks) coming.
        let passes = pool.stats().alloc.purge_passes;
        for _ in 0..40 {
            free_a_run(&pool);
            std::thread::sleep(Duration::from_millis(40));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let s = pool.stats().alloc;
        let looks = s.purge_passes - passes;
        assert!(looks >= 8, "{s:?}");
        // Two looks may meet the same tick count by chance (one in 4096), or a thread the
        // machine did not run for the delay: a few asks at most, not one a look.
        assert!(s.trims_requested * 4 <= looks, "{s:?}");
    });
    assert!(pool.validate());
}
