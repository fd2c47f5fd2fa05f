//! Memory-checker mode (feature `memcheck`, `src/alloc/memcheck.rs`): what a checker sees
//! inside the pool. Built without the feature this binary is empty. `scripts/memcheck.sh` runs
//! it (and every other test binary) twice: with the feature alone, where the fill and the
//! counters are checked, and under AddressSanitizer (`--cfg rdma_pool_asan`), where freed
//! blocks and guard pages must be poisoned and a forked child that writes a freed block or past
//! a large run must die with ASan's report. The NIC reads into live blocks first (rxe in
//! the QEMU guest), so DMA into handed-out memory is seen to raise nothing.
#![cfg(feature = "memcheck")]

#[path = "../common/mod.rs"]
mod common;

use common::*;
use rdma_pool::Pool;
use rdma_pool::alloc::{FREED, GUARD_FILL, asan_poisoned, memcheck_stats};
use rdma_pool::nic::*;
use std::alloc::Layout;

/// A small block, a larger one, a medium one (all size classes), a large run.
const SIZES: [usize; 4] = [48, 5000, 100_000, 3 << 20];

fn layout(size: usize) -> Layout {
    Layout::from_size_align(size, 8).unwrap()
}

fn asan() -> bool {
    memcheck_stats().asan
}

/// Read `len` bytes of a peer's buffer (filled with `fill`) into `p` through the pool's keys.
fn nic_reads_into(pool: &Pool, peer: &Side, p: *mut u8, len: usize, fill: u8) {
    let cq = pool.nic().create_cq(16).unwrap();
    let qp = pool.pd().create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let pqp = peer.qp();
    link(&qp, &pqp);
    let (mem, mr) = peer.reg_buf(len, fill, RW);
    // SAFETY: a live block of at least `len` bytes.
    let block = unsafe { std::slice::from_raw_parts(p, len) };
    let sge = pool.sge_of(block).unwrap();
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe { qp.post_read(1, &[sge], mr.addr() as u64, mr.rkey()) }.unwrap();
    assert_eq!(cq.wait_one(WAIT).unwrap().status, WcStatus::Success);
    assert!(block.iter().all(|&b| b == fill));
    drop((mr, mem));
}

#[test]
fn freed_blocks_carry_the_fill_and_blocks_handed_out_again_are_clean() {
    let _g = serial();
    let (na, nb) = nics();
    let peer = Side::new(nb);
    let pool = Pool::with_config(&na.alloc_pd().unwrap(), small_arena()).unwrap();
    let before = memcheck_stats();
    assert!(before.enabled);
    for size in SIZES {
        let p = pool.alloc(layout(size));
        let usable = pool.usable_size(p).unwrap();
        assert!(usable >= size);
        nic_reads_into(&pool, &peer, p, size.min(64 << 10), 0x77);
        if asan() {
            assert_eq!(asan_poisoned(p, usable), Some(false), "{size}: live");
        }
        let large = size > rdma_pool::alloc::MAX_SMALL;
        if large {
            // The guard page after the run: filled, and poisoned under ASan.
            let g = p.wrapping_add(usable);
            if asan() {
                assert_eq!(asan_poisoned(g, 1), Some(true), "the guard page");
            } else {
                // SAFETY: the guard page belongs to the live run (not under ASan: unpoisoned).
                let guard = unsafe { std::slice::from_raw_parts(g, rdma_pool::alloc::LARGE_GUARD) };
                assert!(guard.iter().all(|&b| b == GUARD_FILL));
            }
        }
        // SAFETY: from this pool, freed once.
        unsafe { pool.free(p) };
        // A size-class block keeps its first word (the pool's free-list link).
        let skip = if size <= rdma_pool::alloc::MAX_SMALL {
            8
        } else {
            0
        };
        if asan() {
            assert_eq!(
                asan_poisoned(p.wrapping_add(skip), usable - skip),
                Some(true),
                "{size}: freed"
            );
            assert_eq!(asan_poisoned(p.wrapping_add(skip), 8), Some(true));
        } else {
            let n = (usable - skip).min(rdma_pool::alloc::FILL_MAX);
            // SAFETY: the freed block is still mapped pool memory (test-only read).
            let fill = unsafe { std::slice::from_raw_parts(p.add(skip), n) };
            assert!(fill.iter().all(|&b| b == FREED), "{size}: not filled");
        }
        // The same block again (the thread cache, the page, the cached run): clean. Asked for
        // by the block's own class: an unsized free caches a small block in the class of its
        // page, which for a sparse size is its group leader's (`alloc/heap/sparse.rs`).
        let again = if size <= rdma_pool::alloc::MAX_SMALL {
            usable
        } else {
            size
        };
        let q = pool.alloc(layout(again));
        assert_eq!(q, p, "{size}");
        if asan() {
            assert_eq!(asan_poisoned(q, usable), Some(false), "{size}: handed out");
        }
        nic_reads_into(&pool, &peer, q, size.min(64 << 10), 0x78);
        // SAFETY: as above.
        unsafe { pool.free(q) };
    }
    let after = memcheck_stats();
    assert!(after.poisoned_blocks >= before.poisoned_blocks + 8);
    assert!(after.guards >= before.guards + 2);
    assert!(
        after.checked_blocks >= before.checked_blocks + 2,
        "{after:?}"
    );
    assert_eq!(after.writes_after_free, before.writes_after_free);
    assert_eq!(after.overruns, before.overruns);
    assert!(pool.validate());
    assert_eq!(pool.live_blocks(), 0);
}

#[test]
fn a_page_recycled_for_another_class_hands_out_clean_blocks() {
    let _g = serial();
    let pool = Pool::with_config(&Nic::soft().alloc_pd().unwrap(), small_arena()).unwrap();
    let before = memcheck_stats();
    // Fill pages of one class, free them all (the pages go back to the pool), then take the
    // same memory in another class: no false write-after-free, and every block addressable.
    let a: Vec<_> = (0..4000).map(|_| pool.alloc(layout(48))).collect();
    for &p in &a {
        // SAFETY: from this pool, freed once.
        unsafe { pool.free(p) };
    }
    let b: Vec<_> = (0..3000).map(|_| pool.alloc(layout(72))).collect();
    for &p in &b {
        if asan() {
            assert_eq!(asan_poisoned(p, 72), Some(false));
        }
        // SAFETY: a live block of 72 bytes.
        unsafe { std::ptr::write_bytes(p, 1, 72) };
    }
    for &p in &b {
        // SAFETY: as above.
        unsafe { pool.free(p) };
    }
    assert_eq!(memcheck_stats().writes_after_free, before.writes_after_free);
    assert!(pool.validate());
}

/// The bad accesses, run in a forked child under ASan (they would abort the whole test
/// process) and in-process otherwise.
fn write_after_free(pool: &Pool) -> *mut u8 {
    let p = pool.alloc(layout(64));
    // SAFETY: from this pool, freed once.
    unsafe { pool.free(p) };
    // SAFETY: test-only: a write into a freed block (still mapped pool memory).
    unsafe { p.add(20).write_volatile(1) };
    p
}

fn overrun(pool: &Pool) -> *mut u8 {
    let p = pool.alloc(layout(3 << 20));
    let usable = pool.usable_size(p).unwrap();
    // SAFETY: test-only: one byte past the run's usable bytes (its guard page, mapped).
    unsafe { p.add(usable).write_volatile(0) };
    // SAFETY: from this pool, freed once.
    unsafe { pool.free(p) };
    p
}

/// Run `case` on `pool` in a forked child whose stderr is a pipe: it must die with ASan's
/// report. (The pool's fork gate leaves its locks free in the child; the parent warmed the
/// block the case takes, so the child does not grow the arena.)
fn dies_under_asan(pool: &Pool, case: fn(&Pool) -> *mut u8) {
    let mut fds = [0; 2];
    // SAFETY: a fresh pipe into `fds`.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child runs `case` and leaves with `_exit`; it never returns into the harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: the child's stderr becomes the pipe's write end.
        unsafe { libc::dup2(fds[1], 2) };
        let _ = case(pool);
        // Reaching this point under ASan is the failure the parent reports.
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: the parent keeps the read end only, and reads it until the child closed it.
    let stderr = unsafe {
        libc::close(fds[1]);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len());
            if n <= 0 {
                break;
            }
            out.extend_from_slice(&buf[..n as usize]);
        }
        libc::close(fds[0]);
        String::from_utf8_lossy(&out).into_owned()
    };
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0),
        "the child survived"
    );
    assert!(
        stderr.contains("AddressSanitizer: use-after-poison"),
        "{stderr}"
    );
}

#[test]
fn a_write_after_free_is_caught() {
    let _g = serial();
    let pool = Pool::with_config(&Nic::soft().alloc_pd().unwrap(), small_arena()).unwrap();
    if asan() {
        // SAFETY: warms this thread's cache of the class with a block, freed once.
        unsafe { pool.free(pool.alloc(layout(64))) };
        return dies_under_asan(&pool, write_after_free);
    }
    let before = memcheck_stats();
    let p = write_after_free(&pool);
    // The thread cache hands the same block out again: its fill is checked.
    let q = pool.alloc(layout(64));
    assert_eq!(q, p);
    let after = memcheck_stats();
    assert_eq!(after.writes_after_free, before.writes_after_free + 1);
    assert_eq!(after.last_write_after_free, p as usize);
    // SAFETY: from this pool, freed once.
    unsafe { pool.free(q) };
}

#[test]
fn an_overrun_of_a_large_run_is_caught_by_its_guard_page() {
    let _g = serial();
    let pool = Pool::with_config(&Nic::soft().alloc_pd().unwrap(), small_arena()).unwrap();
    if asan() {
        // SAFETY: leaves a cached run of the case's size, freed once.
        unsafe { pool.free(pool.alloc(layout(3 << 20))) };
        return dies_under_asan(&pool, overrun);
    }
    let before = memcheck_stats();
    let p = overrun(&pool);
    let after = memcheck_stats();
    assert_eq!(after.overruns, before.overruns + 1);
    assert_eq!(after.last_overrun, p as usize);
    // The run is reused with a fresh guard.
    let q = pool.alloc(layout(3 << 20));
    assert_eq!(q, p);
    // SAFETY: from this pool, freed once.
    unsafe { pool.free(q) };
    assert_eq!(memcheck_stats().overruns, after.overruns);
}

#[test]
fn blocks_resized_in_place_keep_the_fill_exact() {
    let _g = serial();
    let pool = Pool::with_config(&Nic::soft().alloc_pd().unwrap(), small_arena()).unwrap();
    let before = memcheck_stats();
    // An over-aligned small block resized in place (same alignment, a smaller size of its
    // class) keeps its class; its free fills the whole block, so handing it out again finds
    // no stale bytes. (To a smaller alignment it would move: a sized free with that layout
    // would take the size's class, not the block's.)
    let (a, b) = (
        Layout::from_size_align(24, 16).unwrap(),
        Layout::from_size_align(20, 16).unwrap(),
    );
    let p = pool.alloc(a);
    // SAFETY: a live block of 24 bytes.
    unsafe { p.write_bytes(0x11, 24) };
    // SAFETY: `p` came from this pool with `a`.
    let q = unsafe { pool.resize(p, a, b) };
    assert_eq!(q, p, "resized in place");
    let usable = pool.usable_size(q).unwrap();
    assert!(usable > 24);
    // SAFETY: a live block of `usable` bytes (the whole block is the caller's).
    unsafe { q.write_bytes(0x22, usable) };
    // SAFETY: `q` came from this pool, last resized to `b`.
    unsafe { pool.free_sized(q, b) };
    if asan() {
        assert_eq!(asan_poisoned(q.wrapping_add(8), usable - 8), Some(true));
        assert_eq!(asan_poisoned(q.wrapping_add(usable - 8), 8), Some(true));
    }
    // Freed to its page: the next block of its class is this one, and its fill is checked
    // over the whole block.
    let checked = memcheck_stats().checked_blocks;
    let r = pool.alloc(b);
    assert_eq!(r, q);
    if !asan() {
        assert_eq!(memcheck_stats().checked_blocks, checked + 1);
    }
    // To a smaller alignment the block moves, its bytes copied.
    // SAFETY: a live block of 20 bytes.
    unsafe { r.write_bytes(0x44, 20) };
    let small = Layout::from_size_align(20, 8).unwrap();
    // SAFETY: `r` came from this pool with `b`.
    let moved = unsafe { pool.resize(r, b, small) };
    assert_ne!(moved, r, "a smaller alignment takes the size's class");
    // SAFETY: both blocks' first 20 bytes: the copy.
    assert!(
        unsafe { std::slice::from_raw_parts(moved, 20) }
            .iter()
            .all(|&x| x == 0x44)
    );
    let r = moved;
    // SAFETY: as above.
    unsafe { pool.free(r) };
    // A block grown past its class moves: the copy keeps its bytes, the old block is freed
    // (filled), and a block of the new class is clean.
    let big = Layout::from_size_align(3 << 13, 8).unwrap();
    let m = pool.alloc(big);
    // SAFETY: a live block of 24 KiB.
    unsafe { m.write_bytes(0x33, 3 << 13) };
    // SAFETY: `m` came from this pool with `big`.
    let m2 = unsafe { pool.realloc(m, big, 70_000) };
    assert_ne!(m2, m, "another class");
    // SAFETY: the first 24 KiB of the moved block were copied.
    assert!(
        unsafe { std::slice::from_raw_parts(m2, 3 << 13) }
            .iter()
            .all(|&b| b == 0x33)
    );
    if asan() {
        assert_eq!(
            asan_poisoned(m.wrapping_add(8), 8),
            Some(true),
            "the old block"
        );
    } else {
        // SAFETY: a freed block of a live page (test-only read).
        assert_eq!(unsafe { *m.wrapping_add(8) }, FREED);
    }
    let n = pool.alloc(Layout::from_size_align(9000, 8).unwrap());
    if asan() {
        assert_eq!(asan_poisoned(n, 9000), Some(false));
    }
    // SAFETY: a live block of 9000 bytes.
    unsafe { n.write_bytes(0x44, 9000) };
    // SAFETY: from this pool, freed once each.
    unsafe {
        pool.free(n);
        pool.free(m2);
    }
    let after = memcheck_stats();
    assert_eq!(after.writes_after_free, before.writes_after_free);
    assert!(pool.validate());
}
