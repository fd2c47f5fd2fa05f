//! What a thread keeps: its caches of freed blocks are bounded per class — at most 32 blocks
//! and no more than 32 KiB of a class (at least one block) — whatever it frees, by sized and
//! unsized frees alike; its first page of a class holds one block (threads starting at once
//! share the slab one of them cuts); a heap claimed again hands back the pages its last owner
//! kept, once other threads freed their blocks. In an ODP pool its size-class pages are on 4 KiB pages
//! (a block touched faults in 4 KiB), large runs on huge pages; a pinned pool pins whole slabs
//! and keeps them all on huge pages.

use super::*;
use std::alloc::Layout;
use std::sync::Barrier;

#[test]
fn a_threads_caches_hold_at_most_32_kib_of_each_class() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = own_pages_pool_on(&pd, Access::empty());
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
        let t = s.spawn(|| {
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
        // Joined: the scope's own wait may return before the thread handed its heap back.
        t.join().unwrap();
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn a_thread_holding_one_medium_block_holds_a_page_of_about_its_size() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = pool_on(&pd, Access::empty());
    const THREADS: usize = 32;
    let medium = Layout::from_size_align(200 << 10, 8).unwrap();
    let small = Layout::from_size_align(48, 8).unwrap();
    let held = Barrier::new(THREADS + 1);
    let done = Barrier::new(THREADS + 1);
    let one_at_a_time = std::sync::Mutex::new(());
    let before = pool.stats().alloc.arena.committed_bytes;
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for _ in 0..THREADS {
            threads.push(s.spawn(|| {
                // One thread allocates at a time: what is measured is each thread's pages, not
                // how many slabs threads racing for an empty list cut (on the emulated rxe
                // guest a registration outlasts the carver's bounded wait).
                let turn = one_at_a_time.lock().unwrap();
                let m = pool.alloc(medium);
                let few: Vec<*mut u8> = (0..20).map(|_| pool.alloc(small)).collect();
                drop(turn);
                assert!(!m.is_null() && few.iter().all(|p| !p.is_null()));
                // SAFETY: fresh blocks of these sizes.
                unsafe {
                    m.write_bytes(0x11, medium.size());
                    few.iter().for_each(|p| p.write_bytes(0x22, small.size()));
                }
                held.wait();
                done.wait();
                // SAFETY: blocks of `pool`, freed once.
                unsafe {
                    pool.free_sized(m, medium);
                    few.iter().for_each(|&p| pool.free_sized(p, small));
                }
            }));
        }
        held.wait();
        // Each thread: a 256 KiB page for its 200 KiB block (a dense page would be 2 MiB) and
        // a 64 KiB page of small blocks; pages of one size share slabs across threads.
        let grew = pool.stats().alloc.arena.committed_bytes - before;
        done.wait();
        // Dense pages alone would be 2 MiB a thread (64 MiB). A thread that waited past its
        // carver's bound (a loaded test machine) cuts a slab of its own: up to twice the pages.
        let bound = THREADS as u64 * ((2 * (256 + 64)) << 10) + (4 << 20);
        assert!(
            grew <= bound,
            "{THREADS} threads holding 200 KiB and 20 small blocks each committed {} KiB (bound {} KiB)",
            grew >> 10,
            bound >> 10
        );
        // Joined: the scope's own wait may return before the threads handed their heaps back.
        for t in threads {
            t.join().unwrap();
        }
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

#[test]
fn a_heap_claimed_again_hands_back_the_pages_its_last_owner_kept_once_their_blocks_are_freed() {
    // No purge clock: nothing but the claim collects the heap.
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            purge_delay: None,
            purge_thread: false,
            ..Default::default()
        },
    )
    .unwrap();
    let l = Layout::from_size_align(100 << 10, 8).unwrap();
    let c = pool
        .stats()
        .alloc
        .classes
        .iter()
        .position(|k| k.block_size >= l.size() as u64)
        .unwrap();
    // A thread leaves with a block handed to another: its heap keeps that block's page.
    let p = std::thread::scope(|s| s.spawn(|| pool.alloc(l) as usize).join().unwrap());
    assert_ne!(p, 0);
    // SAFETY: a block of `pool`, freed once (by another thread than its page's).
    unsafe { pool.free_sized(p as *mut u8, l) };
    assert_eq!(
        pool.stats().alloc.classes[c].pages,
        1,
        "kept by the heap nobody owns"
    );
    // The next thread claims that heap: the page, empty now, goes back to the pool at once,
    // not at this thread's next block of the class (which may never come).
    std::thread::scope(|s| {
        s.spawn(|| {
            let small = Layout::from_size_align(16, 8).unwrap();
            let q = pool.alloc(small);
            assert!(!q.is_null());
            let st = pool.stats().alloc;
            assert_eq!(st.heap_claims, 2, "the heap was claimed again");
            assert_eq!(st.classes[c].pages, 0, "{:?}", st.classes[c]);
            assert_eq!(st.classes[c].allocated, 0);
            // SAFETY: a block of `pool`, freed once.
            unsafe { pool.free_sized(q, small) };
        });
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}

/// The mapping of `/proc/self/smaps` holding `addr`: its `Rss` in KiB and its `VmFlags`.
fn mapping_of(addr: usize) -> (u64, String) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut rss = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if !inside {
            continue;
        }
        if let Some(kib) = line.strip_prefix("Rss:") {
            rss = kib.trim().trim_end_matches("kB").trim().parse().ok();
        }
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            return (rss.unwrap(), flags.trim().to_string());
        }
    }
    panic!("no mapping holds {addr:#x}");
}

#[test]
fn in_an_odp_pool_blocks_of_every_size_live_on_4_kib_pages_and_fault_in_where_touched() {
    let pd = Nic::soft().alloc_pd().unwrap();
    // ODP: nothing is populated ahead of a touch, so resident memory is what was touched.
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: 1 << 34,
            chunk: 1 << 28,
            hugepages: Hugepages::Transparent,
            registration: rdma_pool::arena::Registration::Odp,
            ..Default::default()
        },
    )
    .unwrap();
    const THREADS: usize = 32;
    let small = Layout::from_size_align(48, 8).unwrap();
    let page = Layout::from_size_align(4096, 8).unwrap();
    let whole = Layout::from_size_align(4 << 20, 4096).unwrap();
    let held = Barrier::new(THREADS + 1);
    let done = Barrier::new(THREADS + 1);
    let first = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for _ in 0..THREADS {
            threads.push(s.spawn(|| {
                let few: Vec<*mut u8> = (0..20).map(|_| pool.alloc(small)).collect();
                let p = pool.alloc(page);
                assert!(!p.is_null() && few.iter().all(|p| !p.is_null()));
                // SAFETY: fresh blocks of these sizes.
                unsafe {
                    p.write_bytes(0x11, page.size());
                    few.iter().for_each(|p| p.write_bytes(0x22, small.size()));
                }
                first.store(few[0] as usize, std::sync::atomic::Ordering::Relaxed);
                held.wait();
                done.wait();
                // SAFETY: blocks of `pool`, freed once.
                unsafe {
                    pool.free_sized(p, page);
                    few.iter().for_each(|&q| pool.free_sized(q, small));
                }
            }));
        }
        held.wait();
        let big = pool.alloc(whole);
        assert!(!big.is_null());
        // A large block written at both ends (a buffer sized to the largest message, used by
        // a small one) faults in those two pages, not two huge pages.
        // SAFETY: a fresh block of 4 MiB.
        unsafe {
            big.write(0x33);
            big.add(whole.size() - 1).write(0x33);
        }
        let big_resident = resident_pages(big as usize, whole.size());
        let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists();
        let (rss, flags) = mapping_of(first.load(std::sync::atomic::Ordering::Relaxed));
        let (_, big_flags) = mapping_of(big as usize);
        // SAFETY: the block allocated above.
        unsafe { pool.free_sized(big, whole) };
        assert!(
            big_resident <= 16,
            "a 4 MiB block written at both ends: {big_resident} pages resident ({big_flags})"
        );
        done.wait();
        // The pages of small blocks are shared by the threads' heaps, each touching a few
        // blocks: 32 threads × (a 4 KiB block + 20 small ones) touch some 300 KiB of 4 KiB
        // pages. On huge pages each slab touched would be 2 MiB resident.
        assert!(
            rss <= 1024,
            "{THREADS} threads' small blocks: {rss} KiB resident in their mapping ({flags})"
        );
        if thp {
            let words: Vec<&str> = flags.split_whitespace().collect();
            assert!(words.contains(&"nh"), "small pages' mapping: {flags}");
            let words: Vec<&str> = big_flags.split_whitespace().collect();
            assert!(
                words.contains(&"nh"),
                "a 4 MiB block's mapping: {big_flags}"
            );
        }
        for t in threads {
            t.join().unwrap();
        }
    });
    assert_eq!(pool.live_blocks(), 0);
    let arena = pool.stats().alloc.arena;
    assert!(arena.slabs_small >= 1, "{arena:?}");
    assert!(pool.validate());
}

#[test]
fn a_pool_of_one_chunk_cuts_small_pages_and_whole_slabs_from_it() {
    let pd = Nic::soft().alloc_pd().unwrap();
    // Small pages and whole slabs prefer chunks of their own backing; with room for one chunk,
    // whichever comes second shares the first one's.
    for small_first in [true, false] {
        let pool = Pool::with_config(
            &pd,
            ArenaConfig {
                reserve: 1 << 26,
                reservations: 1,
                chunk: 1 << 26,
                hugepages: Hugepages::Transparent,
                // Sparse chunks are an ODP arena's (pinned slabs are pinned whole).
                registration: rdma_pool::arena::Registration::Odp,
                ..Default::default()
            },
        )
        .unwrap();
        let small = Layout::from_size_align(64, 8).unwrap();
        let whole = Layout::from_size_align(4 << 20, 4096).unwrap();
        let (a, b) = if small_first {
            (pool.alloc(small), pool.alloc(whole))
        } else {
            let b = pool.alloc(whole);
            (pool.alloc(small), b)
        };
        assert!(!a.is_null() && !b.is_null(), "small first: {small_first}");
        let arena = pool.stats().alloc.arena;
        assert_eq!(arena.chunks, 1, "{arena:?}");
        // SAFETY: the blocks allocated above, freed once.
        unsafe {
            pool.free_sized(a, small);
            pool.free_sized(b, whole);
        }
        assert_eq!(pool.live_blocks(), 0);
        assert!(pool.validate());
    }
}

#[test]
fn a_pinned_pool_pins_one_step_for_a_small_block_not_a_huge_page() {
    let nic = Nic::soft();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: 1 << 30,
            chunk: 1 << 26,
            hugepages: Hugepages::Transparent,
            registration: rdma_pool::arena::Registration::Pinned,
            ..Default::default()
        },
    )
    .unwrap();
    let small = Layout::from_size_align(64, 8).unwrap();
    let p = pool.alloc(small);
    assert!(!p.is_null());
    let (_, flags) = mapping_of(p as usize);
    let arena = pool.stats().alloc.arena;
    // A slab of small pages is on 4 KiB pages, registered a step at a time: one block pins
    // its step (256 KiB), not a 2 MiB huge page.
    assert!(!flags.split_whitespace().any(|w| w == "hg"), "{flags}");
    assert_eq!(arena.slabs_thp, 0, "{arena:?}");
    assert_eq!(arena.step_regions, 1, "{arena:?}");
    assert_eq!(soft.pinned_bytes(), STEP_BYTES as u64);
    let keys = pool.keys_of(p).unwrap();
    assert_eq!(keys.len, STEP_BYTES);
    assert_eq!(keys.addr % STEP_BYTES, 0);
    assert!(keys.contains(p as usize, 64));
    // SAFETY: the block allocated above.
    unsafe { pool.free_sized(p, small) };
    pool.purge();
    assert_eq!(
        soft.pinned_bytes(),
        0,
        "nothing pinned once it all went back"
    );
    assert_eq!(pool.stats().alloc.arena.step_regions, 0);
    assert!(pool.validate());
}

#[test]
fn small_pages_of_an_odp_pool_revive_no_huge_page_slab_and_large_blocks_come_back_from_spares() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: 1 << 34,
            chunk: 1 << 28,
            hugepages: Hugepages::Transparent,
            registration: rdma_pool::arena::Registration::Odp,
            ..Default::default()
        },
    )
    .unwrap();
    // A large block freed and purged: its slabs are spare, purged (on 4 KiB pages in an ODP
    // pool, like every slab there but hugetlb ones).
    let whole = Layout::from_size_align(8 << 20, 4096).unwrap();
    let big = pool.alloc(whole);
    assert!(!big.is_null());
    // SAFETY: a fresh block of 8 MiB, then freed once.
    unsafe {
        big.write_bytes(0x44, whole.size());
        pool.free_sized(big, whole);
    }
    pool.purge();
    let arena = pool.stats().alloc.arena;
    assert!(arena.purged_bytes >= 8 << 20, "{arena:?}");
    // Small blocks come from a fresh sparse chunk, not from those slabs.
    let small = Layout::from_size_align(64, 8).unwrap();
    let p = pool.alloc(small);
    assert!(!p.is_null());
    let (_, flags) = mapping_of(p as usize);
    let (_, big_flags) = mapping_of(big as usize);
    if std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
        for f in [&flags, &big_flags] {
            assert!(
                f.split_whitespace().any(|w| w == "nh"),
                "small block: {flags}; the purged large block: {big_flags}"
            );
        }
    }
    // SAFETY: the block allocated above.
    unsafe { pool.free_sized(p, small) };
    // The large block comes back from its spare slabs.
    let again = pool.alloc(whole);
    assert_eq!(again, big);
    // SAFETY: the block allocated above.
    unsafe { pool.free_sized(again, whole) };
    assert!(pool.validate());
}

/// The thread caches of heaps whose threads left go back to the system at the next purge pass
/// (their rows of slots: ~20 KiB a heap, which 600 threads that came and went would otherwise
/// keep resident), once; a thread that claims such a heap again caches and reuses blocks as
/// before.
#[test]
fn the_caches_of_threads_that_left_go_back_at_the_next_purge() {
    let pd = Nic::soft().alloc_pd().unwrap();
    // No purge but the test's (a timed pass holding the purge lock would make `purge()` a
    // no-op and the counts half done).
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            purge_delay: None,
            purge_thread: false,
            ..Default::default()
        },
    )
    .unwrap();
    const THREADS: u64 = 16;
    // Blocks of several cached classes, filled and freed (into the thread's caches), by
    // threads all alive at once (each with a heap of its own).
    let met = Barrier::new(THREADS as usize);
    let churn = |pool: &Pool| {
        let first = Layout::new::<u64>();
        let held = pool.alloc(first);
        met.wait();
        // SAFETY: a block of `pool` with `first`, freed once.
        unsafe { pool.free_sized(held, first) };
        for size in [16usize, 200, 1000, 4000, 12 << 10, 32 << 10] {
            let layout = Layout::from_size_align(size, 8).unwrap();
            let blocks: Vec<*mut u8> = (0..8).map(|_| pool.alloc(layout)).collect();
            for &p in &blocks {
                assert!(!p.is_null());
                // SAFETY: a fresh block of `size` bytes.
                unsafe { p.write_bytes(0x5A, size) };
            }
            for p in blocks {
                // SAFETY: a block of `pool` with `layout`, freed once.
                unsafe { pool.free_sized(p, layout) };
            }
        }
    };
    let discarded = || pool.stats().alloc.heap_cache_discarded_bytes;
    let before = discarded();
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS).map(|_| s.spawn(|| churn(&pool))).collect();
        // Joined one by one: a thread has handed its heap back once its join returns.
        for t in threads {
            t.join().unwrap();
        }
    });
    pool.purge();
    let gone = discarded() - before;
    // Each heap's rows (80 of 256 bytes) hold at least four whole 4 KiB pages.
    assert!(
        gone >= THREADS * (16 << 10),
        "{gone} bytes of caches given back"
    );
    // Once between two claims: a second purge finds nothing more to give.
    pool.purge();
    assert_eq!(discarded() - before, gone);
    // Threads claiming those heaps again cache as before (the rows read as empty slots).
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS).map(|_| s.spawn(|| churn(&pool))).collect();
        for t in threads {
            t.join().unwrap();
        }
    });
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
    pool.purge();
    // The heaps' second owners left too: their rows go again.
    assert!(discarded() - before >= (2 * gone).saturating_sub(THREADS * (4 << 10)));
}

/// Resident 4 KiB pages of `[addr, addr + len)` (`mincore`; `addr` page-aligned).
pub(super) fn resident_pages(addr: usize, len: usize) -> usize {
    let mut v = vec![0u8; len.div_ceil(4096)];
    // SAFETY: a mapped, page-aligned range of the pool's, and one byte per page.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) };
    assert_eq!(r, 0);
    v.iter().filter(|&&b| b & 1 != 0).count()
}
