//! Bad-input sweep: every public entry point of the pool with zero sizes, absurd sizes and
//! alignments, foreign pointers, pointers into the middle of blocks, double frees, wrong and
//! errored QPs, ranges across registrations. Each answers with a typed error or its
//! documented behaviour (a foreign `free` is ignored, a failed allocation is null and
//! counted), nothing it had is lost or leaked (`validate`, live blocks and grants back to
//! zero), and no input panics. Runs on the soft NIC and on `rxe0`/`rxe1` in the QEMU guest.

use super::*;
use rdma_pool::PoolError;
use rdma_pool::alloc::FreeError;
use rdma_pool::arena::{Arena, Error, SLAB};
use rdma_pool::grant::{GrantError, GrantKind};
use rdma_pool::prefetch::PrefetchError;
use rdma_pool::queue_mem::QueueMemError;
use std::alloc::Layout;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Bad inputs tried (printed at the end of each test).
static TRIED: AtomicU64 = AtomicU64::new(0);

/// Count one bad input, and pass its result through.
fn tried<T>(r: T) -> T {
    TRIED.fetch_add(1, Relaxed);
    r
}

fn cfg() -> ArenaConfig {
    // One reservation: a run larger than it is refused, not served from an added one.
    ArenaConfig {
        reservations: 1,
        ..small_arena()
    }
}

struct Bed2 {
    server: Side,
    client: Side,
    qs: Qp,
    _qc: Qp,
    pool: Pool,
}

fn bed2() -> Bed2 {
    let (n0, n1) = nics();
    let (server, client) = (Side::new(n0), Side::new(n1));
    let (qs, qc) = connect(&server, &client);
    let pool = Pool::with_config(&server.pd, cfg()).unwrap();
    Bed2 {
        server,
        client,
        qs,
        _qc: qc,
        pool,
    }
}

#[test]
fn configurations_that_cannot_work_are_refused() {
    let _g = serial();
    let pd = Nic::soft().alloc_pd().unwrap();
    let bad = [
        ArenaConfig {
            reserve: (1 << 32) + 1,
            ..cfg()
        },
        ArenaConfig {
            chunk: 3 << 20,
            ..cfg()
        },
        ArenaConfig {
            chunk: 1 << 20,
            ..cfg()
        },
        ArenaConfig {
            chunk: 1 << 33,
            ..cfg()
        },
        ArenaConfig {
            remote: Access::LOCAL_WRITE,
            ..cfg()
        },
        ArenaConfig {
            remote: Access::MW_BIND | Access::REMOTE_READ,
            ..cfg()
        },
        ArenaConfig {
            reservations: 0,
            ..cfg()
        },
        ArenaConfig {
            reservations: u32::MAX,
            ..cfg()
        },
    ];
    for c in bad {
        assert!(
            matches!(
                tried(Pool::with_config(&pd, c)),
                Err(PoolError::Arena(Error::Config(_)))
            ),
            "{c:?}"
        );
    }
    // A reservation beyond what an arena may hold (64 TiB).
    let huge = ArenaConfig {
        reserve: 1 << 62,
        chunk: 1 << 30,
        ..cfg()
    };
    assert!(matches!(
        tried(Pool::with_config(&pd, huge)),
        Err(PoolError::Arena(Error::Config(_)))
    ));

    eprintln!("bad inputs tried so far: {}", TRIED.load(Relaxed));
}

#[test]
fn allocation_sizes_and_alignments_at_the_edges() {
    let _g = serial();
    let b = bed2();
    let pool = &b.pool;
    let failed = || pool.stats().alloc.failed_allocations;
    // Zero-size layouts get a unique, usable pointer.
    let z1 = tried(pool.alloc(Layout::from_size_align(0, 1).unwrap()));
    let z2 = tried(pool.alloc(Layout::from_size_align(0, 4096).unwrap()));
    assert!(!z1.is_null() && !z2.is_null() && z1 != z2 && z2 as usize % 4096 == 0);
    // Sizes the arena can never hold: null, counted, nothing committed.
    let committed = pool.stats().alloc.arena.committed_bytes;
    for size in [isize::MAX as usize - 4096, 1 << 40, (1 << 32) + 1] {
        let f0 = failed();
        let p = tried(pool.alloc(Layout::from_size_align(size, 8).unwrap()));
        assert!(p.is_null(), "{size}");
        assert_eq!(failed(), f0 + 1);
        let p = tried(pool.alloc_zeroed(Layout::from_size_align(size, 8).unwrap()));
        assert!(p.is_null());
    }
    assert_eq!(pool.stats().alloc.arena.committed_bytes, committed);
    // Alignments from 1 to beyond a chunk: honoured, or null.
    for shift in [0u32, 3, 12, 16, 17, 21, 24, 25, 31, 40] {
        let l = Layout::from_size_align(100, 1 << shift).unwrap();
        let p = tried(pool.alloc(l));
        if !p.is_null() {
            assert_eq!(p as usize % l.align(), 0, "align {}", l.align());
            assert!(pool.keys_of(p).is_some_and(|k| k.contains(p as usize, 100)));
            // SAFETY: from this pool with `l`.
            unsafe { pool.free_sized(p, l) };
        } else {
            assert!(shift >= 31, "a {}-byte alignment failed", l.align());
        }
    }
    // realloc to a size that cannot be had: null, the old block live and intact.
    let l = Layout::from_size_align(5000, 8).unwrap();
    let p = pool.alloc(l);
    // SAFETY: a fresh 5000-byte block.
    unsafe { std::ptr::write_bytes(p, 0xAB, 5000) };
    // SAFETY: a live block with `l`.
    let q = tried(unsafe { pool.realloc(p, l, 1 << 40) });
    assert!(q.is_null());
    // SAFETY: still live.
    assert!(
        unsafe { std::slice::from_raw_parts(p, 5000) }
            .iter()
            .all(|&x| x == 0xAB)
    );
    // SAFETY: as above; then the zero-size blocks.
    unsafe {
        pool.free_sized(p, l);
        pool.free(z1);
        pool.free(z2);
    }
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
    eprintln!("bad inputs tried so far: {}", TRIED.load(Relaxed));
}

#[test]
fn foreign_interior_and_double_frees_are_refused_or_ignored() {
    let _g = serial();
    let b = bed2();
    let pool = &b.pool;
    let stack = 0u64;
    let malloc = Box::new([0u8; 64]);
    let other = Pool::with_config(&Nic::soft().alloc_pd().unwrap(), cfg()).unwrap();
    let theirs = other.alloc(Layout::new::<[u8; 64]>());
    let foreign: [*mut u8; 5] = [
        std::ptr::null_mut(),
        &stack as *const u64 as *mut u8,
        malloc.as_ptr() as *mut u8,
        theirs,
        (usize::MAX - 4095) as *mut u8,
    ];
    let live = pool.live_blocks();
    for p in foreign {
        // SAFETY: `try_free` takes any pointer.
        assert_eq!(tried(unsafe { pool.try_free(p) }), Err(FreeError::Foreign));
        // Documented: `free` ignores a pointer the pool did not hand out.
        // SAFETY: as documented, a foreign pointer is ignored.
        unsafe { pool.free(p) };
        assert_eq!(tried(pool.usable_size(p)), None);
        assert_eq!(tried(pool.keys_of(p)), None);
    }
    assert_eq!(pool.live_blocks(), live);
    // One block of each kind: interior pointers, then double frees.
    for size in [48usize, 3000, 100_000, 3 << 20] {
        let p = pool.alloc(Layout::from_size_align(size, 8).unwrap());
        for off in [1usize, 8, size / 2, size - 1] {
            // SAFETY: `try_free` refuses before freeing anything.
            let r = tried(unsafe { pool.try_free(p.add(off)) });
            assert_eq!(r, Err(FreeError::Interior { offset: off }), "{size} +{off}");
        }
        assert_eq!(pool.check_live(p), Ok(()));
        // SAFETY: the block is ours and unused.
        assert_eq!(unsafe { pool.try_free(p) }, Ok(()));
        // SAFETY: `try_free` refuses before freeing anything.
        assert_eq!(
            tried(unsafe { pool.try_free(p) }),
            Err(FreeError::NotLive),
            "a double free of a {size}-byte block"
        );
    }
    // A small block freed with its size (it sits in this thread's cache): still caught.
    let l = Layout::new::<[u8; 32]>();
    let p = pool.alloc(l);
    // SAFETY: from this pool with `l`.
    unsafe { pool.free_sized(p, l) };
    // SAFETY: refused before anything is freed.
    assert_eq!(tried(unsafe { pool.try_free(p) }), Err(FreeError::NotLive));
    // A block another (live) thread freed into its own cache (blocks up to 32 KiB): a double
    // free from here is caught too (it used to be handed out twice afterwards).
    for size in [64usize, 1000, 32 << 10] {
        let l = Layout::from_size_align(size, 8).unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<usize>();
        let done = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            let t = s.spawn(|| {
                let p = pool.alloc(l);
                // SAFETY: from this pool with `l`.
                unsafe { pool.free_sized(p, l) };
                tx.send(p as usize).unwrap();
                done.wait();
                // The thread allocates twice: never the same block.
                let (a, b) = (pool.alloc(l), pool.alloc(l));
                // SAFETY: from this pool with `l`.
                unsafe {
                    pool.free_sized(a, l);
                    pool.free_sized(b, l);
                }
                (a, b) != (p, p) && a != b
            });
            let p = rx.recv().unwrap() as *mut u8;
            // SAFETY: refused before anything is freed.
            let r = tried(unsafe { pool.try_free(p) });
            done.wait();
            assert_eq!(
                r,
                Err(FreeError::NotLive),
                "{size}: a double free of a cached block"
            );
            assert!(t.join().unwrap(), "{size}: one block handed out twice");
        });
    }
    // SAFETY: `theirs` belongs to `other`.
    unsafe { other.free(theirs) };
    assert_eq!(pool.live_blocks(), live);
    assert!(pool.validate() && other.validate());
    eprintln!("bad inputs tried so far: {}", TRIED.load(Relaxed));
}

#[test]
fn keys_sges_and_prefetch_refuse_what_is_not_one_registration() {
    let _g = serial();
    let b = bed2();
    let pool = &b.pool;
    let stack = [0u8; 64];
    assert!(matches!(
        tried(pool.sge_of(&stack)),
        Err(Error::NotRegistered)
    ));
    assert!(matches!(
        tried(pool.prefetch(&stack, Advice::Prefetch)),
        Err(PrefetchError::OutsidePool)
    ));
    // Two adjacent runs in two registrations (the first one's keys were handed out before
    // the second was committed, so it did not grow over it): a slice across their border is
    // in no one registration.
    let arena = pool.arena();
    let r1 = arena.alloc_run(SLAB, SLAB).unwrap();
    let k1 = arena.keys_of(r1.as_ptr()).unwrap();
    let r2 = arena.alloc_run(SLAB, SLAB).unwrap();
    assert_eq!(
        r2.as_ptr() as usize,
        r1.as_ptr() as usize + SLAB,
        "adjacent"
    );
    assert!(!k1.contains(r2.as_ptr() as usize, 1));
    // SAFETY: both runs are ours; the slice spans their border.
    let across = unsafe { std::slice::from_raw_parts(r2.as_ptr().sub(64), 128) };
    assert!(matches!(
        tried(pool.sge_of(across)),
        Err(Error::NotRegistered)
    ));
    assert!(matches!(
        tried(pool.sge_of_on(across, &b.server.nic)),
        Err(Error::NotRegistered)
    ));
    let l = Layout::from_size_align(20 << 20, SLAB).unwrap();
    let (a, c) = (pool.alloc(l), pool.alloc(l));
    // An empty slice: one SGE of length 0 (what the verbs allow), no prefetch.
    // SAFETY: a live block.
    let empty = unsafe { std::slice::from_raw_parts(a, 0) };
    assert_eq!(tried(pool.sge_of(empty)).map(|s| s.length).ok(), Some(0));
    assert_eq!(tried(pool.prefetch(empty, Advice::Prefetch)).ok(), Some(0));
    // SAFETY: from this pool with `l`.
    unsafe {
        pool.free_sized(a, l);
        pool.free_sized(c, l);
    }
    assert!(pool.validate());
    eprintln!("bad inputs tried so far: {}", TRIED.load(Relaxed));
}

#[test]
fn grants_refuse_bad_ranges_rights_and_qps_and_leak_nothing() {
    let _g = serial();
    let b = bed2();
    let pool = &b.pool;
    let v = allocator_api2::vec![in pool; 1u8; 4096];
    let w = allocator_api2::vec![in pool; 2u8; 4096];
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let stack = [0u8; 64];
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        tried(unsafe { pool.grant_with(&v[..0], &b.qs, rw, rdma_pool::grant::GrantKind::Auto) }),
        Err(GrantError::Empty)
    ));
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        tried(unsafe { pool.grant_with(&stack, &b.qs, rw, rdma_pool::grant::GrantKind::Auto) }),
        Err(GrantError::OutsidePool)
    ));
    for bad in [
        Access::empty(),
        Access::LOCAL_WRITE,
        Access::MW_BIND,
        Access::REMOTE_READ | Access::ON_DEMAND,
    ] {
        assert!(
            matches!(
                // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
                tried(unsafe {
                    pool.grant_with(&v, &b.qs, bad, rdma_pool::grant::GrantKind::Auto)
                }),
                Err(GrantError::Rights(_))
            ),
            "{bad:?}"
        );
    }
    // A range running from one block into the next.
    let (lo, hi) = if v.as_ptr() < w.as_ptr() {
        (&v, &w)
    } else {
        (&w, &v)
    };
    let gap = hi.as_ptr() as usize - lo.as_ptr() as usize;
    // SAFETY: both blocks are live and `gap` bytes apart: the slice covers the end of one
    // and the start of the other (and any slack between them, inside the pool's page).
    let across = unsafe { std::slice::from_raw_parts(lo.as_ptr().add(4000), gap - 4000 + 10) };
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        tried(unsafe { pool.grant_with(across, &b.qs, rw, rdma_pool::grant::GrantKind::Auto) }),
        Err(GrantError::AcrossBlocks { .. })
    ));
    // A freed block.
    let gone = allocator_api2::vec![in pool; 3u8; 4096];
    let gone_ptr = gone.as_ptr();
    drop(gone);
    // SAFETY: test-only: the slice is never read; the grant must refuse it.
    let stale = unsafe { std::slice::from_raw_parts(gone_ptr, 4096) };
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        tried(unsafe { pool.grant_with(stale, &b.qs, rw, rdma_pool::grant::GrantKind::Auto) }),
        Err(GrantError::NotAllocated { .. })
    ));
    // A QP of a device (or PD) the pool is not registered on.
    // (The client's device: a QP need not be connected to be refused as foreign.)
    let qx = b.client.qp();
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        tried(unsafe { pool.grant_with(&v, &qx, rw, rdma_pool::grant::GrantKind::Auto) }),
        Err(GrantError::ForeignQp)
    ));
    let pd2 = b.server.nic.alloc_pd().unwrap();
    let q2 = b.server.qp_in(&pd2);
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        tried(unsafe { pool.grant_with(&v, &q2, rw, rdma_pool::grant::GrantKind::Auto) }),
        Err(GrantError::ForeignQp)
    ));
    // A QP never connected, and one in the error state.
    let idle = b.server.qp();
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        tried(unsafe { pool.grant_with(&v, &idle, rw, GrantKind::Type2) }),
        Err(GrantError::QpNotReady(_))
    ));
    let (qe, _qf) = connect(&b.server, &b.client);
    let (_m, bad_src) = b.server.reg_buf(8, 0, RW);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { qe.post_write(9, &[bad_src.sge(0, 8).unwrap()], 0, Rkey(0xdead)) }.unwrap();
    assert_ne!(b.server.wait().status, WcStatus::Success);
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        tried(unsafe { pool.grant_with(&v, &qe, rw, GrantKind::Type2) }),
        Err(GrantError::QpNotReady(_))
    ));
    // Revoking twice.
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g =
        unsafe { pool.grant_with(&v, &b.qs, rw, rdma_pool::grant::GrantKind::Auto) }.unwrap();
    g.revoke(&b.server.cq, |_| {}).unwrap();
    assert!(matches!(
        tried(g.revoke(&b.server.cq, |_| {})),
        Err(GrantError::Revoked)
    ));
    drop(g);
    let s = pool.stats().grants;
    assert_eq!(
        (s.open, s.dedicated_regions, s.quarantined_blocks),
        (0, 0, 0),
        "{s:?}"
    );
    drop((v, w));
    assert!(pool.validate());
    eprintln!("bad inputs tried so far: {}", TRIED.load(Relaxed));
}

#[test]
fn queue_memory_rails_and_the_arena_refuse_bad_arguments() {
    let _g = serial();
    let b = bed2();
    let pool = &b.pool;
    for (len, align) in [
        (0usize, 64usize),
        (4096, 3),
        (4096, 0),
        (1 << 40, 64),
        (4096, 1 << 40),
        // Lengths that wrap when rounded up (found by the hostile review of #42: they came
        // back as a zero-length carve sharing the next carve's address).
        (usize::MAX, 64),
        (usize::MAX - 62, 64),
        (usize::MAX - (2 << 20), 4096),
        (isize::MAX as usize, 64),
    ] {
        match tried(pool.queue_memory(len, align)) {
            Err(QueueMemError::InvalidArgument(_) | QueueMemError::Unsupported) => {}
            Err(QueueMemError::Arena(_)) => {}
            r => panic!("queue_memory({len}, {align}): {:?}", r.map(|q| q.len())),
        }
    }
    assert!(matches!(
        tried(pool.attach(&b.server.pd)),
        Err(Error::InvalidArgument(_))
    ));
    let stranger = Nic::soft().alloc_pd().unwrap();
    assert!(matches!(
        tried(pool.detach(&stranger)),
        Err(Error::InvalidArgument(_))
    ));
    let pd = Nic::soft().alloc_pd().unwrap();
    let arena = Arena::new(&pd, cfg()).unwrap();
    assert!(matches!(
        tried(arena.alloc_run(0, 64)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        tried(arena.alloc_run(64, 3)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        tried(arena.alloc_run(usize::MAX - 64, 64)),
        Err(Error::InvalidArgument(_) | Error::TooLarge { .. })
    ));
    assert!(matches!(
        tried(arena.alloc_run(8 << 30, 64)),
        Err(Error::ReservationFull { .. } | Error::TooLarge { .. })
    ));
    let run = arena.alloc_run(4 << 20, SLAB).unwrap();
    // SAFETY (all purges below): the run is ours and holds nothing live; bad ranges are
    // refused before anything is dropped.
    unsafe {
        for (p, len) in [
            (run.as_ptr().wrapping_add(4096), SLAB),
            (run.as_ptr(), 4096),
            (run.as_ptr(), 0),
            (run.as_ptr().wrapping_add(1 << 30), SLAB),
            (std::ptr::null_mut(), SLAB),
        ] {
            assert!(
                matches!(tried(arena.purge(p, len)), Err(Error::InvalidArgument(_))),
                "purge({p:?}, {len})"
            );
            assert!(matches!(
                tried(arena.revive(p, len)),
                Err(Error::InvalidArgument(_))
            ));
        }
        assert_eq!(arena.purge(run.as_ptr(), SLAB).unwrap(), SLAB);
        assert!(matches!(
            tried(arena.purge(run.as_ptr(), SLAB)),
            Err(Error::InvalidArgument(_))
        ));
    }
    arena.revive(run.as_ptr(), SLAB).unwrap();
    assert!(arena.keys_of(run.as_ptr()).is_some());
    assert!(arena.validate() && pool.validate());
    eprintln!("bad inputs tried so far: {}", TRIED.load(Relaxed));
}

fn open_soft() -> rdma_pool::nic::Result<Nic> {
    Ok(Nic::soft())
}

static GLOBAL: rdma_pool::GlobalPool =
    rdma_pool::GlobalPool::with_config(rdma_pool::global::GlobalConfig {
        arena: rdma_pool::arena::ArenaConfig {
            hugepages: Hugepages::Off,
            reserve: 1 << 32,
            reservations: 1,
            chunk: 1 << 24,
            ..rdma_pool::global::GlobalConfig::DEFAULT.arena
        },
        open: Some(open_soft),
        ..rdma_pool::global::GlobalConfig::DEFAULT
    });

#[test]
fn global_alloc_answers_absurd_layouts_with_null_and_foreign_lookups_with_none() {
    use std::alloc::GlobalAlloc;
    let _g = serial();
    for (size, align) in [
        (isize::MAX as usize - (1 << 20), 1 << 20),
        (1 << 40, 8),
        (1, 1 << 40),
        ((1 << 32) + 8, 8), // beyond the reservation: malloc (calloc: lazily zero) serves it
    ] {
        let l = Layout::from_size_align(size, align).unwrap();
        for zeroed in [false, true] {
            let degraded = GLOBAL.stats().degraded_allocations;
            // SAFETY: a non-zero layout.
            let p = tried(unsafe {
                if zeroed {
                    GLOBAL.alloc_zeroed(l)
                } else {
                    GLOBAL.alloc(l)
                }
            });
            if !p.is_null() {
                // Beyond the pool, the system allocator served it: counted, no keys.
                assert_eq!(
                    GLOBAL.stats().degraded_allocations,
                    degraded + 1,
                    "{size}/{align}"
                );
                assert_eq!(GLOBAL.keys_of(p), None);
                assert_eq!(p as usize % align, 0);
                // SAFETY: from GLOBAL with `l`.
                unsafe { GLOBAL.dealloc(p, l) };
            }
        }
    }
    // A block that exists: realloc to an absurd size is null and keeps it.
    let l = Layout::from_size_align(300, 8).unwrap();
    // SAFETY: a non-zero layout; the block is freed with it below.
    unsafe {
        let p = GLOBAL.alloc(l);
        std::ptr::write_bytes(p, 0x33, 300);
        assert!(tried(GLOBAL.realloc(p, l, isize::MAX as usize - 64)).is_null());
        assert!(
            std::slice::from_raw_parts(p, 300)
                .iter()
                .all(|&b| b == 0x33)
        );
        GLOBAL.dealloc(p, l);
    }
    let stack = 0u32;
    assert_eq!(tried(GLOBAL.keys_of(std::ptr::null())), None);
    assert_eq!(
        tried(GLOBAL.keys_of(&stack as *const u32 as *const u8)),
        None
    );
    assert_eq!(tried(rdma_pool::keys_of(&stack)), None);
    assert!(matches!(
        tried(GLOBAL.sge_of(&[1u8, 2, 3])),
        Err(Error::NotRegistered)
    ));
    let s = GLOBAL.stats();
    assert!(s.failed_allocations + s.degraded_allocations >= 8, "{s:?}");
    assert!(GLOBAL.validate());
    eprintln!("bad inputs tried so far: {}", TRIED.load(Relaxed));
}
