//! Memory comes back under real programs' shapes: pages emptied on one thread leave its heap
//! (whichever page was current when they emptied), so a purge returns them; a purge falls due
//! on fast-path churn alone; any number of threads get heaps, reused in O(1); a thread uses
//! several pools without losing its heaps.

use super::*;
use std::alloc::Layout;
use std::time::Duration;

/// A pool whose due purges run on its slow paths only (no purge clock: what these tests
/// check is the work the allocator's own calls do; the clock is tested in `purge.rs`).
fn reclaim_pool(pd: &Pd, delay: Option<Duration>) -> Pool {
    Pool::with_config(
        pd,
        ArenaConfig {
            reserve: 1 << 34,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            purge_delay: delay,
            purge_thread: false,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Allocate about `total` bytes in blocks of `size` on this thread, write them, free them all
/// in allocation order.
fn build_and_drop(pool: &Pool, size: usize, total: usize) {
    let layout = Layout::from_size_align(size, 8).unwrap();
    let blocks: Vec<*mut u8> = (0..total / size)
        .map(|i| {
            let p = pool.alloc(layout);
            assert!(!p.is_null(), "block {i} of {size} B");
            // SAFETY: a fresh block of `size` bytes.
            unsafe { std::ptr::write_bytes(p, i as u8, size) };
            p
        })
        .collect();
    for p in blocks {
        // SAFETY: each block came from this pool with `layout`, freed once.
        unsafe { pool.free_sized(p, layout) };
    }
}

#[test]
fn memory_freed_on_one_thread_comes_back_shape_after_shape() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = reclaim_pool(&pd, None);
    // 96 MiB of each shape; 24 MiB in the emulated guest (`common::scaled`): twice what may stay.
    let total = common::scaled(96 << 20).max(24 << 20);
    let mut after = Vec::new();
    // The shapes of the report: equal-size blocks, each shape after the other on one thread
    // (the page current when the last block of a page was freed used to stay in the heap).
    for size in [
        40 << 10,
        20 << 10,
        10 << 10,
        5000,
        64,
        40 << 10,
        300 << 10,
        24,
    ] {
        build_and_drop(&pool, size, total);
        pool.purge();
        let committed = pool.stats().alloc.arena.committed_bytes;
        after.push((size, committed >> 20));
        // What stays: at most a current page per class (up to 8 MiB for the largest classes)
        // and the slabs those pages share.
        assert!(
            committed <= 12 << 20,
            "{committed} bytes still committed after {size}-byte blocks were freed and purged \
             (history {after:?})"
        );
    }
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn a_due_purge_runs_on_fast_path_churn_alone() {
    let pd = Nic::soft().alloc_pd().unwrap();
    // A delay longer than building and dropping takes, even in the emulated rxe guest.
    let delay = Duration::from_millis(500);
    let pool = reclaim_pool(&pd, Some(delay));
    let start = std::time::Instant::now();
    build_and_drop(&pool, 4000, 64 << 20);
    let before = pool.stats().alloc.arena;
    let built_in = start.elapsed();
    std::thread::sleep(delay + Duration::from_millis(100));
    // Only the thread cache's fast path from here: one block allocated and freed again.
    let layout = Layout::new::<[u64; 4]>();
    for _ in 0..20_000 {
        let p = pool.alloc(layout);
        assert!(!p.is_null());
        // SAFETY: the block just allocated with `layout`.
        unsafe { pool.free_sized(p, layout) };
    }
    let after = pool.stats().alloc.arena;
    assert!(
        after.committed_bytes <= 8 << 20 && after.purged_bytes >= 48 << 20,
        "no purge on churn: committed {} -> {}, purged {}",
        before.committed_bytes,
        after.committed_bytes,
        after.purged_bytes
    );
    // The purge ran on the churn, not earlier (unless building took longer than the ¾ of the
    // delay after which a purge starts, when an earlier slow path may have run it: then only
    // the outcome above is checked).
    if built_in + Duration::from_millis(20) < delay * 3 / 4 {
        assert!(before.committed_bytes >= 48 << 20, "{before:?}");
    }
}

#[test]
fn thousands_of_threads_get_heaps_and_reuse_them() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = reclaim_pool(&pd, None);
    let layout = Layout::from_size_align(100, 8).unwrap();
    // More threads alive at once than the old fixed 1024 heaps.
    let n = if std::env::var_os("RDMA_POOL_TEST_NIC").is_some() {
        300
    } else {
        1100
    };
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        for _ in 0..n {
            s.spawn(|| {
                let p = pool.alloc(layout);
                assert!(!p.is_null(), "a thread got no heap");
                barrier.wait();
                // SAFETY: allocated above with `layout`.
                unsafe { pool.free_sized(p, layout) };
            });
        }
    });
    let stats = pool.stats();
    assert_eq!(stats.alloc.failed_allocations, 0, "{stats:?}");
    // Waves of short-lived threads reuse the heaps given back: no growth per wave.
    for _ in 0..5 {
        std::thread::scope(|s| {
            for _ in 0..100 {
                s.spawn(|| {
                    let p = pool.alloc(layout);
                    assert!(!p.is_null());
                    // SAFETY: allocated above with `layout`.
                    unsafe { pool.free_sized(p, layout) };
                });
            }
        });
    }
    // One heap per thread, plus the pool's own: the provisioning heap and up to 16 shared
    // heaps (two per CPU).
    assert!(
        (n as u64..=n as u64 + 17).contains(&stats.alloc.heaps_created),
        "{} heaps for {n} threads",
        stats.alloc.heaps_created
    );
    assert_eq!(
        pool.stats().alloc.heaps_created,
        stats.alloc.heaps_created,
        "heaps were not reused"
    );
    pool.purge();
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn a_thread_keeps_its_heaps_in_eight_pools() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pools: Vec<Pool> = (0..8)
        .map(|_| {
            Pool::with_config(
                &pd,
                ArenaConfig {
                    reserve: 1 << 30,
                    chunk: 1 << 24,
                    hugepages: Hugepages::Off,
                    purge_delay: None,
                    ..Default::default()
                },
            )
            .unwrap()
        })
        .collect();
    let layout = Layout::from_size_align(64, 8).unwrap();
    // Round robin over the pools: with fewer ways than pools every call would claim a heap.
    for _ in 0..1000 {
        for pool in &pools {
            let p = pool.alloc(layout);
            assert!(!p.is_null());
            // SAFETY: allocated above with `layout`.
            unsafe { pool.free_sized(p, layout) };
        }
    }
    for pool in &pools {
        assert_eq!(
            pool.stats().alloc.heap_claims,
            1,
            "the thread's heap was evicted"
        );
    }
}

/// The AddressSanitizer shadow of `len` bytes in an ASan build (`scripts/memcheck.sh`), else 0.
fn asan_shadow(len: u64) -> u64 {
    if cfg!(rdma_pool_asan) { len / 8 } else { 0 }
}

/// Resident memory of the process (VmRSS), in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib << 10
}

/// An ODP pool of 64 GiB in 1 GiB chunks, purged only on request.
fn big_odp_pool(pd: &Pd) -> Pool {
    Pool::with_config(
        pd,
        ArenaConfig {
            reserve: 1 << 36,
            chunk: 1 << 30,
            hugepages: Hugepages::Off,
            registration: rdma_pool::arena::Registration::Odp,
            purge_delay: None,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn an_odp_pool_populates_only_what_is_touched() {
    let _g = serial();
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = big_odp_pool(&pd);
    let before = rss();
    let layout = Layout::from_size_align(3 << 30, 4096).unwrap();
    let p = pool.alloc(layout);
    assert!(!p.is_null());
    // SAFETY: the first 4 KiB of a live 3 GiB block.
    unsafe { p.write_bytes(7, 4096) };
    // Under AddressSanitizer the pool unpoisons a fresh run: its shadow (an eighth) is
    // written, which is the checker's memory, not the pool's.
    let grown = rss()
        .saturating_sub(before)
        .saturating_sub(asan_shadow(3 << 30));
    assert!(
        grown < 256 << 20,
        "a 3 GiB ODP block made {} MiB resident",
        grown >> 20
    );
    assert!(pool.keys_of(p).unwrap().contains(p as usize, 3 << 30));
    // SAFETY: from this pool with `layout`.
    unsafe { pool.free_sized(p, layout) };
}

#[test]
fn purging_a_huge_untouched_run_makes_nothing_resident() {
    // Resident memory is measured in a child running this test alone: the other tests of the
    // binary would move it by more than the signal.
    const ALONE: &str = "RDMA_POOL_TEST_ALONE";
    if std::env::var_os(ALONE).is_none() {
        run_alone(
            "reclaim::purging_a_huge_untouched_run_makes_nothing_resident",
            ALONE,
        );
        return;
    }
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = big_odp_pool(&pd);
    // 32 GiB: the pool's descriptors of it, if a purge wrote them all, are 64 MiB. Under
    // AddressSanitizer (whose shadow of such a run is 4 GiB) a smaller run.
    let size: usize = if cfg!(rdma_pool_asan) {
        4 << 30
    } else {
        32 << 30
    };
    let layout = Layout::from_size_align(size, 4096).unwrap();
    for round in 0..3 {
        let p = pool.alloc(layout);
        assert!(!p.is_null(), "round {round}");
        // SAFETY: the first 4 KiB of a live block.
        unsafe { p.write_bytes(7, 4096) };
        let before = rss();
        // SAFETY: from this pool with `layout`.
        unsafe { pool.free_sized(p, layout) };
        assert!(pool.purge() >= size);
        let grown = rss().saturating_sub(before);
        assert!(
            grown < 24 << 20,
            "round {round}: purging an untouched {} GiB run made {} MiB resident",
            size >> 30,
            grown >> 20
        );
    }
    assert_eq!(pool.stats().alloc.failed_allocations, 0);
}

#[test]
fn a_pinned_run_larger_than_memory_is_refused_not_populated() {
    let _g = serial();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    let too_big = ((total_kib << 10) as usize + (1 << 30)).next_power_of_two();
    let pd = Nic::soft_with(rdma_pool::nic::soft::SoftConfig {
        memlock: rdma_pool::nic::soft::MemlockLimit::Unlimited,
        ..Default::default()
    })
    .alloc_pd()
    .unwrap();
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: too_big * 4,
            chunk: 1 << 30,
            hugepages: Hugepages::Off,
            registration: rdma_pool::arena::Registration::Pinned,
            purge_delay: None,
            ..Default::default()
        },
    )
    .unwrap();
    let before = rss();
    let p = pool.alloc(Layout::from_size_align(too_big, 4096).unwrap());
    assert!(
        p.is_null(),
        "a pinned run larger than memory was handed out"
    );
    assert!(
        rss() < before + (256 << 20),
        "it was populated before the refusal"
    );
    assert_eq!(pool.stats().alloc.failed_allocations, 1);
    // The arena says why.
    match pool.arena().alloc_run(too_big, rdma_pool::arena::SLAB) {
        Err(rdma_pool::arena::Error::NoMemory { len, available }) => {
            assert_eq!(len, too_big);
            assert!(available < too_big as u64);
        }
        other => panic!("{other:?}"),
    }
    // The pool goes on serving what fits.
    let q = pool.alloc(Layout::from_size_align(100 << 20, 4096).unwrap());
    assert!(!q.is_null());
    // SAFETY: from this pool.
    unsafe { pool.free(q) };
}

#[test]
fn address_space_freed_by_one_shape_serves_the_next() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 24,
            hugepages: Hugepages::Off,
            purge_delay: None,
            ..Default::default()
        },
    )
    .unwrap();
    // Shape 1: 1 KiB blocks (64 KiB pages), 48 MiB of them, freed and purged.
    build_and_drop(&pool, 1024, 48 << 20);
    pool.purge();
    let chunks = pool.stats().alloc.arena.chunks;
    assert!(
        pool.stats().alloc.spare_bytes >= 40 << 20,
        "{:?}",
        pool.stats()
    );
    // Shape 2: 200 KiB blocks (a 256 KiB first page, then 2 MiB pages) in the same address
    // space.
    build_and_drop(&pool, 200 << 10, 36 << 20);
    assert_eq!(
        pool.stats().alloc.arena.chunks,
        chunks,
        "fresh address space for a new shape"
    );
    pool.purge();
    // Shape 3: large runs of 3 slabs, then 1-slab pages again, then 5-slab runs.
    let l3 = Layout::from_size_align(6 << 20, 4096).unwrap();
    let runs: Vec<*mut u8> = (0..6).map(|_| pool.alloc(l3)).collect();
    assert!(runs.iter().all(|p| !p.is_null()));
    assert_eq!(pool.stats().alloc.arena.chunks, chunks);
    for p in runs {
        // SAFETY: from this pool with `l3`.
        unsafe { pool.free_sized(p, l3) };
    }
    pool.purge();
    build_and_drop(&pool, 3000, 30 << 20);
    pool.purge();
    let l5 = Layout::from_size_align(10 << 20, 4096).unwrap();
    let runs: Vec<*mut u8> = (0..3).map(|_| pool.alloc(l5)).collect();
    for &p in &runs {
        assert!(!p.is_null());
        assert!(pool.keys_of(p).unwrap().contains(p as usize, 10 << 20));
        // SAFETY: a live run of 10 MiB.
        unsafe { p.write_bytes(5, 10 << 20) };
    }
    assert_eq!(pool.stats().alloc.arena.chunks, chunks);
    for p in runs {
        // SAFETY: from this pool with `l5`.
        unsafe { pool.free_sized(p, l5) };
    }
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn a_new_shape_reuses_the_empty_pages_of_the_last_one_before_any_purge() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = reclaim_pool(&pd, None);
    // Alternating shapes, faster than any purge delay (there is none: no purge runs at all).
    // Large runs (3 MiB) come first: pages take their slabs; pages never merge back into
    // runs of several slabs before a purge (then spare slabs do).
    build_and_drop(&pool, 3 << 20, 48 << 20);
    let shapes = [1024usize, 200 << 10, 64, 700 << 10, 10 << 10, 40 << 10];
    let mut peak = 0;
    for (round, &size) in shapes
        .iter()
        .cycle()
        .take(common::scaled(12).max(6))
        .enumerate()
    {
        build_and_drop(&pool, size, 48 << 20);
        let committed = pool.stats().alloc.arena.committed_bytes;
        peak = peak.max(committed);
        assert!(
            committed <= 100 << 20,
            "round {round} ({size} B): {} MiB committed for 48 MiB live at a time",
            committed >> 20
        );
    }
    assert_eq!(pool.stats().alloc.arena.purged_bytes, 0);
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
    // Zeroed blocks from recycled (dirty) slabs are zero.
    for size in [100usize, 5000, 300 << 10, 2 << 20] {
        let l = Layout::from_size_align(size, 8).unwrap();
        let p = pool.alloc_zeroed(l);
        // SAFETY: a live block of `size` bytes.
        assert!(
            unsafe { std::slice::from_raw_parts(p, size) }
                .iter()
                .all(|&b| b == 0)
        );
        // SAFETY: from this pool with `l`.
        unsafe { pool.free_sized(p, l) };
    }
}

#[test]
fn a_purged_run_of_several_chunks_gives_its_address_space_back() {
    use rdma_pool::arena::Registration;
    use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};
    let nic = Nic::soft_with(SoftConfig {
        memlock: MemlockLimit::Unlimited,
        ..Default::default()
    });
    let pd = nic.alloc_pd().unwrap();
    for registration in [Registration::Pinned, Registration::Odp] {
        // 16 chunks of 16 MiB: without reuse, the fifth run below finds no room.
        let pool = Pool::with_config(
            &pd,
            ArenaConfig {
                reserve: 1 << 28,
                chunk: 1 << 24,
                hugepages: Hugepages::Off,
                purge_delay: None,
                registration,
                ..Default::default()
            },
        )
        .unwrap();
        for (round, size) in [48usize << 20, 40 << 20, 60 << 20]
            .into_iter()
            .cycle()
            .take(15)
            .enumerate()
        {
            let l = Layout::from_size_align(size, 8).unwrap();
            let p = pool.alloc(l);
            assert!(
                !p.is_null(),
                "{registration:?} round {round}: {size} B refused"
            );
            // SAFETY: a live block of `size` bytes (fresh or purged memory reads as zero).
            let block = unsafe { std::slice::from_raw_parts_mut(p, size) };
            assert!(block[0] == 0 && block[size - 1] == 0);
            block[0] = 1;
            block[size - 1] = 2;
            // The whole block is one SGE of one registration.
            let sge = pool.sge_of(block).unwrap();
            assert_eq!(sge.length as usize, size);
            // SAFETY: from this pool with `l`.
            unsafe { pool.free_sized(p, l) };
            assert!(
                pool.purge() >= size,
                "{registration:?} round {round}: not purged"
            );
        }
        // Two purged runs side by side, then one run as long as both: on a pinned pool it
        // may take their space (their regions are gone); an ODP pool keeps a region per run,
        // so it takes fresh space or one run's, never a range straddling both regions.
        let (la, lb) = (
            Layout::from_size_align(48 << 20, 8).unwrap(),
            Layout::from_size_align(40 << 20, 8).unwrap(),
        );
        let (a, b) = (pool.alloc(la), pool.alloc(lb));
        assert!(!a.is_null() && !b.is_null());
        // SAFETY: from this pool with these layouts.
        unsafe {
            pool.free_sized(a, la);
            pool.free_sized(b, lb);
        }
        pool.purge();
        let size = 80 << 20;
        let l = Layout::from_size_align(size, 8).unwrap();
        let p = pool.alloc(l);
        assert!(!p.is_null(), "{registration:?}: {size} B refused");
        // SAFETY: a live block of `size` bytes.
        let block = unsafe { std::slice::from_raw_parts(p, size) };
        assert_eq!(pool.sge_of(block).unwrap().length as usize, size);
        // SAFETY: from this pool with `l`.
        unsafe { pool.free_sized(p, l) };
        assert!(pool.validate());
        let st = pool.stats();
        assert_eq!(st.alloc.failed_allocations, 0);
        assert!(st.alloc.arena.chunks <= 16);
        drop(pool);
    }
}

#[test]
fn over_aligned_blocks_past_the_first_reservation_keep_their_keys() {
    let _g = serial();
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: 4 << 30,
            chunk: 1 << 30,
            hugepages: Hugepages::Off,
            registration: rdma_pool::arena::Registration::Odp,
            purge_delay: None,
            ..Default::default()
        },
    )
    .unwrap();
    // Each block takes a chunk of its own: 12 of them need three reservations of 4 GiB.
    let layout = Layout::from_size_align(64, 1 << 30).unwrap();
    let blocks: Vec<*mut u8> = (0..12).map(|_| pool.alloc(layout)).collect();
    for (i, &p) in blocks.iter().enumerate() {
        assert!(!p.is_null(), "block {i}");
        assert_eq!(p as usize % (1 << 30), 0, "block {i}");
        let keys = pool
            .keys_of(p)
            .expect("a block in an added reservation has keys");
        assert!(keys.contains(p as usize, 64), "block {i}");
        // SAFETY: a live block of 64 bytes.
        unsafe { p.write_bytes(i as u8, 64) };
    }
    let s = pool.stats();
    assert!(
        s.alloc.arena.reservations >= 3,
        "{} reservations",
        s.alloc.arena.reservations
    );
    assert_eq!(
        s.alloc.arena.reserved_bytes,
        u64::from(s.alloc.arena.reservations) << 32
    );
    assert_eq!(
        (s.alloc.failed_allocations, s.alloc.arena.unregistered_bytes),
        (0, 0)
    );
    for p in blocks {
        // SAFETY: from this pool with `layout`.
        unsafe { pool.free_sized(p, layout) };
    }
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

/// A small pool that fills its window quickly: 64 MiB reservations in 16 MiB chunks, four of
/// them, no purge unless asked.
fn small_window_pool(pd: &Pd) -> Pool {
    Pool::with_config(
        pd,
        ArenaConfig {
            reserve: 64 << 20,
            reservations: 4,
            chunk: 16 << 20,
            hugepages: Hugepages::Off,
            purge_delay: None,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn blocks_aligned_beyond_a_chunk_are_aligned_after_purges_and_never_use_the_window_up() {
    let _g = serial();
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = small_window_pool(&pd);
    // Purged slabs become spare; a run aligned beyond a chunk taken from them must still be
    // aligned in the address space (the window is aligned only to a chunk).
    let mib = Layout::from_size_align(1 << 20, 8).unwrap();
    let held: Vec<*mut u8> = (0..64).map(|_| pool.alloc(mib)).collect();
    for p in held {
        // SAFETY: from this pool with `mib`.
        unsafe { pool.free_sized(p, mib) };
    }
    assert!(pool.purge() > 0);
    for align in [32usize << 20, 64 << 20] {
        let l = Layout::from_size_align(1 << 20, align).unwrap();
        for round in 0..40 {
            let p = pool.alloc(l);
            assert!(!p.is_null(), "align {align}: round {round}");
            assert_eq!(p as usize % align, 0, "align {align}: round {round}: {p:p}");
            assert!(
                pool.keys_of(p)
                    .is_some_and(|k| k.contains(p as usize, 1 << 20))
            );
            // SAFETY: a live block of 1 MiB.
            unsafe { p.write_bytes(round as u8, 1 << 20) };
            // SAFETY: from this pool with `l`.
            unsafe { pool.free_sized(p, l) };
            pool.purge();
        }
    }
    assert!(pool.validate());
}

#[test]
fn a_full_window_purges_what_is_idle_before_it_refuses_a_run() {
    let _g = serial();
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = small_window_pool(&pd);
    let mib = Layout::from_size_align(1 << 20, 8).unwrap();
    let mut held = Vec::new();
    loop {
        let p = pool.alloc(mib);
        if p.is_null() {
            break;
        }
        held.push(p);
        assert!(held.len() <= 256, "a 256 MiB window holds no more");
    }
    assert!(
        held.len() >= 200,
        "{} MiB before the window was full",
        held.len()
    );
    for p in held {
        // SAFETY: from this pool with `mib`.
        unsafe { pool.free_sized(p, mib) };
    }
    // Nothing live, no purge asked for, the window cut into 1 MiB pages: runs far larger than
    // a page, and aligned ones, still come (the pool purges the idle slabs first).
    for (size, align) in [(40usize << 20, 8), (8 << 20, 16 << 20), (1 << 20, 32 << 20)] {
        let l = Layout::from_size_align(size, align).unwrap();
        let p = pool.alloc(l);
        assert!(!p.is_null(), "{size} B aligned to {align}");
        assert_eq!(p as usize % align, 0);
        // SAFETY: from this pool with `l`.
        unsafe { pool.free_sized(p, l) };
    }
    assert!(pool.validate());
}

#[test]
fn blocks_a_parked_producer_handed_out_come_back_without_it() {
    let _g = serial();
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = reclaim_pool(&pd, None);
    let shapes = [
        Layout::from_size_align(1000, 8).unwrap(),
        Layout::from_size_align(100 << 10, 8).unwrap(),
    ];
    // 48 MiB of each shape; 24 MiB in the emulated guest (`common::scaled`): thrice the 16 MiB
    // that may stay in all.
    let per_shape = common::scaled(48 << 20).max(24 << 20);
    // The consumer without a heap in the pool (it only frees), then with one.
    for consumer_allocates in [false, true] {
        let (blocks_tx, blocks_rx) = std::sync::mpsc::channel::<Vec<(usize, Layout)>>();
        let (wake_tx, wake_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            // Dropped on the way out, also when an assertion below fails: the producer wakes.
            let wake = wake_tx;
            let pool = &pool;
            s.spawn(move || {
                let mut out = Vec::new();
                for &l in &shapes {
                    for i in 0..per_shape / l.size() {
                        let p = pool.alloc(l);
                        // SAFETY: a fresh block of `l.size()` bytes.
                        unsafe { std::ptr::write_bytes(p, i as u8, l.size()) };
                        out.push((p as usize, l));
                    }
                }
                blocks_tx.send(out).unwrap();
                // Parked, alive: it never allocates or frees again until woken.
                let _ = wake_rx.recv();
            });
            let blocks = blocks_rx.recv().unwrap();
            let built = pool.stats().alloc.arena.committed_bytes;
            assert!(built >= 2 * per_shape as u64);
            // Two consumers share every page (every other block each), free, and stay alive
            // without allocating again.
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let mut sleepers = Vec::new();
            for half in 0..2 {
                let mine: Vec<(usize, Layout)> =
                    blocks.iter().copied().skip(half).step_by(2).collect();
                let (done_tx, (sleep_tx, sleep_rx)) =
                    (done_tx.clone(), std::sync::mpsc::channel::<()>());
                sleepers.push(sleep_tx);
                s.spawn(move || {
                    let l = Layout::from_size_align(64, 8).unwrap();
                    if consumer_allocates {
                        let p = pool.alloc(l);
                        // SAFETY: just allocated with `l`.
                        unsafe { pool.free_sized(p, l) };
                    }
                    for (p, l) in mine {
                        // SAFETY: a live block of this pool, freed once, by another thread.
                        unsafe { pool.free_sized(p as *mut u8, l) };
                    }
                    done_tx.send(()).unwrap();
                    let _ = sleep_rx.recv();
                });
            }
            drop(blocks);
            for _ in 0..2 {
                done_rx.recv().unwrap();
            }
            // The producer and both consumers sleep: the pages the producer filled are
            // abandoned, and the free completing each retired it. What stays: the producer's
            // current page and at most two full pages per class.
            pool.purge();
            let s1 = pool.stats();
            assert!(
                s1.alloc.arena.committed_bytes <= 16 << 20,
                "consumer allocates: {consumer_allocates}: {} MiB of {} MiB stay committed",
                s1.alloc.arena.committed_bytes >> 20,
                built >> 20
            );
            assert_eq!(pool.live_blocks(), 0);
            assert!(pool.validate());
            wake.send(()).unwrap();
            drop(sleepers);
        });
    }
}

/// A thread past the rounds in which it may claim heaps (freeing from a late thread-exit
/// destructor) still gets abandoned pages back to the pool: it counts its frees, and the one
/// that completes a page retires it.
#[test]
fn frees_from_a_thread_that_can_no_longer_have_a_heap_retire_abandoned_pages() {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};
    static POOL: std::sync::OnceLock<&'static Pool> = std::sync::OnceLock::new();
    static LATE: Mutex<Vec<(usize, Layout)>> = Mutex::new(Vec::new());
    static ROUND: AtomicU32 = AtomicU32::new(0);
    static KEY: std::sync::OnceLock<libc::pthread_key_t> = std::sync::OnceLock::new();
    extern "C" fn late(_: *mut libc::c_void) {
        // The pool's key (created first) runs before this one in every round and counts the
        // rounds in which the thread claimed a heap; after three it refuses to claim one. So
        // rounds 1 and 2 claim one (an allocation), and the frees of round 3 find none.
        let pool = POOL.get().unwrap();
        if ROUND.fetch_add(1, Ordering::SeqCst) < 2 {
            let l = Layout::from_size_align(64, 8).unwrap();
            let p = pool.alloc(l);
            // SAFETY: just allocated with `l`.
            unsafe { pool.free_sized(p, l) };
            // SAFETY: our key; a non-null marker asks for another round.
            unsafe { libc::pthread_setspecific(*KEY.get().unwrap(), std::ptr::dangling()) };
            return;
        }
        for (p, l) in LATE.lock().unwrap().drain(..) {
            // SAFETY: live blocks of the pool, freed once.
            unsafe { pool.free_sized(p as *mut u8, l) };
        }
    }
    let _g = serial();
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool: &'static Pool = Box::leak(Box::new(reclaim_pool(&pd, None)));
    POOL.set(pool).ok().unwrap();
    let l = Layout::from_size_align(1000, 8).unwrap();
    let (blocks_tx, blocks_rx) = std::sync::mpsc::channel::<Vec<(usize, Layout)>>();
    let (wake_tx, wake_rx) = std::sync::mpsc::channel::<()>();
    let producer = std::thread::spawn(move || {
        let out: Vec<(usize, Layout)> = (0..(48 << 20) / 1000)
            .map(|i| {
                let p = pool.alloc(l);
                // SAFETY: a fresh block of 1000 bytes.
                unsafe { std::ptr::write_bytes(p, i as u8, 1000) };
                (p as usize, l)
            })
            .collect();
        blocks_tx.send(out).unwrap();
        let _ = wake_rx.recv();
    });
    *LATE.lock().unwrap() = blocks_rx.recv().unwrap();
    let built = pool.stats().alloc.arena.committed_bytes;
    std::thread::spawn(|| {
        // A heap first, so that the pool's key destructor runs at this thread's exit.
        let l = Layout::from_size_align(64, 8).unwrap();
        let p = pool.alloc(l);
        // SAFETY: just allocated with `l`.
        unsafe { pool.free_sized(p, l) };
        let mut key = 0;
        // SAFETY: a fresh key with our destructor; the value is a non-null marker.
        unsafe {
            assert_eq!(libc::pthread_key_create(&mut key, Some(late)), 0);
            KEY.set(key).unwrap();
            libc::pthread_setspecific(key, std::ptr::dangling());
        }
    })
    .join()
    .unwrap();
    assert!(
        ROUND.load(Ordering::SeqCst) >= 3,
        "the late destructor freed the blocks"
    );
    assert!(LATE.lock().unwrap().is_empty());
    pool.purge();
    let committed = pool.stats().alloc.arena.committed_bytes;
    assert!(
        committed <= 8 << 20,
        "{} MiB of {} MiB stay committed",
        committed >> 20,
        built >> 20
    );
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
    wake_tx.send(()).unwrap();
    producer.join().unwrap();
}
