//! Memory freed while a grant on it is revoking is parked, never handed out again, until the
//! invalidation completed.

use super::*;
use rdma_pool::arena::{ArenaConfig, Hugepages};
use std::alloc::Layout;
use std::collections::HashSet;
use std::sync::Mutex;

#[test]
fn memory_freed_while_revoking_comes_back_only_after_the_invalidation_completed() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    for size in [256, 100 << 10, 4 << 20] {
        let layout = Layout::from_size_align(size, 8).unwrap();
        let p = pool.alloc(layout);
        // SAFETY: a fresh block of `size` bytes.
        let buf = unsafe { std::slice::from_raw_parts(p, size) };
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        let mut g = unsafe {
            pool.grant_with(
                buf,
                &bed.qb,
                Access::REMOTE_WRITE,
                rdma_pool::grant::GrantKind::Auto,
            )
        }
        .unwrap();
        bound(&mut g, &bed.b);
        let kind = g.kind();
        // Dropping starts the revocation; its completion is not handed to the pool yet.
        drop(g);
        // SAFETY: the block is ours, freed once.
        unsafe { pool.free_sized(p, layout) };
        let s = pool.stats().grants;
        let parked = kind != GrantKind::Region;
        assert_eq!(s.quarantined_blocks, parked as u64, "{size}: {s:?}");
        let again: Vec<_> = (0..64).map(|_| pool.alloc(layout)).collect();
        assert!(
            !parked || !again.contains(&p),
            "{size}: a parked block was handed out"
        );
        for &q in &again {
            // SAFETY: blocks of this pool with `layout`.
            unsafe { pool.free_sized(q, layout) };
        }
        // The invalidation completes: the block leaves quarantine and is reused.
        assert_eq!(drain(&pool, &bed.b), parked as usize);
        nothing_leaked(&pool);
        let back: Vec<_> = (0..64).map(|_| pool.alloc(layout)).collect();
        assert!(back.contains(&p), "{size}: the block came back");
        for &q in &back {
            // SAFETY: as above.
            unsafe { pool.free_sized(q, layout) };
        }
    }
    assert_eq!(pool.live_blocks(), 0);
}

#[test]
fn a_granted_block_is_moved_not_resized_in_place() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let layout = Layout::from_size_align(200 << 10, 8).unwrap();
    let p = pool.alloc(layout);
    // SAFETY: a fresh block of this size.
    let g = pool
        .grant(unsafe { std::slice::from_raw_parts(p, 4096) }, &bed.qb)
        .unwrap();
    drop(g);
    // A shrink in place would hand the granted bytes' neighbours back; the block moves.
    // SAFETY: `p` came from this pool with `layout`.
    let q = unsafe { pool.realloc(p, layout, 100 << 10) };
    assert_ne!(q, p);
    assert_eq!(pool.stats().grants.quarantined_blocks, 1);
    drain(&pool, &bed.b);
    // SAFETY: `q` is the live block now.
    unsafe { pool.free(q) };
    nothing_leaked(&pool);
    assert_eq!(pool.live_blocks(), 0);
}

#[test]
fn threads_freeing_granted_memory_never_get_a_parked_block_back() {
    let _s = serial();
    let (na, nb) = nics();
    let (a, b) = (Side::new(na), Side::new(nb));
    let pool = pool_on(&b.pd);
    // One send CQ for all the server's QPs, deep enough for every bind and invalidation.
    let cq = b.nic.create_cq(4096).unwrap();
    let caps = QpCaps {
        max_send_wr: 512,
        ..Default::default()
    };
    const THREADS: usize = 4;
    const ROUNDS: usize = 100;
    let qps: Vec<(Qp, Qp)> = (0..THREADS)
        .map(|_| {
            let qb = b.pd.create_qp(&cq, &cq, caps).unwrap();
            let qa = a.qp();
            link(&qa, &qb);
            (qa, qb)
        })
        .collect();
    let parked = Mutex::new(HashSet::new());
    std::thread::scope(|s| {
        for (t, (_, qb)) in qps.iter().enumerate() {
            let (pool, parked) = (&pool, &parked);
            s.spawn(move || {
                let sizes = [64usize, 1000, 100 << 10];
                for i in 0..ROUNDS {
                    let layout = Layout::from_size_align(sizes[(i + t) % 3], 8).unwrap();
                    let p = pool.alloc(layout);
                    assert!(
                        !parked.lock().unwrap().contains(&(p as usize)),
                        "a parked block came back"
                    );
                    // SAFETY: a fresh block.
                    let buf = unsafe { std::slice::from_raw_parts(p, 16) };
                    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
                    let g = unsafe {
                        pool.grant_with(
                            buf,
                            qb,
                            Access::REMOTE_WRITE,
                            rdma_pool::grant::GrantKind::Auto,
                        )
                    }
                    .unwrap();
                    parked.lock().unwrap().insert(p as usize);
                    drop(g);
                    // SAFETY: ours, freed once; parked until the pool sees the invalidation.
                    unsafe { pool.free_sized(p, layout) };
                    // Churn the same classes meanwhile (frees in flagged granules included).
                    let churn: Vec<_> = (0..8).map(|_| pool.alloc(layout)).collect();
                    for &q in &churn {
                        assert!(
                            !parked.lock().unwrap().contains(&(q as usize)),
                            "a parked block came back"
                        );
                        // SAFETY: blocks of this pool with `layout`.
                        unsafe { pool.free_sized(q, layout) };
                    }
                }
            });
        }
    });
    let s = pool.stats().grants;
    assert_eq!(s.quarantined_blocks, (THREADS * ROUNDS) as u64, "{s:?}");
    assert_eq!(s.open, (THREADS * ROUNDS) as u64);
    assert_eq!(
        s.wrs_in_flight,
        (2 * THREADS * ROUNDS) as u64,
        "a bind and an invalidation each"
    );
    // The pool takes its completions inside the poll; none comes out.
    let deadline = std::time::Instant::now() + WAIT;
    while pool.stats().grants.wrs_in_flight != 0 {
        assert_eq!(
            cq.poll_one().unwrap(),
            None,
            "the pool's completion came out"
        );
        assert!(std::time::Instant::now() < deadline, "completions missing");
        std::thread::yield_now();
    }
    nothing_leaked(&pool);
    assert_eq!(pool.live_blocks(), 0);
}

#[test]
fn purge_never_touches_granted_or_parked_memory() {
    let _s = serial();
    let bed = bed();
    // 4 MiB chunks: each block below has a registration of its own. (A grant exposes the
    // registration under it, like `keys_of`: one shared with live memory keeps its slabs.)
    let cfg = ArenaConfig {
        reserve: 1 << 32,
        chunk: 4 << 20,
        hugepages: Hugepages::Off,
        ..Default::default()
    };
    let pool = Pool::with_config(&bed.b.pd, cfg).unwrap();
    let layout = Layout::from_size_align(4 << 20, 4096).unwrap();
    let (live, parked) = (pool.alloc(layout), pool.alloc(layout));
    let idle = pool.alloc(layout);
    // SAFETY: fresh blocks of `layout`.
    let (lbuf, pbuf) = unsafe {
        (
            std::slice::from_raw_parts(live, 4096),
            std::slice::from_raw_parts(parked, 4096),
        )
    };
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g = unsafe {
        pool.grant_with(
            lbuf,
            &bed.qb,
            Access::REMOTE_WRITE,
            rdma_pool::grant::GrantKind::Auto,
        )
    }
    .unwrap();
    bound(&mut g, &bed.b);
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let gp = unsafe {
        pool.grant_with(
            pbuf,
            &bed.qb,
            Access::REMOTE_WRITE,
            rdma_pool::grant::GrantKind::Auto,
        )
    }
    .unwrap();
    drop(gp);
    // SAFETY: blocks of this pool with `layout`, freed once.
    unsafe {
        (
            pool.free_sized(parked, layout),
            pool.free_sized(idle, layout),
        )
    };
    assert_eq!(pool.stats().grants.quarantined_blocks, 1);
    assert!(pool.purge() >= 4 << 20, "the idle block is purged");
    let arena = pool.arena();
    assert!(arena.is_purged(idle));
    assert!(
        !arena.is_purged(live) && !arena.is_purged(parked),
        "granted memory stays"
    );
    // The live grant still reaches its memory after the purge.
    let (_src, src) = scratch(&bed.a, 64, 0x3C);
    let w = g.wire();
    assert_eq!(
        write(&bed.a, &bed.qa, &src, 64, w.addr, w.rkey),
        WcStatus::Success
    );
    assert!(lbuf[..64].iter().all(|&b| b == 0x3C));
    if let Some(soft) = bed.b.nic.as_soft() {
        assert_eq!(soft.counters().stale_pinned_accesses, 0);
    }
    revoke(&mut g, &bed.b);
    drop(g);
    // The parked block leaves quarantine with its invalidation, and may be purged then.
    drain(&pool, &bed.b);
    assert!(pool.purge() >= 4 << 20);
    assert!(arena.is_purged(parked));
    // SAFETY: as above.
    unsafe { pool.free_sized(live, layout) };
    nothing_leaked(&pool);
}
