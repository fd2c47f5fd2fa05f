//! ODP prefetch (`rdma_pool::prefetch`): fresh ODP memory is faulted into the NIC before a
//! peer touches it; `PrefetchNoFault` maps only what the CPU has; `advise_mr`'s errors are
//! retried, turn prefetch off, or come back typed; the refill keeps slabs ready and stops
//! cleanly. Runs on two soft NICs (which count the NIC's page faults), and on `rxe0`/`rxe1` in
//! the QEMU guest with ODP forced (`RDMA_POOL_TEST_NIC=verbs`).

#[path = "../common/mod.rs"]
mod common;

use common::*;
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages, Registration};
use rdma_pool::nic::*;
use rdma_pool::prefetch::PrefetchError;
use std::alloc::Layout;
use std::time::{Duration, Instant};

/// An ODP pool on `pd`, prefetching or not, with the opt-in remote write right so the peer can
/// write with the pool's key.
fn odp_pool(pd: &Pd, prefetch: bool) -> Pool {
    // SAFETY: the test's peers write only blocks the test hands them, and the test reads
    // those only after the write completed.
    unsafe {
        Pool::with_remote_rights(
            pd,
            ArenaConfig {
                reserve: 1 << 32,
                chunk: 1 << 26,
                hugepages: Hugepages::Off,
                registration: Registration::Odp,
                remote: Access::REMOTE_WRITE,
                purge_delay: None,
                prefetch,
                ..Default::default()
            },
        )
    }
    .unwrap()
}

fn faults(nic: &Nic) -> u64 {
    nic.as_soft().map_or(0, |s| s.counters().page_faults)
}

/// The peer WRITEs `len` bytes of `fill` at `p` (pool memory) with the pool's key, and the
/// bytes land.
fn peer_writes(bed: &Bed, pool: &Pool, p: *mut u8, len: usize, fill: u8) {
    let (_m, src) = bed.a.reg_buf(len, fill, RW);
    let k = pool.keys_of(p).unwrap();
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa
            .post_write(1, &[src.sge(0, len).unwrap()], p as u64, k.rkey)
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    // SAFETY: `len` bytes of a live block of the pool.
    assert!(
        unsafe { std::slice::from_raw_parts(p, len) }
            .iter()
            .all(|&b| b == fill)
    );
}

/// One slab's run: the block fills it, less the guard page memory-checker mode keeps after a
/// large run (none without the feature).
const RUN: usize = 2 << 20;
const BLOCK: usize = RUN - rdma_pool::alloc::LARGE_GUARD;

fn block() -> Layout {
    Layout::from_size_align(BLOCK, 4096).unwrap()
}

#[test]
fn a_peers_first_write_into_fresh_odp_memory_faults_only_without_prefetch() {
    let _s = serial();
    let bed = bed();
    for prefetch in [false, true] {
        let pool = odp_pool(&bed.b.pd, prefetch);
        let p = pool.alloc(block());
        let before = faults(&bed.b.nic);
        peer_writes(&bed, &pool, p, 64 << 10, 0x5A);
        let taken = faults(&bed.b.nic) - before;
        if bed.b.nic.as_soft().is_some() {
            assert_eq!(taken, if prefetch { 0 } else { 16 }, "prefetch {prefetch}");
        }
        let s = pool.stats().prefetch;
        assert_eq!(s.automatic_enabled, prefetch && bed.b.nic.caps().advise_mr);
        assert_eq!(s.automatic > 0, s.automatic_enabled, "{s:?}");
        assert_eq!(s.automatic_failures, 0, "{s:?}");
        // SAFETY: the block of this pool with this layout.
        unsafe { pool.free_sized(p, block()) };
        // Purged memory is faulted back on reuse when prefetch is on.
        assert_eq!(pool.purge(), RUN);
        let q = pool.alloc(block());
        assert_eq!(q, p);
        let before = faults(&bed.b.nic);
        peer_writes(&bed, &pool, q, 64 << 10, 0xA5);
        if bed.b.nic.as_soft().is_some() {
            assert_eq!(faults(&bed.b.nic) - before, if prefetch { 0 } else { 16 });
        }
        // SAFETY: as above.
        unsafe { pool.free_sized(q, block()) };
    }
}

#[test]
fn advice_with_and_without_flush_and_no_fault_leaves_absent_pages_alone() {
    let _s = serial();
    let bed = bed();
    let pool = odp_pool(&bed.b.pd, false);
    let p = pool.alloc(block());
    // SAFETY: a live block of `BLOCK` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(p, BLOCK) };
    let lkey = pool.keys_of(p).unwrap().lkey;
    let soft = bed.b.nic.as_soft();
    let resident = |at: usize| soft.is_some_and(|s| s.is_resident(lkey, p as usize + at));
    // The CPU keeps the first 64 KiB only (the application dropped the rest; on hardware the
    // MMU notifier drops their NIC translations, here the test tells the soft NIC):
    // NO_FAULT maps those, and nothing else.
    buf[..64 << 10].fill(1);
    // SAFETY: the range is ours and its contents are not needed.
    let r = unsafe {
        libc::madvise(
            p.add(64 << 10).cast(),
            BLOCK - (64 << 10),
            libc::MADV_DONTNEED,
        )
    };
    assert_eq!(r, 0);
    if let Some(s) = soft {
        s.invalidate_odp_range(p as usize + (64 << 10), BLOCK - (64 << 10));
    }
    assert_eq!(
        pool.prefetch(&buf[..1 << 20], Advice::PrefetchNoFault)
            .unwrap(),
        1 << 20
    );
    if soft.is_some() {
        assert!(resident(0) && resident(60 << 10));
        assert!(!resident(64 << 10) && !resident(512 << 10));
    }
    // PREFETCH_WRITE faults in the rest; without FLUSH the device may do it later.
    let (lo, hi) = buf.split_at(BLOCK / 2);
    let n = pool
        .prefetch_all(&[lo, hi], Advice::PrefetchWrite, AdviseFlags::empty())
        .unwrap();
    assert_eq!(n, BLOCK);
    pool.prefetch(&buf[1 << 20..], Advice::Prefetch).unwrap();
    pool.prefetch(buf, Advice::PrefetchWrite).unwrap();
    if soft.is_some() {
        assert!(resident(64 << 10) && resident(BLOCK - 4096));
    }
    let before = faults(&bed.b.nic);
    peer_writes(&bed, &pool, p, BLOCK, 7);
    if soft.is_some() {
        assert_eq!(faults(&bed.b.nic), before);
    }
    let s = pool.stats().prefetch;
    assert!(s.advise_calls >= 4 && s.pages >= 3 * 256, "{s:?}");
    // SAFETY: as above.
    unsafe { pool.free_sized(p, block()) };
}

#[test]
fn advise_errors_are_retried_turn_prefetch_off_or_come_back_typed() {
    let _s = serial();
    let bed = soft_bed(Default::default());
    let soft = bed.b.nic.as_soft().unwrap();
    let pool = odp_pool(&bed.b.pd, true);
    let p = pool.alloc(block());
    // SAFETY: a live block.
    let buf = unsafe { std::slice::from_raw_parts(p, 4096) };
    // EAGAIN twice: retried, then done.
    soft.fail_next(Verb::AdviseMr, 2, libc::EAGAIN);
    pool.prefetch(buf, Advice::PrefetchWrite).unwrap();
    let s = pool.stats().prefetch;
    assert_eq!((s.retries, s.failures[0]), (2, 2), "{s:?}");
    // ENOMEM past every retry: Busy.
    soft.fail_next(Verb::AdviseMr, 10, libc::ENOMEM);
    assert!(matches!(
        pool.prefetch(buf, Advice::PrefetchWrite),
        Err(PrefetchError::Busy {
            errno: libc::ENOMEM
        })
    ));
    soft.fail_next(Verb::AdviseMr, 0, 0);
    // A wrong range, access or key: typed, and prefetch stays on.
    for (errno, check) in [
        (
            libc::EFAULT,
            (|e| matches!(e, PrefetchError::Fault)) as fn(&PrefetchError) -> bool,
        ),
        (libc::EINVAL, |e| matches!(e, PrefetchError::Invalid)),
        (libc::EPERM, |e| matches!(e, PrefetchError::Denied)),
        (libc::ENOENT, |e| matches!(e, PrefetchError::StaleKey)),
    ] {
        soft.fail_next(Verb::AdviseMr, 1, errno);
        let e = pool.prefetch(buf, Advice::Prefetch).unwrap_err();
        assert!(check(&e), "{errno}: {e}");
    }
    // An automatic prefetch that fails is counted and the run is served.
    soft.fail_next(Verb::AdviseMr, 1, libc::EFAULT);
    let q = pool.alloc(Layout::from_size_align(4 << 20, 4096).unwrap());
    assert!(!q.is_null() && pool.keys_of(q).is_some());
    assert_eq!(pool.stats().prefetch.automatic_failures, 1);
    // EOPNOTSUPP turns prefetch off for good; the pool keeps serving.
    soft.fail_next(Verb::AdviseMr, 1, libc::EOPNOTSUPP);
    assert!(matches!(
        pool.prefetch(buf, Advice::Prefetch),
        Err(PrefetchError::Unsupported)
    ));
    let s = pool.stats().prefetch;
    assert!(!s.enabled && !s.automatic_enabled, "{s:?}");
    assert_eq!(s.disabled_errno, Some(libc::EOPNOTSUPP));
    let calls = s.advise_calls;
    let r = pool.alloc(Layout::from_size_align(8 << 20, 4096).unwrap());
    assert!(!r.is_null());
    assert!(matches!(
        pool.prefetch(buf, Advice::Prefetch),
        Err(PrefetchError::Disabled {
            errno: libc::EOPNOTSUPP
        })
    ));
    assert_eq!(
        pool.stats().prefetch.advise_calls,
        calls,
        "no more advise calls"
    );
    // Bad ranges.
    assert!(matches!(
        pool.prefetch(&[0u8; 8], Advice::Prefetch),
        Err(PrefetchError::OutsidePool)
    ));
    // SAFETY: blocks of this pool with these layouts.
    unsafe {
        pool.free_sized(p, block());
        pool.free_sized(q, Layout::from_size_align(4 << 20, 4096).unwrap());
        pool.free_sized(r, Layout::from_size_align(8 << 20, 4096).unwrap());
    }
}

#[test]
fn pinned_memory_needs_no_prefetch() {
    let _s = serial();
    let bed = bed();
    let pool = Pool::with_config(
        &bed.b.pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            ..Default::default()
        },
    )
    .unwrap();
    let v = allocator_api2::vec![in &pool; 0u8; 4096];
    assert_eq!(pool.prefetch(&v, Advice::PrefetchWrite).unwrap(), 0);
    let s = pool.stats().prefetch;
    assert_eq!((s.automatic_enabled, s.advise_calls), (false, 0));
}

/// Threads of this process named like the refill thread.
fn refill_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim() == "rdma-pool-refil")
        .count()
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_refill_keeps_prefetched_slabs_ready_and_stops_cleanly() {
    let _s = serial();
    let bed = bed();
    let pool = odp_pool(&bed.b.pd, true);
    pool.start_refill(4).unwrap();
    until("a full reserve", || {
        pool.stats().prefetch.reserve_slabs == 4
    });
    assert_eq!(refill_threads(), 1);
    // Three one-slab blocks come from the reserve, ready: the peer's writes take no fault.
    let blocks: Vec<_> = (0..3).map(|_| pool.alloc(block())).collect();
    assert_eq!(pool.stats().prefetch.reserve_hits, 3);
    let before = faults(&bed.b.nic);
    for &p in &blocks {
        peer_writes(&bed, &pool, p, 64 << 10, 3);
    }
    if bed.b.nic.as_soft().is_some() {
        assert_eq!(faults(&bed.b.nic), before);
    }
    until("the refill", || pool.stats().prefetch.reserve_slabs == 4);
    assert!(pool.stats().prefetch.refilled >= 7);
    pool.stop_refill();
    // Joined; the kernel may list the exited thread in /proc for a moment longer.
    until("the thread gone", || refill_threads() == 0);
    let s = pool.stats().prefetch;
    assert_eq!(
        (s.reserve_target, s.reserve_slabs),
        (0, 4),
        "the ready slabs stay"
    );
    // Restarted, and dropped with the pool: the thread goes with it.
    pool.start_refill(2).unwrap();
    until("the thread", || refill_threads() == 1);
    // The restarted thread refills what is taken from the reserve.
    let more: Vec<_> = (0..4).map(|_| pool.alloc(block())).collect();
    until("the restarted refill", || {
        pool.stats().prefetch.reserve_slabs == 2
    });
    for p in blocks.into_iter().chain(more) {
        // SAFETY: blocks of this pool with this layout.
        unsafe { pool.free_sized(p, block()) };
    }
    assert!(pool.validate());
    drop(pool);
    until("the thread gone with the pool", || refill_threads() == 0);
}

#[test]
fn refill_start_and_stop_from_two_threads_never_hang_or_leak_a_thread() {
    let _s = serial();
    let bed = bed();
    let pool = odp_pool(&bed.b.pd, true);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..50 {
                pool.start_refill(2).unwrap();
            }
        });
        for _ in 0..50 {
            pool.stop_refill();
        }
    });
    pool.start_refill(1).unwrap();
    until("a running refill", || {
        pool.stats().prefetch.reserve_slabs >= 1
    });
    pool.stop_refill();
    until("no refill thread", || refill_threads() == 0);
    assert_eq!(pool.stats().prefetch.reserve_target, 0);
}
