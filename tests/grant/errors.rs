//! Bad input gets a typed error and nothing leaks.

use super::*;
use rdma_pool::grant::{GrantError, GrantLimits};
use std::alloc::Layout;

#[test]
fn bad_ranges_qps_and_rights_are_refused() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let qb = &bed.qb;
    let rw = Access::REMOTE_WRITE;
    let buf = allocator_api2::vec![in &pool; 0u8; 64];
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(&buf[..0], qb, rw, rdma_pool::grant::GrantKind::Auto) },
        Err(GrantError::Empty)
    ));
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(&[1u8; 8], qb, rw, rdma_pool::grant::GrantKind::Auto) },
        Err(GrantError::OutsidePool)
    ));
    // Two neighbouring blocks: a range across them.
    let l = Layout::from_size_align(64, 8).unwrap();
    let (p, q) = (pool.alloc(l), pool.alloc(l));
    let (lo, hi) = (p.min(q), p.max(q));
    if hi as usize == lo as usize + 64 {
        // SAFETY: both blocks are ours and live.
        let both = unsafe { std::slice::from_raw_parts(lo, 128) };
        assert!(matches!(
            // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
            unsafe { pool.grant_with(both, qb, rw, rdma_pool::grant::GrantKind::Auto) },
            Err(GrantError::AcrossBlocks { excess: 64 })
        ));
    }
    // SAFETY: blocks of this pool with `l`.
    unsafe { (pool.free_sized(p, l), pool.free_sized(q, l)) };
    // A freed large block.
    let big = Layout::from_size_align(4 << 20, 4096).unwrap();
    let r = pool.alloc(big);
    // SAFETY: a block of this pool with `big`.
    unsafe { pool.free_sized(r, big) };
    // SAFETY: the run stays mapped while the pool lives; the grant reads nothing.
    let stale = unsafe { std::slice::from_raw_parts(r, 64) };
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(stale, qb, rw, rdma_pool::grant::GrantKind::Auto) },
        Err(GrantError::NotAllocated { .. })
    ));
    // Rights a grant cannot carry.
    for bad in [
        Access::empty(),
        Access::LOCAL_WRITE,
        rw | Access::MW_BIND,
        rw | Access::ZERO_BASED,
    ] {
        assert!(
            // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
            matches!(
                unsafe { pool.grant_with(&buf, qb, bad, rdma_pool::grant::GrantKind::Auto) },
                Err(GrantError::Rights(_))
            ),
            "{bad:?}"
        );
    }
    // A QP of another device, of another PD, not connected.
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(&buf, &bed.qa, rw, rdma_pool::grant::GrantKind::Auto) },
        Err(GrantError::ForeignQp)
    ));
    let other_pd = bed.b.nic.alloc_pd().unwrap();
    let foreign = bed.b.qp_in(&other_pd);
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(&buf, &foreign, rw, rdma_pool::grant::GrantKind::Auto) },
        Err(GrantError::ForeignQp)
    ));
    let idle = bed.b.qp();
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(&buf, &idle, rw, rdma_pool::grant::GrantKind::Auto) },
        Err(GrantError::QpNotReady(QpState::Init))
    ));
    nothing_leaked(&pool);
    assert_eq!(pool.stats().grants.issued, 0);
}

#[test]
fn limits_are_typed_errors_and_a_refused_grant_returns_what_it_took() {
    let _s = serial();
    let bed = soft_bed(rdma_pool::nic::soft::SoftConfig {
        max_mw: 1,
        ..Default::default()
    });
    let pool = pool_on(&bed.b.pd);
    let (a, b) = (
        allocator_api2::vec![in &pool; 0u8; 64],
        allocator_api2::vec![in &pool; 0u8; 64],
    );
    let rw = Access::REMOTE_WRITE;
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g =
        unsafe { pool.grant_with(&a, &bed.qb, rw, rdma_pool::grant::GrantKind::Auto) }.unwrap();
    // The device's one window is lent out.
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(&b, &bed.qb, rw, rdma_pool::grant::GrantKind::Auto) },
        Err(GrantError::Limit {
            what: "max_mw",
            max: 1,
            ..
        })
    ));
    pool.set_grant_limits(GrantLimits {
        regions: 1,
        region_bytes: 100,
        ..Default::default()
    });
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut r = unsafe { pool.grant_with(&b, &bed.qb, rw, GrantKind::Region) }.unwrap();
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(&a, &bed.qb, rw, GrantKind::Region) },
        Err(GrantError::Limit {
            what: "region grants",
            max: 1,
            ..
        })
    ));
    pool.set_grant_limits(GrantLimits {
        regions: 2,
        region_bytes: 100,
        ..Default::default()
    });
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(&a, &bed.qb, rw, GrantKind::Region) },
        Err(GrantError::Limit {
            what: "region grant bytes",
            max: 100,
            ..
        })
    ));
    assert_eq!(pool.stats().grants.open, 2);
    assert_eq!(pool.stats().grants.refused, 3, "each refusal is counted");
    revoke(&mut g, &bed.b);
    revoke(&mut r, &bed.b);
    assert!(matches!(
        r.revoke(&bed.b.cq, |_| {}),
        Err(GrantError::Revoked)
    ));
    // The window came back to the cache: the next grant reuses it.
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g2 =
        unsafe { pool.grant_with(&b, &bed.qb, rw, rdma_pool::grant::GrantKind::Auto) }.unwrap();
    bound(&mut g2, &bed.b);
    assert_eq!(pool.stats().grants.windows, 1);
    revoke(&mut g2, &bed.b);
    drop((g, r, g2));
    nothing_leaked(&pool);
}

#[test]
fn dropping_grants_and_the_pool_without_draining_leaks_nothing() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let v = allocator_api2::vec![in &pool; 0u8; 4096];
    for kind in kinds() {
        let g = pool.grant_read_with(&v[..100], &bed.qb, kind).unwrap();
        drop(g);
    }
    drop(v);
    let s = pool.stats().grants;
    assert!(s.open >= 2 && s.quarantined_blocks == 1, "{s:?}");
    // Dropping the pool deallocates the windows still revoking and frees the parked block.
    drop(pool);
    // Late completions of the dropped pool's work requests are ignored by a new pool.
    let pool = pool_on(&bed.b.pd);
    drain(&pool, &bed.b);
    nothing_leaked(&pool);
}

#[test]
fn owned_grants_give_the_buffer_back() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let (_src, src) = scratch(&bed.a, 16, 0x5A);
    let buf = allocator_api2::vec![in &pool; 0u8; 16];
    let mut og = pool
        .grant_owned(buf, &bed.qb, Access::REMOTE_WRITE)
        .unwrap();
    og.wait(&bed.b.cq, |wc| panic!("unexpected completion {wc:?}"))
        .unwrap();
    let w = og.wire();
    assert_eq!(
        write(&bed.a, &bed.qa, &src, 16, w.addr, w.rkey),
        WcStatus::Success
    );
    // While the write grant lives, the program reads what the peer wrote by atomic copy.
    let mut seen = [0u8; 20];
    assert_eq!(og.read_at(0, &mut seen), 16);
    assert_eq!(seen[..16], [0x5A; 16]);
    assert_eq!(og.read_at(12, &mut seen), 4);
    assert_eq!(og.read_at(16, &mut seen), 0);
    let buf = og.revoke(&bed.b.cq, |_| {}).map_err(|(_, e)| e).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5A));
    // Dropped unrevoked: the buffer is freed into quarantine until the pool sees the
    // invalidation.
    let og = pool
        .grant_owned(buf, &bed.qb, Access::REMOTE_WRITE)
        .unwrap();
    drop(og);
    assert_eq!(pool.stats().grants.quarantined_blocks, 1);
    drain(&pool, &bed.b);
    nothing_leaked(&pool);
    assert_eq!(pool.live_blocks(), 0);
    // A buffer of another allocator is refused and given back.
    let (back, e) = pool
        .grant_owned(vec![1u8; 8], &bed.qb, Access::REMOTE_WRITE)
        .unwrap_err();
    assert!(matches!(e, GrantError::OutsidePool) && back == [1u8; 8]);
}

#[test]
fn two_pools_on_one_qp_never_take_each_others_completions() {
    let _s = serial();
    let bed = bed();
    let (p1, p2) = (pool_on(&bed.b.pd), pool_on(&bed.b.pd));
    let (v1, v2) = (
        allocator_api2::vec![in &p1; 0u8; 64],
        allocator_api2::vec![in &p2; 0u8; 64],
    );
    for _ in 0..3 {
        let g1 = p1.grant(&v1, &bed.qb).unwrap();
        let g2 = p2.grant(&v2, &bed.qb).unwrap();
        drop((g1, g2));
        // Each pool gets its own two completions out of the shared CQ's poll: a completion
        // routed to the wrong pool would leave the right one waiting (`drain` then times out
        // with work in flight).
        let before = (
            p1.stats().grants.wrs_in_flight,
            p2.stats().grants.wrs_in_flight,
        );
        assert_eq!(before, (2, 2));
        drain(&p1, &bed.b);
        drain(&p2, &bed.b);
        let after = (
            p1.stats().grants.wrs_in_flight,
            p2.stats().grants.wrs_in_flight,
        );
        assert_eq!(after, (0, 0), "each pool owns its bind and invalidation");
    }
    nothing_leaked(&p1);
    nothing_leaked(&p2);
}

#[test]
fn a_region_that_refuses_deregistration_keeps_its_grant_open() {
    let _s = serial();
    let bed = soft_bed(Default::default());
    let pool = pool_on(&bed.b.pd);
    let buf = allocator_api2::vec![in &pool; 0u8; 64];
    let (_src, src) = scratch(&bed.a, 8, 0x11);
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g =
        unsafe { pool.grant_with(&buf, &bed.qb, Access::REMOTE_WRITE, GrantKind::Region) }.unwrap();
    let w = g.wire();
    let soft = bed.b.nic.as_soft().unwrap();
    // Retirement moves the region off the buffer (rereg); refused, it deregisters; refused
    // too, the key may still work.
    soft.fail_next(rdma_pool::nic::Verb::ReregMr, 1, libc::EBUSY);
    soft.fail_next(rdma_pool::nic::Verb::DeregMr, 1, libc::EBUSY);
    g.start_revoke().unwrap();
    let s = pool.stats().grants;
    assert_eq!((s.stuck_revocations, s.open), (1, 1), "{s:?}");
    assert!(!g.is_revoked(), "the key may still work: not revoked");
    // Dropping the handle tries again; now the region goes and the grant closes.
    drop(g);
    assert_eq!(pool.stats().grants.open, 0);
    assert!(refused(write(&bed.a, &bed.qa, &src, 8, w.addr, w.rkey)));
    nothing_leaked(&pool);
}

#[test]
fn any_part_of_a_large_block_can_be_granted() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let big = allocator_api2::vec![in &pool; 0u8; 4 << 20];
    let (_src, src) = scratch(&bed.a, 64, 0x77);
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g = unsafe {
        pool.grant_with(
            &big[3 << 20..(3 << 20) + 4096],
            &bed.qb,
            Access::REMOTE_WRITE,
            rdma_pool::grant::GrantKind::Auto,
        )
    }
    .unwrap();
    bound(&mut g, &bed.b);
    let w = g.wire();
    assert_eq!(
        write(&bed.a, &bed.qa, &src, 64, w.addr, w.rkey),
        WcStatus::Success
    );
    assert!(big[3 << 20..(3 << 20) + 64].iter().all(|&b| b == 0x77));
    revoke(&mut g, &bed.b);
    drop(g);
    nothing_leaked(&pool);
}

/// A region grant names its peer through the QP too: one never connected, or failed, is
/// refused, as for windows.
#[test]
fn region_grants_check_the_qp_like_window_grants() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let buf = allocator_api2::vec![in &pool; 0u8; 64];
    let idle = bed.b.qp();
    assert!(matches!(
        pool.grant_read_with(&buf, &idle, GrantKind::Region),
        Err(GrantError::QpNotReady(QpState::Init))
    ));
    let g = pool
        .grant_read_with(&buf, &bed.qb, GrantKind::Region)
        .unwrap();
    drop(g);
    drain(&pool, &bed.b);
    nothing_leaked(&pool);
}

/// One pool's revocation polls a CQ another pool's grants complete on too: the other pool's
/// completions reach that pool, never the application's closure.
#[test]
fn one_pools_revocation_hands_the_others_completions_to_the_other_pool() {
    let _s = serial();
    let bed = bed();
    let (p1, p2) = (pool_on(&bed.b.pd), pool_on(&bed.b.pd));
    let (v1, v2) = (
        allocator_api2::vec![in &p1; 0u8; 64],
        allocator_api2::vec![in &p2; 0u8; 64],
    );
    let mut g1 = p1.grant(&v1, &bed.qb).unwrap();
    let g2 = p2.grant(&v2, &bed.qb).unwrap();
    drop(g2);
    g1.revoke(&bed.b.cq, |wc| {
        panic!("another pool's completion reached the application: {wc:?}")
    })
    .unwrap();
    drop(g1);
    drain(&p2, &bed.b);
    let s = p2.stats().grants;
    assert_eq!((s.open, s.wrs_in_flight), (0, 0), "{s:?}");
    nothing_leaked(&p1);
    nothing_leaked(&p2);
}

/// Blocks freed by their owner thread (to its cache and on to the page) or by a third thread
/// (onto the page's remote list) are not live for a grant made on yet another thread.
#[test]
fn frees_from_every_thread_are_seen_by_a_grant_on_another() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let l = Layout::from_size_align(64, 8).unwrap();
    let (to_main, from_owner) = std::sync::mpsc::channel::<Vec<usize>>();
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (to_freer, from_main) = std::sync::mpsc::channel::<Vec<usize>>();
    let (freed, freed_wait) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let pool = &pool;
        // The owner: allocates 300 blocks, keeps one live, frees 200 itself (its cache holds
        // 32, the rest go back to their page), hands 99 to another thread to free, and stays
        // alive (its pages stay its own) until the checks are done.
        s.spawn(move || {
            let blocks: Vec<usize> = (0..300).map(|_| pool.alloc(l) as usize).collect();
            for &b in &blocks[1..201] {
                // SAFETY: blocks of this pool with `l`, freed once.
                unsafe { pool.free_sized(b as *mut u8, l) };
            }
            to_main.send(blocks).unwrap();
            wait.recv().unwrap();
        });
        s.spawn(move || {
            let blocks = from_main.recv().unwrap();
            for b in blocks {
                // SAFETY: blocks of this pool with `l`, handed over by their owner, freed once.
                unsafe { pool.free_sized(b as *mut u8, l) };
            }
            freed.send(()).unwrap();
        });
        let blocks = from_owner.recv().unwrap();
        to_freer.send(blocks[201..].to_vec()).unwrap();
        freed_wait.recv().unwrap();
        let grant = |b: usize| {
            // SAFETY: the block stays mapped while the pool lives; a refused grant reads
            // nothing, and a granted (live) one is revoked before the block is freed.
            let s = unsafe { std::slice::from_raw_parts(b as *const u8, 64) };
            pool.grant_read_with(s, &bed.qb, GrantKind::Type2)
        };
        let mut granted = Vec::new();
        for (i, &b) in blocks.iter().enumerate().skip(1) {
            match grant(b) {
                Err(GrantError::NotAllocated { .. }) => {}
                r => {
                    let who = if i <= 200 {
                        "its owner"
                    } else {
                        "a third thread"
                    };
                    granted.push(format!(
                        "block {i}, freed by {who}: {:?}",
                        r.map(|g| g.rkey())
                    ));
                }
            }
        }
        drain(pool, &bed.b);
        let live = grant(blocks[0]).map(|mut g| revoke(&mut g, &bed.b));
        go.send(()).unwrap();
        assert!(granted.is_empty(), "freed blocks granted: {granted:?}");
        live.expect("the live block");
        // SAFETY: the live block, freed once.
        unsafe { pool.free_sized(blocks[0] as *mut u8, l) };
    });
    // The joined threads' heaps are given back by their thread-local destructors, which may
    // still be running: `validate` is for a quiescent pool.
    for _ in 0..500 {
        if pool.validate() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    nothing_leaked(&pool);
}
