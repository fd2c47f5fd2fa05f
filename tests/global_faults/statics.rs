//! `GlobalPool`s used directly (not as the global allocator), one per failure mode.

use crate::common::serial;
use rdma_pool::GlobalPool;
use rdma_pool::arena::provision::Provisioning;
use rdma_pool::arena::{DegradeCause, Error, Hugepages, ModeReason, RegMode};
use rdma_pool::global::{GlobalConfig, GlobalState, OnFailure, Registration};
use rdma_pool::nic::{self, Nic, Verb};
use std::alloc::{GlobalAlloc, Layout};
use std::sync::Barrier;

fn soft() -> nic::Result<Nic> {
    Ok(Nic::soft())
}

fn no_device() -> nic::Result<Nic> {
    Err(nic::Error::NoDevice)
}

fn panics() -> nic::Result<Nic> {
    panic!("a NIC opener that panics")
}

const SMALL: GlobalConfig = GlobalConfig {
    arena: rdma_pool::arena::ArenaConfig {
        reserve: 1 << 30,
        chunk: 1 << 24,
        hugepages: Hugepages::Off,
        ..GlobalConfig::DEFAULT.arena
    },
    open: Some(soft),
    ..GlobalConfig::DEFAULT
};

/// Allocate `layout` from `pool`, write and check it, report whether it has keys, free it.
fn round_trip(pool: &GlobalPool, layout: Layout) -> bool {
    // SAFETY: non-zero-size layouts; each block is freed once with its layout.
    unsafe {
        let p = pool.alloc(layout);
        assert!(!p.is_null());
        std::ptr::write_bytes(p, 0x5A, layout.size());
        let q = pool.realloc(p, layout, layout.size() * 2);
        assert!(!q.is_null());
        assert!(
            std::slice::from_raw_parts(q, layout.size())
                .iter()
                .all(|&b| b == 0x5A)
        );
        let keyed = pool.keys_of(q).is_some();
        pool.dealloc(
            q,
            Layout::from_size_align(layout.size() * 2, layout.align()).unwrap(),
        );
        keyed
    }
}

#[test]
fn injected_registration_failures_degrade_then_registration_resumes() {
    // Pinned, so that every fresh slab needs a registration (an ODP chunk has one already).
    static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
        arena: rdma_pool::arena::ArenaConfig {
            registration: Registration::Pinned,
            ..SMALL.arena
        },
        ..SMALL
    });
    let soft = P.nic().unwrap().as_soft().expect("a soft NIC");
    let big = Layout::from_size_align(6 << 20, 64).unwrap();
    assert!(round_trip(&P, big));
    let before = P.stats();
    // Every registration fails for a while: fresh slabs cannot be registered.
    soft.fail_next(Verb::RegMr, 1000, libc::ENOMEM);
    // Purged slabs of earlier tests (spare, revived without a fresh registration) may serve the
    // first ones: enough blocks that most need fresh slabs.
    let mut blocks = Vec::new();
    for _ in 0..16 {
        // SAFETY: a non-zero-size layout.
        let p = unsafe { P.alloc(big) };
        assert!(!p.is_null(), "degraded, not refused");
        blocks.push(p);
    }
    let unkeyed = blocks.iter().filter(|&&p| P.keys_of(p).is_none()).count();
    assert!(unkeyed >= 8, "{unkeyed} of 16 unregistered");
    // The arena served them unregistered (pinned failed, and so did ODP for the chunk): counted
    // with the cause, nothing taken from the system allocator.
    let during = P.stats();
    let arena = during.pool.unwrap().arena;
    assert!(
        arena.unregistered_bytes >= unkeyed as u64 * (6 << 20),
        "{arena:?}"
    );
    let d = arena.last_degradation.expect("a degradation recorded");
    assert_eq!((d.cause, d.odp_fallback), (DegradeCause::Memlock, false));
    assert_eq!(during.degraded_allocations, before.degraded_allocations);
    for p in blocks {
        // SAFETY: blocks of `P` with `big`.
        unsafe { P.dealloc(p, big) };
    }
    soft.fail_next(Verb::RegMr, 0, 0);
    // Registration works again.
    let fresh = Layout::from_size_align(40 << 20, 4096).unwrap();
    assert!(round_trip(&P, fresh));
    assert_eq!(P.stats().state, GlobalState::Ready);
    assert!(P.validate());
}

#[test]
fn rereg_failures_fall_back_without_breaking_anything() {
    static P: GlobalPool = GlobalPool::with_config(SMALL);
    let soft = P.nic().unwrap().as_soft().expect("a soft NIC");
    soft.fail_next_rereg(nic::ReregErrorKind::Input, 5, libc::EINVAL);
    for n in 1..40usize {
        assert!(round_trip(&P, Layout::from_size_align(n << 18, 8).unwrap()));
    }
    assert_eq!(P.stats().degraded_allocations, 0);
}

#[test]
fn a_nic_that_cannot_be_opened_degrades_every_allocation() {
    static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
        open: Some(no_device),
        ..SMALL
    });
    for size in [1usize, 100, 70_000, 3 << 20] {
        assert!(!round_trip(&P, Layout::from_size_align(size, 16).unwrap()));
    }
    assert_eq!(P.state(), GlobalState::Failed);
    assert!(matches!(
        P.init_error(),
        Some(Error::Nic(nic::Error::NoDevice))
    ));
    assert!(P.init().is_err() && P.nic().is_err() && P.pd().is_err());
    let s = P.stats();
    assert!(s.degraded_allocations >= 8 && s.pool.is_none());
}

#[test]
fn a_panicking_opener_is_caught() {
    static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
        open: Some(panics),
        ..SMALL
    });
    assert!(!round_trip(&P, Layout::new::<[u8; 48]>()));
    assert!(matches!(P.init_error(), Some(Error::Config(_))));
}

#[test]
fn the_fail_policy_returns_null_instead_of_unregistered_memory() {
    static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
        open: Some(no_device),
        on_failure: OnFailure::Fail,
        ..SMALL
    });
    let before = P.stats().failed_allocations;
    // SAFETY: a non-zero-size layout.
    let p = unsafe { P.alloc(Layout::new::<u64>()) };
    assert!(p.is_null());
    assert_eq!(P.stats().failed_allocations, before + 1);
}

#[test]
fn odp_registration_serves_odp_memory() {
    let _env = serial(); // not while the environment test's child reads the same variables
    static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
        arena: rdma_pool::arena::ArenaConfig {
            registration: Registration::Odp,
            ..SMALL.arena
        },
        ..SMALL
    });
    if std::env::var_os("RDMA_POOL_REGISTRATION").is_some() {
        return;
    }
    let caps = P.nic().ok().map(|n| n.caps().clone());
    match P.init() {
        Ok(pool) => {
            assert!(caps.is_some_and(|c| c.odp.explicit));
            assert!(round_trip(&P, Layout::new::<[u8; 64]>()));
            let s = pool.stats().alloc.arena;
            assert_eq!(
                (s.mode, s.mode_reason),
                (RegMode::Odp, ModeReason::Requested)
            );
            assert!(s.odp_mrs >= 1, "{s:?}");
        }
        // A device without explicit ODP refuses the configuration with a reason.
        Err(e) => assert!(matches!(e, Error::Config(_)), "{e}"),
    }
}

#[test]
fn threads_racing_the_first_allocation_all_get_registered_memory() {
    static P: GlobalPool = GlobalPool::with_config(SMALL);
    const N: usize = 8;
    let go = Barrier::new(N);
    let keyed = std::thread::scope(|s| {
        let go = &go;
        let handles: Vec<_> = (0..N)
            .map(|i| {
                s.spawn(move || {
                    go.wait();
                    round_trip(&P, Layout::from_size_align(64 + i * 1000, 8).unwrap())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(keyed.iter().all(|&k| k), "{keyed:?}");
    assert_eq!(P.stats().degraded_allocations, 0);
    assert!(P.validate());
}

#[test]
fn allocations_made_while_provisioning_before_the_pool_is_ready_use_the_bootstrap_region() {
    static P: GlobalPool = GlobalPool::with_config(SMALL);
    let l = Layout::from_size_align(200, 16).unwrap();
    let mark = Provisioning::enter();
    let before = P.stats();
    // SAFETY: non-zero-size layouts; each block is freed once with its layout.
    unsafe {
        let a = P.alloc(l);
        let b = P.alloc_zeroed(l);
        assert!(!a.is_null() && !b.is_null() && a as usize % 16 == 0);
        assert!(std::slice::from_raw_parts(b, 200).iter().all(|&x| x == 0));
        // Not initialised by re-entrant calls, and the blocks have no keys.
        assert_eq!(P.state(), GlobalState::Uninitialised);
        assert!(rdma_pool::keys_of(a).is_none());
        // Served by the bootstrap region, or by malloc when the region is full (both by
        // address, never as pool blocks).
        let s = P.stats();
        assert_eq!(
            s.reentrant_allocations,
            before.reentrant_allocations + 2,
            "{s:?}"
        );
        assert!(s.bootstrap_blocks + s.bootstrap_overflow >= before.bootstrap_blocks + 2);
        a.write_bytes(0xC3, 200);
        drop(mark);
        // Outside the mark the pool initialises; a bootstrap block that grows moves into it.
        let a2 = P.realloc(a, l, 5000);
        assert!(P.keys_of(a2).is_some());
        assert!(
            std::slice::from_raw_parts(a2, 200)
                .iter()
                .all(|&x| x == 0xC3)
        );
        P.dealloc(a2, Layout::from_size_align(5000, 16).unwrap());
        // Freeing a bootstrap block is recognised (handing it to malloc's free would crash).
        P.dealloc(b, l);
    }
    assert_eq!(P.state(), GlobalState::Ready);
    assert_eq!(P.stats().degraded_allocations, 0);
    assert!(P.validate());
}

#[test]
fn a_pool_asked_for_itself_while_initialising_says_so_instead_of_waiting() {
    static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
        open: Some(asks_for_itself),
        ..SMALL
    });
    fn asks_for_itself() -> nic::Result<Nic> {
        // From inside the opener: neither a deadlock nor a recursive initialisation.
        assert!(matches!(P.init(), Err(Error::Reentrant)));
        assert!(P.nic().is_err());
        Ok(Nic::soft())
    }
    assert!(P.init().is_ok(), "{:?}", P.init_error());
    assert!(round_trip(&P, Layout::new::<[u8; 100]>()));
}

#[test]
fn a_global_pool_purges_freed_memory_and_serves_it_again_registered() {
    static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
        arena: rdma_pool::arena::ArenaConfig {
            purge_delay: None,
            registration: Registration::Pinned,
            ..SMALL.arena
        },
        ..SMALL
    });
    let big = Layout::from_size_align(8 << 20, 4096).unwrap();
    // SAFETY: a non-zero-size layout; the block is freed once with it.
    let p = unsafe { P.alloc(big) };
    assert!(!p.is_null() && P.keys_of(p).is_some());
    // SAFETY: as above.
    unsafe { P.dealloc(p, big) };
    assert!(P.purge() >= 8 << 20);
    let s = P.stats().pool.unwrap().arena;
    assert!(s.purged_bytes >= 8 << 20 && s.purges >= 1, "{s:?}");
    // SAFETY: as above.
    let q = unsafe { P.alloc_zeroed(big) };
    assert!(!q.is_null() && P.keys_of(q).is_some());
    // SAFETY: a live zeroed block of `big.size()` bytes, then freed once.
    unsafe {
        assert!(
            std::slice::from_raw_parts(q, big.size())
                .iter()
                .all(|&b| b == 0)
        );
        P.dealloc(q, big);
    }
    assert!(P.validate());
}

#[test]
fn a_request_the_system_refuses_too_is_a_failure_not_a_degradation() {
    static P: GlobalPool = GlobalPool::with_config(SMALL);
    let ok = Layout::from_size_align(100, 8).unwrap();
    assert!(round_trip(&P, ok));
    let before = P.stats();
    // Larger than any machine's memory: the pool refuses it, and so does malloc.
    let huge = Layout::from_size_align(1 << 62, 8).unwrap();
    // SAFETY: a non-zero size; a non-null result would be freed below.
    let p = unsafe { P.alloc(huge) };
    assert!(p.is_null());
    let after = P.stats();
    assert_eq!(after.failed_allocations, before.failed_allocations + 1);
    // The pool was asked once, and counted its refusal once.
    assert_eq!(
        after.pool.unwrap().failed_allocations,
        before.pool.unwrap().failed_allocations + 1
    );
    assert_eq!(after.degraded_allocations, before.degraded_allocations);
    assert_eq!(after.degraded_bytes, before.degraded_bytes, "{after:?}");
    assert!(round_trip(&P, ok));
}

/// `Fallback::Mmap` (for a pool that is the process's `malloc`): degraded blocks are
/// anonymous mappings of their own — never `malloc` — unmapped when freed, grown in place or
/// moved with their bytes.
#[test]
fn the_mmap_fallback_never_calls_malloc_and_gives_every_page_back() {
    // Alone in a child process: another thread's mmap could take a page just unmapped.
    if std::env::var_os("RDMA_POOL_MMAP_CHILD").is_none() {
        crate::common::run_alone(
            "statics::the_mmap_fallback_never_calls_malloc_and_gives_every_page_back",
            "RDMA_POOL_MMAP_CHILD",
        );
        return;
    }
    static P: GlobalPool = GlobalPool::with_config(GlobalConfig {
        open: Some(no_device),
        fallback: rdma_pool::global::Fallback::Mmap,
        ..SMALL
    });
    let maps = || std::fs::read_to_string("/proc/self/maps").unwrap();
    let mapped = |p: *mut u8| {
        maps().lines().any(|l| {
            let r = l.split_whitespace().next().unwrap();
            let (a, b) = r.split_once('-').unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            a <= p as usize && (p as usize) < b
        })
    };
    for (size, align) in [(24usize, 8usize), (4000, 16), (70_000, 64), (100, 1 << 14)] {
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: a non-zero layout; freed below with the layout it has then.
        unsafe {
            let p = P.alloc_zeroed(layout);
            assert!(!p.is_null());
            assert_eq!(p as usize % 4096, 0, "a mapping of its own");
            assert!(mapped(p));
            assert!(std::slice::from_raw_parts(p, size).iter().all(|&b| b == 0));
            p.write_bytes(9, size);
            let q = P.realloc(p, layout, size * 5);
            assert!(!q.is_null());
            assert!(std::slice::from_raw_parts(q, size).iter().all(|&b| b == 9));
            let grown = Layout::from_size_align(size * 5, align).unwrap();
            P.dealloc(q, grown);
            assert!(!mapped(q), "unmapped");
        }
    }
    let s = P.stats();
    assert_eq!(
        s.first_degradation,
        Some(rdma_pool::global::DegradeReason::InitFailed)
    );
    assert!(s.degraded_by.init_failed >= 4, "{:?}", s.degraded_by);
}
