//! `fork()` next to the pool, following the arena's fork policy (`arena/fork.rs`):
//! - `KernelCopies` (the kernel copies pinned pages for a child: `IBV_FORK_UNNEEDED`, and every
//!   ODP arena): the child reads its own copy of the heap, writes it without touching the
//!   parent's, and allocates from the pool (new memory too);
//! - `DontFork` (chunks `MADV_DONTFORK`): a child that touches pool memory faults, and one that
//!   only `exec`s runs;
//! - either way the parent's data and registrations are intact after the child: a WRITE of the
//!   parent's buffer to a peer moves its bytes.
//!
//! And a fork while other threads are inside the pool's slow paths (growth, page lists, medium
//! slabs, large runs, purge, cross-thread frees): the pool's `pthread_atfork` gate
//! (`sys/atfork.rs`) waits for them to leave, so every child finds the pool's locks free and
//! allocates (a child that hangs is killed by `alarm` and fails the test).
//!
//! The tests run one at a time: a child of a multi-threaded test harness must not meet a lock
//! another test thread holds outside the pool (the harness's own). On the soft NIC (whose `SoftConfig::fork` picks the policy), and
//! in the QEMU guest, where the same soft NICs run under the guest's kernel.

#[path = "../common/mod.rs"]
mod common;

use common::*;
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, ForkPolicy, Hugepages, Registration};
use rdma_pool::nic::soft::SoftConfig;
use rdma_pool::nic::*;
use std::alloc::Layout;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

const LEN: usize = 3 << 20;

fn pool_with(fork: ForkStatus, registration: Registration) -> (Side, Side, Pool) {
    let cfg = SoftConfig {
        fork,
        ..Default::default()
    };
    let (server, peer) = (
        Side::new(Nic::soft_with(cfg.clone())),
        Side::new(Nic::soft_with(cfg)),
    );
    let pool = Pool::with_config(
        &server.pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 24,
            hugepages: Hugepages::Off,
            registration,
            purge_delay: None,
            ..Default::default()
        },
    )
    .unwrap();
    (server, peer, pool)
}

/// Run `child` in a forked child (its return value is the exit status; a panic is 101) and
/// return how the child ended: `Ok(status)` or `Err(signal)`.
fn in_child(child: impl FnOnce() -> i32) -> Result<i32, i32> {
    // SAFETY: the child runs `child` and leaves with `_exit`, without unwinding into the
    // harness or running its destructors.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(101);
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else {
        Err(libc::WTERMSIG(status))
    }
}

/// The parent's block is what it wrote, and still moves through its registration.
fn parent_intact(server: &Side, peer: &Side, pool: &Pool, p: *mut u8, byte: u8) {
    // SAFETY: a live block of LEN bytes.
    let s = unsafe { std::slice::from_raw_parts(p, LEN) };
    assert!(
        s.iter().all(|&b| b == byte),
        "the child changed the parent's memory"
    );
    let (qa, qb) = connect(server, peer);
    let (mem, mr) = peer.reg_buf(LEN, 0, RW);
    let sge = pool.sge_of(s).unwrap();
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { qa.post_write(1, &[sge], mr.addr() as u64, mr.rkey()) }.unwrap();
    assert_eq!(server.wait().status, WcStatus::Success);
    assert!(mem.as_slice().iter().all(|&b| b == byte));
    drop((qa, qb));
}

#[test]
fn children_follow_the_fork_policy_and_parents_keep_their_memory() {
    let _g = serial();
    let l = Layout::from_size_align(LEN, 4096).unwrap();

    // KernelCopies, pinned and ODP: the child has a copy and can allocate.
    for registration in [Registration::Pinned, Registration::Odp] {
        let (server, peer, pool) = pool_with(ForkStatus::Unneeded, registration);
        assert_eq!(pool.stats().alloc.arena.fork, ForkPolicy::KernelCopies);
        let p = pool.alloc(l);
        // SAFETY: a fresh block of LEN bytes.
        unsafe { std::ptr::write_bytes(p, 0x5A, LEN) };
        let child = in_child(|| {
            // SAFETY: the child's copy of the parent's block.
            let s = unsafe { std::slice::from_raw_parts_mut(p, LEN) };
            if !s.iter().all(|&b| b == 0x5A) {
                return 2;
            }
            s.fill(0xC1);
            // New blocks, small and large (a fresh run: the arena grows in the child).
            for n in [64usize, 100_000, 20 << 20] {
                let q = pool.alloc(Layout::from_size_align(n, 8).unwrap());
                if q.is_null() {
                    return 3;
                }
                // SAFETY: a fresh block of `n` bytes.
                unsafe {
                    std::ptr::write_bytes(q, 0x77, n);
                    if *q.add(n - 1) != 0x77 {
                        return 4;
                    }
                    pool.free(q);
                }
            }
            if !pool.validate() {
                return 5;
            }
            0
        });
        assert_eq!(
            child,
            Ok(0),
            "{registration:?}: the child could not use its copy"
        );
        parent_intact(&server, &peer, &pool, p, 0x5A);
        // SAFETY: from this pool.
        unsafe { pool.free(p) };
        assert!(pool.validate());
    }

    // DontFork: the child has no pool memory (it faults), a child that only execs runs.
    let (server, peer, pool) = pool_with(ForkStatus::Enabled, Registration::Pinned);
    assert_eq!(pool.stats().alloc.arena.fork, ForkPolicy::DontFork);
    let p = pool.alloc(l);
    // SAFETY: a fresh block.
    unsafe { std::ptr::write_bytes(p, 0x3C, LEN) };
    let touched = in_child(|| {
        // SAFETY: test-only: the read faults in the child (the chunk is MADV_DONTFORK).
        let b = unsafe { std::ptr::read_volatile(p) };
        i32::from(b)
    });
    assert_eq!(
        touched,
        Err(libc::SIGSEGV),
        "a DontFork child must not see pool memory"
    );
    let execed = in_child(|| {
        let prog = c"/bin/sh";
        let args = [
            prog.as_ptr(),
            c"-c".as_ptr(),
            c"exit 7".as_ptr(),
            std::ptr::null(),
        ];
        // SAFETY: a NUL-terminated argument vector of C strings that live until exec.
        unsafe { libc::execv(prog.as_ptr(), args.as_ptr()) };
        9
    });
    assert_eq!(execed, Ok(7), "a DontFork child that execs runs");
    parent_intact(&server, &peer, &pool, p, 0x3C);
    // SAFETY: from this pool.
    unsafe { pool.free(p) };
    assert!(pool.validate());
}

/// Forks made while the churning threads run: 60, fewer in the emulated guest
/// (`common::scaled`, at least 15), where each fork copies the page tables under TCG.
fn forks() -> usize {
    scaled(60).max(15)
}

/// Allocate, free across threads, and purge until `stop`: the slow paths a fork may meet.
fn churn(pool: &Pool, shared: &std::sync::Mutex<Vec<usize>>, k: usize, stop: &AtomicBool) {
    let sizes = [24usize, 3000, 70_000, 300_000, 3 << 20];
    let mut mine: Vec<(usize, usize)> = Vec::new();
    let mut i = k;
    while !stop.load(Relaxed) {
        i += 1;
        let n = sizes[i % sizes.len()];
        let p = pool.alloc(Layout::from_size_align(n, 8).unwrap());
        assert!(!p.is_null());
        // SAFETY: a fresh block of `n` bytes.
        unsafe { p.write_bytes(k as u8, n.min(4096)) };
        if i % 3 == 0 {
            // Handed to another thread, which frees it.
            shared.lock().unwrap().push(p as usize);
        } else {
            mine.push((p as usize, n));
        }
        if mine.len() > 40 {
            for (q, _) in mine.drain(..20) {
                // SAFETY: from this pool, freed once.
                unsafe { pool.free(q as *mut u8) };
            }
        }
        let theirs = shared.lock().unwrap().pop();
        if let Some(q) = theirs {
            // SAFETY: a block another thread handed over, freed once.
            unsafe { pool.free(q as *mut u8) };
        }
        if i % 50 == 0 {
            pool.purge();
        }
    }
    for (q, _) in mine {
        // SAFETY: as above.
        unsafe { pool.free(q as *mut u8) };
    }
}

#[test]
fn children_forked_while_threads_are_inside_the_pool_can_allocate() {
    let _g = serial();
    for registration in [Registration::Pinned, Registration::Odp] {
        let (_server, _peer, pool) = pool_with(ForkStatus::Unneeded, registration);
        let before = rdma_pool::arena::fork_stats();
        let shared = std::sync::Mutex::new(Vec::new());
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let churners: Vec<_> = (0..3)
                .map(|k| {
                    let (pool, shared, stop) = (&pool, &shared, &stop);
                    sc.spawn(move || churn(pool, shared, k, stop))
                })
                .collect();
            let mut failed = None;
            for f in 0..forks() {
                let child = in_child(|| {
                    // SAFETY: a hung child dies of SIGALRM, which the parent reports.
                    unsafe { libc::alarm(20) };
                    if rdma_pool::arena::fork_stats().generation != before.generation + 1 {
                        return 2;
                    }
                    // The pool it inherited is consistent, although other threads were on
                    // lock-free fast paths when it forked (their heaps are left alone).
                    if !pool.validate() {
                        return 4;
                    }
                    // Every kind of block, and new memory (the arena grows in the child).
                    let mut held = Vec::new();
                    for n in [16usize, 500, 5000, 100_000, 2 << 20, 24 << 20] {
                        let q = pool.alloc(Layout::from_size_align(n, 8).unwrap());
                        if q.is_null() {
                            return 3;
                        }
                        // SAFETY: a fresh block of `n` bytes.
                        unsafe { q.write_bytes(0x6B, n) };
                        held.push(q);
                    }
                    pool.purge();
                    for q in held {
                        // SAFETY: from this pool, freed once.
                        unsafe { pool.free(q) };
                    }
                    if !pool.validate() {
                        return 5;
                    }
                    0
                });
                if child != Ok(0) {
                    failed = Some((f, child));
                    break;
                }
            }
            // Stop the churn before asserting: a panic here would leave the scope waiting.
            stop.store(true, Relaxed);
            // Joined one by one: the scope's own wait may return while an exiting thread still
            // runs its thread-local destructors (handing its heap back), and the pool is
            // validated below.
            for t in churners {
                t.join().unwrap();
            }
            if let Some((f, child)) = failed {
                panic!(
                    "{registration:?}: child {f} ended {child:?} (Err(14): hung, killed by SIGALRM)"
                );
            }
        });
        let after = rdma_pool::arena::fork_stats();
        assert!(after.forks >= before.forks + forks() as u64);
        assert_eq!(after.drain_timeouts, before.drain_timeouts);
        assert_eq!(
            after.generation, before.generation,
            "the parent's generation"
        );
        eprintln!(
            "{registration:?}: {} forks beside 3 churning threads; {} waited for a thread inside the pool (longest wait in this process so far: {} µs)",
            forks(),
            after.waited - before.waited,
            after.longest_wait_ns / 1000
        );
        assert!(
            pool.validate(),
            "{registration:?}: the arena part {}; {:?}",
            if pool.arena().validate() {
                "holds"
            } else {
                "fails"
            },
            pool.stats()
        );
    }
}

/// A pool on the purge clock with a short delay, on `side`'s PD.
fn clock_pool(side: &Side) -> Pool {
    Pool::with_config(
        &side.pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 24,
            hugepages: Hugepages::Off,
            registration: Registration::Pinned,
            purge_delay: Some(std::time::Duration::from_millis(10)),
            purge_thread: true,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Poll `pool`'s purged bytes (no allocator call) until they pass `than`, for up to `secs`.
fn purged_past(pool: &Pool, than: u64, secs: u64) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while pool.stats().alloc.arena.purged_bytes <= than {
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

#[test]
fn a_child_runs_its_own_purge_clock() {
    let _g = serial();
    let (server, _peer, _unused) = pool_with(ForkStatus::Unneeded, Registration::Pinned);
    let pool = clock_pool(&server);
    let large = Layout::from_size_align(3 << 19, 4096).unwrap();
    // The parent's clock starts with the first idle slab.
    let p = pool.alloc(large);
    // SAFETY: from this pool, freed once.
    unsafe { pool.free_sized(p, large) };
    assert!(purged_past(&pool, 0, 10), "the parent's clock never purged");
    assert!(pool.stats().alloc.purge_clock_running);
    for f in 0..6u64 {
        // The parent's clock may be inside the pool (or its registry) as the process forks.
        let p = pool.alloc(large);
        // SAFETY: as above.
        unsafe { pool.free_sized(p, large) };
        std::thread::sleep(std::time::Duration::from_millis(f * 3));
        let child = in_child(|| {
            // SAFETY: a hung child dies of SIGALRM, which the parent reports.
            unsafe { libc::alarm(20) };
            // The parent's clock thread does not exist here.
            if pool.stats().alloc.purge_clock_running {
                return 2;
            }
            let before = pool.stats().alloc.arena.purged_bytes;
            let q = pool.alloc(large);
            if q.is_null() {
                return 3;
            }
            // SAFETY: a fresh block of the layout's size, freed once.
            unsafe {
                q.write_bytes(0x3C, large.size());
                pool.free_sized(q, large);
            }
            // The child's own clock purges it, with no further call.
            if !purged_past(&pool, before, 10) {
                return 4;
            }
            if !pool.stats().alloc.purge_clock_running {
                return 5;
            }
            // A pool made and dropped in the child does not wait for the parent's clock.
            let other = clock_pool(&server);
            let r = other.alloc(large);
            // SAFETY: from `other`, freed once.
            unsafe { other.free_sized(r, large) };
            drop(other);
            if !pool.validate() {
                return 6;
            }
            0
        });
        assert_eq!(
            child,
            Ok(0),
            "child {f} (2: the parent's clock seen, 4: nothing purged, Err(14): hung)"
        );
    }
    assert!(pool.validate());
}
