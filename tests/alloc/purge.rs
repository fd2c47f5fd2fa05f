//! The pool's purge policy: idle slabs (freed large runs, empty pages of every size) go
//! back to the system after the delay or on `purge()`, live memory is never touched, and purged
//! memory comes back committed and registered. Also: a pool attached to an application's PD.

use super::*;
use rdma_pool::arena::{Registration, SLAB};
use std::alloc::Layout;
use std::time::Duration;

fn purging_pool(pd: &Pd, delay: Option<Duration>, registration: Registration) -> Pool {
    clock_pool(pd, delay, registration, true)
}

/// [`purging_pool`] with the purge clock on or off.
pub(crate) fn clock_pool(
    pd: &Pd,
    delay: Option<Duration>,
    registration: Registration,
    purge_thread: bool,
) -> Pool {
    clock_pool_sharing(pd, delay, registration, purge_thread, true)
}

/// [`clock_pool`], its threads' first blocks from the shared heaps or (`shared` false) every
/// block from pages of their own.
pub(crate) fn clock_pool_sharing(
    pd: &Pd,
    delay: Option<Duration>,
    registration: Registration,
    purge_thread: bool,
    shared: bool,
) -> Pool {
    let defaults = ArenaConfig::default();
    // SAFETY: the test's peers write only blocks the test hands them, and the test reads
    // those only after the write completed.
    unsafe {
        Pool::with_remote_rights(
            pd,
            ArenaConfig {
                reserve: 1 << 34,
                chunk: 1 << 26,
                hugepages: Hugepages::Off,
                remote: Access::REMOTE_WRITE,
                registration,
                purge_delay: delay,
                purge_thread,
                shared_bytes: if shared { defaults.shared_bytes } else { 0 },
                ..defaults
            },
        )
    }
    .unwrap()
}

fn stale(bed: &Bed) -> u64 {
    bed.a.nic.as_soft().map_or(0, |s| {
        let c = s.counters();
        // Accesses that met dropped pages, and pinned regions released over them (a purge
        // before the deregistration would show here even without an access).
        c.stale_pinned_accesses + c.stale_pinned_releases
    })
}

/// Allocate `n` blocks of `layout` filled with their index, on a thread that exits (so its
/// pages go back to the pool), and return them.
fn blocks_from_a_thread(pool: &Pool, layout: Layout, n: usize) -> Vec<usize> {
    std::thread::scope(|s| {
        s.spawn(|| {
            (0..n)
                .map(|i| {
                    let p = pool.alloc(layout);
                    assert!(!p.is_null());
                    // SAFETY: a fresh block of `layout.size()` bytes.
                    unsafe { std::ptr::write_bytes(p, i as u8, layout.size()) };
                    p as usize
                })
                .collect()
        })
        .join()
        .unwrap()
    })
}

fn free_all(pool: &Pool, blocks: &[usize], layout: Layout) {
    for &p in blocks {
        // SAFETY: blocks of `pool` with `layout`, freed once.
        unsafe { pool.free_sized(p as *mut u8, layout) };
    }
}

#[test]
fn idle_slabs_of_every_kind_are_purged_on_request() {
    let _g = serial();
    let bed = bed();
    let pool = purging_pool(&bed.a.pd, None, Registration::Auto);
    // Four slabs in all, so that the pinned memory fits the rxe guest's 8 MiB memlock limit
    // (the two of small pages pinned in steps: 2.25 MiB; 6.25 MiB in all).
    // 8 KiB blocks: a thread's first four in 8 KiB pages (a slab of their own), then 64 KiB
    // pages, 32 per slab.
    let small = Layout::from_size_align(8 << 10, 8).unwrap();
    // A thread's first page of a class holds one block: a 1 MiB page, in a slab of two.
    let medium = Layout::from_size_align(600 << 10, 8).unwrap();
    let large = Layout::from_size_align(3 << 19, 4096).unwrap(); // a one-slab run
    let s_blocks = blocks_from_a_thread(&pool, small, 4 + 256); // one slab of 64 KiB pages
    let m_blocks = blocks_from_a_thread(&pool, medium, 1);
    let l_blocks = blocks_from_a_thread(&pool, large, 1);
    let keep = s_blocks[4] as *mut u8; // stays live: its slab is not idle
    let s_blocks: Vec<usize> = s_blocks
        .iter()
        .copied()
        .filter(|&p| p != keep as usize)
        .collect();
    let s_blocks = &s_blocks[..];
    let before = pool.stats().alloc.arena;
    free_all(&pool, s_blocks, small);
    free_all(&pool, &m_blocks, medium);
    free_all(&pool, &l_blocks, large);
    // Nothing is purged without a delay until asked.
    assert_eq!(pool.stats().alloc.arena.purged_bytes, 0);
    let purged = pool.purge();
    let after = pool.stats().alloc.arena;
    assert_eq!(
        purged,
        3 * SLAB,
        "the large run, the slab of 1 MiB pages and the slab of the first 8 KiB pages"
    );
    // The last small block goes: now its slab is idle too.
    // SAFETY: a block of the pool, freed once.
    unsafe { pool.free_sized(keep, small) };
    assert_eq!(pool.purge(), SLAB);
    assert_eq!(after.purged_bytes, purged as u64);
    assert_eq!(
        after.committed_bytes,
        before.committed_bytes - purged as u64
    );
    assert!(after.resident_bytes < before.resident_bytes);
    assert_eq!(pool.purge(), 0, "nothing idle is left");
    // Reuse: every kind comes back committed, zeroed where asked, and registered.
    let again = blocks_from_a_thread(&pool, small, 256);
    let big = pool.alloc_zeroed(large);
    assert!(!big.is_null());
    // SAFETY: a live zeroed block of `large.size()` bytes.
    assert!(
        unsafe { std::slice::from_raw_parts(big, large.size()) }
            .iter()
            .all(|&b| b == 0)
    );
    let mid = pool.alloc(medium);
    for &p in again.iter().chain([big as usize, mid as usize].iter()) {
        let k = pool.keys_of(p as *const u8).expect("registered again");
        assert!(k.contains(p, small.size()));
    }
    assert!(pool.stats().alloc.arena.revived_bytes > 0);
    // A peer writes into the revived large block (remote opt-in), a page in.
    let k = pool.keys_of(big).unwrap();
    let (_mem, src) = bed.b.reg_buf(4096, 0x6D, RW);
    let at = big as u64 + 4096;
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qb
            .post_write(9, &[src.sge(0, 4096).unwrap()], at, k.rkey)
    }
    .unwrap();
    assert_eq!(bed.b.wait().status, WcStatus::Success);
    // SAFETY: the block is live.
    assert!(
        unsafe { std::slice::from_raw_parts(at as *const u8, 4096) }
            .iter()
            .all(|&b| b == 0x6D)
    );
    assert_eq!(stale(&bed), 0);
    free_all(&pool, &again, small);
    // SAFETY: blocks of the pool, freed once.
    unsafe {
        pool.free_sized(big, large);
        pool.free_sized(mid, medium);
    }
    assert!(pool.validate());
}

#[test]
fn idle_slabs_are_purged_after_the_delay_by_a_slow_path_without_the_clock() {
    let _g = serial();
    let bed = bed();
    let pool = clock_pool(
        &bed.a.pd,
        Some(Duration::from_millis(20)),
        Registration::Pinned,
        false,
    );
    let large = Layout::from_size_align(3 << 19, 4096).unwrap();
    let a = pool.alloc(large);
    // SAFETY: a block of the pool, freed once.
    unsafe { pool.free_sized(a, large) };
    assert_eq!(
        pool.stats().alloc.arena.purged_bytes,
        0,
        "not before the delay"
    );
    std::thread::sleep(Duration::from_millis(60));
    // Any slow path after the delay purges: here another large free.
    let other = Layout::from_size_align(5 << 20, 4096).unwrap();
    let b = pool.alloc(other);
    // SAFETY: as above.
    unsafe { pool.free_sized(b, other) };
    let s = pool.stats().alloc.arena;
    assert!(s.purged_bytes >= SLAB as u64, "{s:?}");
    assert_eq!(stale(&bed), 0);
    assert!(pool.validate());
    // Idle and off the clock, the pool keeps what goes idle now.
    let c = pool.alloc(large);
    // SAFETY: as above.
    unsafe { pool.free_sized(c, large) };
    let before = pool.stats().alloc;
    assert!(!before.purge_clock);
    std::thread::sleep(Duration::from_millis(300));
    let after = pool.stats().alloc;
    assert_eq!(after.arena.purged_bytes, before.arena.purged_bytes);
    assert_eq!(after.purge_passes, before.purge_passes);
}

/// Poll `pool`'s stats (no allocator call) until `done` or `secs` seconds passed.
pub(crate) fn wait_for(
    pool: &Pool,
    secs: u64,
    done: impl Fn(&rdma_pool::PoolStats) -> bool,
) -> bool {
    let end = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if done(&pool.stats().alloc) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done(&pool.stats().alloc)
}

#[test]
fn idle_memory_goes_back_on_the_clock_while_the_program_makes_no_call() {
    let _g = serial();
    let bed = bed();
    let pool = purging_pool(
        &bed.a.pd,
        Some(Duration::from_millis(30)),
        Registration::Pinned,
    );
    let large = Layout::from_size_align(3 << 19, 4096).unwrap(); // a one-slab run
    let small = Layout::from_size_align(16 << 10, 8).unwrap(); // a 64 KiB page, then 128 KiB ones
    let l = pool.alloc(large);
    let s_blocks = blocks_from_a_thread(&pool, small, 128); // two slabs of pages
    let before = pool.stats().alloc;
    assert!(before.purge_clock);
    assert_eq!(before.arena.purged_bytes, 0);
    // SAFETY: a block of the pool, freed once.
    unsafe { pool.free_sized(l, large) };
    free_all(&pool, &s_blocks, small);
    // From here on the test makes no call into the pool but `stats()`, which purges nothing.
    let done = wait_for(&pool, 10, |s| s.arena.purged_bytes >= 2 * SLAB as u64);
    let after = pool.stats().alloc;
    assert!(done, "idle slabs stayed: {after:?}");
    assert!(after.purge_clock_running);
    assert!(after.purge_clock_passes > 0);
    assert!(after.arena.committed_bytes <= before.arena.committed_bytes - 2 * SLAB as u64);
    assert_eq!(stale(&bed), 0);
    // Purged memory comes back committed and registered.
    let again = pool.alloc(large);
    assert!(pool.keys_of(again).is_some());
    // SAFETY: a block of the pool, freed once.
    unsafe { pool.free_sized(again, large) };
    assert!(pool.validate());
}

/// The purge delay is when idle memory is back, not when its purge starts: the clock starts
/// it at ¾ of the delay (a GiB takes ~0.1–0.2 s to give back on a small VM).
#[test]
fn idle_memory_is_back_when_the_delay_has_passed() {
    let _g = serial();
    let bed = bed();
    let delay = Duration::from_millis(800);
    let pool = purging_pool(&bed.a.pd, Some(delay), Registration::Pinned);
    let large = Layout::from_size_align(3 << 19, 4096).unwrap(); // a one-slab run
    let l = pool.alloc(large);
    assert!(!l.is_null());
    let before = pool.stats().alloc.arena.purged_bytes;
    // SAFETY: a block of the pool, freed once.
    unsafe { pool.free_sized(l, large) };
    let freed = std::time::Instant::now();
    // No call into the pool but `stats()` from here.
    let mut purged_at = None;
    while freed.elapsed() < delay * 4 {
        if pool.stats().alloc.arena.purged_bytes > before {
            purged_at = Some(freed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let at = purged_at.expect("the idle slab was never purged");
    assert!(
        at >= delay / 2,
        "purged {at:?} after the free: before ¾ of {delay:?}"
    );
    assert!(
        at <= delay,
        "purged {at:?} after the free: after the delay {delay:?}"
    );
    assert_eq!(stale(&bed), 0);
    assert!(pool.validate());
}

#[test]
fn pages_of_exited_threads_go_back_on_the_clock() {
    let _g = serial();
    let bed = bed();
    let pool = purging_pool(
        &bed.a.pd,
        Some(Duration::from_millis(30)),
        Registration::Pinned,
    );
    // The thread exits while its pages are full of live blocks: they stay with its heap.
    let small = Layout::from_size_align(16 << 10, 8).unwrap();
    let blocks = blocks_from_a_thread(&pool, small, 128);
    let passes = pool.stats().alloc.purge_passes;
    // Frees from this thread, into pages no thread owns, with no slow path of their own.
    free_all(&pool, &blocks, small);
    let done = wait_for(&pool, 10, |s| s.arena.purged_bytes >= SLAB as u64);
    let after = pool.stats().alloc;
    assert!(done, "the exited thread's pages stayed: {after:?}");
    assert!(after.purge_passes > passes);
    assert_eq!(after.small_allocated_bytes, 0);
    assert_eq!(stale(&bed), 0);
    assert!(pool.validate());
}

#[test]
fn a_pool_on_the_clock_drops_while_the_clock_purges_it() {
    let _g = serial();
    let bed = bed();
    let large = Layout::from_size_align(3 << 19, 4096).unwrap();
    for round in 0..20u64 {
        let pool = purging_pool(&bed.a.pd, Some(Duration::ZERO), Registration::Pinned);
        let p = pool.alloc(large);
        // SAFETY: a block of the pool, freed once.
        unsafe { pool.free_sized(p, large) };
        // The clock's pass may be inside the pool now, or not yet: the drop waits for it.
        std::thread::sleep(Duration::from_micros(round * 50));
        drop(pool);
    }
    assert_eq!(stale(&bed), 0);
}

#[test]
fn purging_under_churn_loses_no_live_byte() {
    let _g = serial();
    // Tens of MiB live at times: a soft NIC wherever the test runs (memlock in the guest).
    let bed = default_bed();
    let pool = purging_pool(&bed.a.pd, Some(Duration::ZERO), Registration::Auto);
    let sizes = [24usize, 700, 5000, 70 << 10, 300 << 10, 1200 << 10, 2 << 20];
    let mut live: Vec<(usize, Layout, u8)> = Vec::new();
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for round in 0..common::scaled(3000) as u32 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        if live.len() > 40 || (seed & 1 == 1 && !live.is_empty()) {
            let (p, l, fill) = live.swap_remove((seed >> 8) as usize % live.len());
            // SAFETY: a live block of `l.size()` bytes.
            let got = unsafe { std::slice::from_raw_parts(p as *const u8, l.size()) };
            assert!(
                got.iter().all(|&b| b == fill),
                "round {round}: a live block changed"
            );
            // SAFETY: freed once, with its layout.
            unsafe { pool.free_sized(p as *mut u8, l) };
        } else {
            let l = Layout::from_size_align(sizes[(seed >> 20) as usize % sizes.len()], 8).unwrap();
            let p = pool.alloc(l);
            assert!(!p.is_null());
            let fill = (seed >> 32) as u8;
            // SAFETY: a fresh block.
            unsafe { std::ptr::write_bytes(p, fill, l.size()) };
            assert!(
                pool.keys_of(p)
                    .is_some_and(|k| k.contains(p as usize, l.size()))
            );
            live.push((p as usize, l, fill));
        }
        if round % 500 == 0 {
            pool.purge();
        }
    }
    assert!(pool.stats().alloc.arena.purges > 0);
    for (p, l, fill) in live {
        // SAFETY: as above.
        let got = unsafe { std::slice::from_raw_parts(p as *const u8, l.size()) };
        assert!(got.iter().all(|&b| b == fill));
        // SAFETY: as above.
        unsafe { pool.free_sized(p as *mut u8, l) };
    }
    assert_eq!(stale(&bed), 0);
    assert!(pool.validate());
}

#[test]
fn a_pool_attached_to_the_applications_pd_posts_through_its_qps() {
    let _g = serial();
    let bed = bed();
    // The application owns the PD (on verbs, e.g. from rdma_cm: adopted by its raw pointer).
    let app_pd = if on_verbs() {
        // SAFETY: `bed.a.pd` outlives the adopted handle and the pool.
        unsafe { Pd::from_raw(&bed.a.nic, bed.a.pd.as_raw() as *mut std::ffi::c_void) }.unwrap()
    } else {
        bed.a.pd.clone()
    };
    let pool = pool_on(&app_pd, Access::empty());
    assert_eq!(pool.pd().as_raw(), bed.a.pd.as_raw());
    assert!(pool.nic().same_device(&bed.a.nic));
    // The application's QP (`bed.qa`, in its PD) posts pool memory by the pool's lkey.
    let layout = Layout::from_size_align(4096, 4096).unwrap();
    let p = pool.alloc(layout);
    // SAFETY: a fresh 4 KiB block.
    unsafe { std::ptr::write_bytes(p, 0x42, 4096) };
    let k = pool.keys_of(p).unwrap();
    let (_mem, dst) = bed.b.reg_buf(4096, 0, RW);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa.post_write(
            1,
            &[sge(p as u64, 4096, k.lkey)],
            dst.addr() as u64,
            dst.rkey(),
        )
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    // SAFETY: the peer's buffer, idle now.
    let got = unsafe { std::slice::from_raw_parts(dst.addr() as *const u8, 4096) };
    assert!(got.iter().all(|&b| b == 0x42));
    // A QP the application creates on the pool's own handles works too.
    let cq = pool.nic().create_cq(16).unwrap();
    let qp = pool.pd().create_qp(&cq, &cq, QpCaps::default()).unwrap();
    assert!(qp.qpn() > 0);
    // SAFETY: freed once.
    unsafe { pool.free_sized(p, layout) };
}

#[test]
fn the_clock_does_not_spin_while_an_exited_threads_block_stays_live() {
    let _g = serial();
    let bed = bed();
    // A zero delay: every idle slab is due at once, and the heap the thread leaves holds a
    // live block for as long as the test runs.
    let pool = purging_pool(&bed.a.pd, Some(Duration::ZERO), Registration::Pinned);
    let small = Layout::from_size_align(64, 8).unwrap();
    let live = blocks_from_a_thread(&pool, small, 1);
    std::thread::sleep(Duration::from_millis(200));
    let before = pool.stats().alloc;
    std::thread::sleep(Duration::from_secs(1));
    let after = pool.stats().alloc;
    // Looks at the exited thread's heap back off from 250 ms: a handful a second, not a
    // thousand. (This pool's own passes: other tests' pools run on the same clock.)
    assert!(after.purge_clock_running);
    assert!(
        after.purge_passes - before.purge_passes <= 12,
        "{} passes over the pool in a second",
        after.purge_passes - before.purge_passes
    );
    free_all(&pool, &live, small);
    assert!(pool.validate());
}

/// Threads that churn every small band, are asked to trim by a thread purging in a loop (so
/// their empty pages go on the shared lists at their next call), and exit leaving blocks for
/// another thread to free: whole slabs go on the lists and off them to a purge while both race.
/// Nothing live changes, debug builds check that no listed page is in a range a purge forgets,
/// everything comes back, and the pool validates. A stress test, not a replay: the race the
/// checks guard (a slab's idle stamp written outside its list's lock, fixed in 4873fb7) needs a
/// purge to scan the slab's pages at the moment its stamp changes.
#[test]
fn threads_exiting_while_another_thread_purges_lose_nothing() {
    let _g = serial();
    let bed = default_bed();
    let pool = purging_pool(&bed.a.pd, Some(Duration::ZERO), Registration::Auto);
    let sizes = [16usize, 48, 200, 1000, 3000, 9000, 40 << 10];
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let purger = s.spawn(|| {
            let mut purges = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                pool.purge();
                purges += 1;
            }
            purges
        });
        // Eight generations (two in the emulated guest: `common::scaled`).
        for generation in 0..common::scaled(8) as u64 {
            let (tx, rx) = std::sync::mpsc::channel::<Vec<(usize, usize, u64)>>();
            for t in 0..24u64 {
                let (tx, pool) = (tx.clone(), &pool);
                s.spawn(move || {
                    let mut handed = Vec::new();
                    // Rounds of blocks filled and freed: the purges ask this thread to trim,
                    // and at its next call its empty pages go on the shared lists.
                    for round in 0..4u64 {
                        let seed = generation << 40 | t << 16 | round << 8;
                        let mut kept = Vec::new();
                        for i in 0..48u64 {
                            let n = sizes[(t + round + i) as usize % sizes.len()];
                            let p = pool.alloc(Layout::from_size_align(n, 8).unwrap());
                            assert!(!p.is_null());
                            let b = (p as usize, n, seed | i);
                            fill(b);
                            if round == 3 && i % 3 == 0 {
                                handed.push(b)
                            } else {
                                kept.push(b)
                            }
                        }
                        for b in kept {
                            check_and_free(pool, b);
                        }
                    }
                    tx.send(handed).unwrap();
                });
            }
            drop(tx);
            // Freed by this thread after their owners exited (or while they exit): their pages
            // empty on abandoned heaps and go on the shared lists.
            for handed in rx {
                for b in handed {
                    check_and_free(&pool, b);
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(purger.join().unwrap() > 0);
    });
    assert!(pool.validate());
    // The clock may hold the purge lock at the moment (a `purge()` then returns 0): purge
    // again until everything came back, for at most 5 s.
    let all_back = (0..500).any(|_| {
        pool.purge();
        let done = pool.stats().alloc.arena.committed_bytes == 0;
        if !done {
            std::thread::sleep(Duration::from_millis(10));
        }
        done
    });
    assert!(all_back, "all came back: {:?}", pool.stats().alloc.arena);
    assert_eq!(stale(&bed), 0);
}

fn fill((p, n, seed): (usize, usize, u64)) {
    // SAFETY: a fresh block of `n` bytes.
    let block = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) };
    for (i, b) in block.iter_mut().enumerate() {
        *b = super::pattern(seed, i);
    }
}

fn check_and_free(pool: &Pool, (p, n, seed): (usize, usize, u64)) {
    // SAFETY: a live block of `n` bytes, filled by `fill`.
    let block = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
    assert!(
        block
            .iter()
            .enumerate()
            .all(|(i, &b)| b == super::pattern(seed, i)),
        "a live block of {n} bytes changed"
    );
    // SAFETY: freed once, with its layout.
    unsafe { pool.free_sized(p as *mut u8, Layout::from_size_align(n, 8).unwrap()) };
}

#[test]
fn live_blocks_stays_exact_while_the_clock_collects_exited_threads_pages() {
    let pd = Nic::soft().alloc_pd().unwrap();
    let pool = purging_pool(&pd, Some(Duration::ZERO), Registration::Pinned);
    let l = Layout::from_size_align(200, 8).unwrap();
    // 300 rounds (75 in the emulated guest: `common::scaled`).
    for round in 0..common::scaled(300).max(75) {
        // The thread exits holding its blocks; these frees go into pages no thread owns,
        // which the clock's passes collect meanwhile (their remote frees, then their counts).
        let blocks = blocks_from_a_thread(&pool, l, 64);
        assert_eq!(pool.live_blocks(), 64, "round {round}");
        free_all(&pool, &blocks, l);
        for _ in 0..20 {
            assert_eq!(pool.live_blocks(), 0, "round {round}");
        }
    }
    assert!(pool.validate());
}

#[test]
fn a_region_over_several_freed_units_goes_back_whole_though_its_keys_were_handed_out() {
    let nic = Nic::soft();
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = purging_pool(&pd, None, Registration::Pinned);
    // Large runs of two slabs, and 512 KiB pages (slabs registered whole), one after the
    // other: the tail region grows over them while its keys are not handed out.
    let big = Layout::from_size_align(3 << 20, 4096).unwrap();
    let page = Layout::from_size_align(300 << 10, 8).unwrap();
    let runs: Vec<usize> = (0..3).map(|_| pool.alloc(big) as usize).collect();
    assert!(runs.iter().all(|&p| p != 0));
    let pages = blocks_from_a_thread(&pool, page, 8);
    // Then every block's keys are handed out.
    let regions: std::collections::BTreeSet<(usize, usize)> = runs
        .iter()
        .chain(&pages)
        .map(|&p| pool.keys_of(p as *const u8).unwrap())
        .map(|k| (k.addr, k.len))
        .collect();
    assert!(
        regions.iter().any(|&(_, len)| len > 2 * SLAB),
        "a region over several units: {regions:?}"
    );
    free_all(&pool, &runs, big);
    free_all(&pool, &pages, page);
    pool.purge();
    let arena = pool.stats().alloc.arena;
    if cfg!(feature = "memcheck") {
        return; // which keeps freed memory as it is
    }
    // Every unit it covers was due in the same pass: the region went whole, its keys with it.
    assert_eq!(soft.pinned_bytes(), 0, "{arena:?}");
    assert_eq!(arena.registered_bytes, 0, "{arena:?}");
    assert_eq!(arena.purges_refused, 0, "{arena:?}");
    for &p in runs.iter().chain(&pages) {
        assert_eq!(pool.keys_of(p as *const u8), None);
    }
    // Used again: committed, registered anew, zero.
    let p = pool.alloc_zeroed(big);
    assert!(!p.is_null() && pool.keys_of(p).is_some());
    // SAFETY: a fresh zeroed block of `big`.
    assert!(
        unsafe { std::slice::from_raw_parts(p, big.size()) }
            .iter()
            .all(|&b| b == 0)
    );
    // SAFETY: a block of `pool`, freed once.
    unsafe { pool.free_sized(p, big) };
    assert!(pool.validate());
}
