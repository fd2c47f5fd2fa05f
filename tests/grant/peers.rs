//! What a peer can and cannot reach through a grant.

use super::*;
use allocator_api2::vec;
use std::collections::HashSet;

#[test]
fn each_peer_reaches_its_own_buffer_and_nothing_else() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let (qa2, qb2) = connect(&bed.a, &bed.b);
    let buf1 = vec![in &pool; 1u8; 4096];
    let buf2 = vec![in &pool; 2u8; 4096];
    let rw = Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g1 =
        unsafe { pool.grant_with(&buf1, &bed.qb, rw, rdma_pool::grant::GrantKind::Auto) }.unwrap();
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g2 =
        unsafe { pool.grant_with(&buf2, &qb2, rw, rdma_pool::grant::GrantKind::Auto) }.unwrap();
    bound(&mut g1, &bed.b);
    bound(&mut g2, &bed.b);
    // Type 2 windows, with a region of their own where window bounds are not enforced.
    assert_eq!(g1.kind(), GrantKind::Type2);
    assert_eq!(g1.is_dedicated(), bounds_broken(&bed.b.nic));
    assert_ne!(g1.rkey(), g2.rkey());

    let (_src, src) = scratch(&bed.a, 64, 0xAA);
    let w1 = g1.wire();
    assert_eq!(
        write(&bed.a, &bed.qa, &src, 64, w1.addr, w1.rkey),
        WcStatus::Success
    );
    assert!(buf1[..64].iter().all(|&b| b == 0xAA) && buf1[64] == 1);
    let (dst_mem, dst) = scratch(&bed.a, 4096, 0);
    assert_eq!(
        read(&bed.a, &bed.qa, &dst, 4096, w1.addr, w1.rkey),
        WcStatus::Success
    );
    assert_eq!(dst_mem.as_slice()[100], 1);

    // Peer B with A's key, through its own QP: refused (a type 2 key works through A's QP
    // only), and A's buffer is untouched.
    let st = write(&bed.a, &qa2, &src, 64, w1.addr + 64, w1.rkey);
    assert!(refused(st), "{st:?}");
    assert!(buf1[64..].iter().all(|&b| b == 1));
    assert!(buf2.iter().all(|&b| b == 2));
    revoke(&mut g1, &bed.b);
    revoke(&mut g2, &bed.b);
    drop((g1, g2));
    nothing_leaked(&pool);
}

#[test]
fn one_byte_outside_a_grant_is_refused_for_every_kind() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 5u8; 4096];
    let (_src, src) = scratch(&bed.a, 2, 0xEE);
    for kind in kinds() {
        for (offset, len, ok) in [
            (0, 1, true),
            (1023, 1, true),
            (-1, 1, false),
            (1024, 1, false),
            (1023, 2, false),
        ] {
            // A refused access breaks the QP pair: a fresh one per attempt.
            let (qa, qb) = connect(&bed.a, &bed.b);
            let part = &buf[1024..2048];
            // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
            let mut g = unsafe { pool.grant_with(part, &qb, Access::REMOTE_WRITE, kind) }.unwrap();
            bound(&mut g, &bed.b);
            let addr = (g.addr() as i64 + offset) as u64;
            let st = write(&bed.a, &qa, &src, len, addr, g.rkey());
            assert_eq!(
                st == WcStatus::Success,
                ok,
                "{kind:?} at {offset}+{len}: {st:?}"
            );
            revoke(&mut g, &bed.b);
        }
    }
    assert!(
        buf[1023] == 5 && buf[2048] == 5,
        "no byte outside the grant changed"
    );
    assert!(buf[1024..2048].iter().all(|&b| b == 0xEE || b == 5));
    nothing_leaked(&pool);
}

#[test]
fn a_read_only_grant_refuses_writes() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 3u8; 256];
    let (_src, src) = scratch(&bed.a, 256, 9);
    for kind in kinds() {
        let (qa, qb) = connect(&bed.a, &bed.b);
        let mut g = pool.grant_read_with(&buf, &qb, kind).unwrap();
        bound(&mut g, &bed.b);
        assert_eq!(
            read(&bed.a, &qa, &src, 256, g.addr() as u64, g.rkey()),
            WcStatus::Success
        );
        let st = write(&bed.a, &qa, &src, 256, g.addr() as u64, g.rkey());
        assert!(refused(st), "{kind:?}: {st:?}");
        revoke(&mut g, &bed.b);
    }
    assert!(buf.iter().all(|&b| b == 3));
    nothing_leaked(&pool);
}

#[test]
fn a_revoked_key_is_refused_for_every_kind() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 8192];
    let (_src, src) = scratch(&bed.a, 64, 0x77);
    for kind in kinds() {
        let (qa, qb) = connect(&bed.a, &bed.b);
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        let mut g = unsafe { pool.grant_with(&buf, &qb, Access::REMOTE_WRITE, kind) }.unwrap();
        bound(&mut g, &bed.b);
        let w = g.wire();
        assert_eq!(
            write(&bed.a, &qa, &src, 64, w.addr, w.rkey),
            WcStatus::Success
        );
        revoke(&mut g, &bed.b);
        assert!(g.is_revoked());
        assert!(matches!(
            g.start_revoke(),
            Err(rdma_pool::grant::GrantError::Revoked)
        ));
        let st = write(&bed.a, &qa, &src, 64, w.addr, w.rkey);
        assert!(refused(st), "{kind:?}: {st:?}");
    }
    nothing_leaked(&pool);
}

#[test]
fn stale_keys_never_match_after_hundreds_of_rebinds() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 64];
    let (_src, src) = scratch(&bed.a, 8, 1);
    for (kind, n) in [(GrantKind::Type2, 300), (GrantKind::Type1, 150)] {
        let mut keys = HashSet::new();
        let (qa, qb) = connect(&bed.a, &bed.b);
        for _ in 0..n {
            // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
            let mut g = unsafe { pool.grant_with(&buf, &qb, Access::REMOTE_WRITE, kind) }.unwrap();
            bound(&mut g, &bed.b);
            assert!(
                keys.insert(g.rkey()),
                "{kind:?}: key {:?} handed out twice",
                g.rkey()
            );
            revoke(&mut g, &bed.b);
        }
        let s = pool.stats().grants;
        assert!(
            s.windows_retired >= 1,
            "{kind:?}: a window spent its variants: {s:?}"
        );
        // Every stale key fails, whichever window generation it came from.
        let first = *keys.iter().min_by_key(|k| k.0).unwrap();
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        let mut g = unsafe { pool.grant_with(&buf, &qb, Access::REMOTE_WRITE, kind) }.unwrap();
        bound(&mut g, &bed.b);
        assert!(!keys.contains(&g.rkey()));
        let st = write(&bed.a, &qa, &src, 8, g.addr() as u64, first);
        assert!(refused(st), "{kind:?}: {st:?}");
        revoke(&mut g, &bed.b);
    }
    nothing_leaked(&pool);
}

#[test]
fn a_grant_whose_qp_failed_is_revoked_by_deallocating_its_window() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 128];
    let (_src, src) = scratch(&bed.a, 8, 1);
    // A type 1 key works from any QP of the PD: its revocation must hold for all of them.
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g =
        unsafe { pool.grant_with(&buf, &bed.qb, Access::REMOTE_WRITE, GrantKind::Type1) }.unwrap();
    bound(&mut g, &bed.b);
    let w = g.wire();
    // The server's QP fails: a READ with a bogus key is refused and moves it to the error state.
    let (_m, local) = scratch(&bed.b, 8, 0);
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe {
        bed.qb
            .post_read(9, &[local.sge(0, 8).unwrap()], 0x1000, Rkey(0x00ba_d0ff))
    }
    .unwrap();
    let wc = bed.b.wait();
    // SAFETY: a completion the device reported, handed over once.
    let taken = unsafe { pool.on_completion(&wc) };
    assert!(!taken, "the application's completion is not the pool's");
    assert_eq!(bed.qb.state().unwrap(), QpState::Error);
    revoke(&mut g, &bed.b);
    assert_eq!(pool.stats().grants.revoked_by_dealloc, 1);
    let (qa, _qb) = connect(&bed.a, &bed.b);
    let st = write(&bed.a, &qa, &src, 8, w.addr, w.rkey);
    assert!(refused(st), "{st:?}");
    // A grant on a failed QP is refused outright.
    let r = pool.grant(&buf, &bed.qb);
    assert!(matches!(
        r,
        Err(rdma_pool::grant::GrantError::QpNotReady(QpState::Error))
    ));
    drop(g);
    nothing_leaked(&pool);
}

#[test]
fn a_peers_send_with_invalidate_kills_its_key_where_the_device_reports_it() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 256];
    let (_r, recv) = scratch(&bed.b, 64, 0);
    let (_src, src) = scratch(&bed.a, 64, 4);
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g = unsafe {
        pool.grant_with(
            &buf,
            &bed.qb,
            Access::REMOTE_WRITE,
            rdma_pool::grant::GrantKind::Auto,
        )
    }
    .unwrap();
    bound(&mut g, &bed.b);
    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
    unsafe { bed.qb.post_recv(5, &[recv.sge(0, 64).unwrap()]) }.unwrap();
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa
            .post_send_with_inv(6, &[src.sge(0, 8).unwrap()], g.rkey())
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    let wc = bed.b.wait();
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Success));
    // The receive is the application's; the poll told the pool of the SEND_WITH_INV.
    assert!(!rdma_pool::nic::is_reserved_wr_id(wc.wr_id));
    let reported = !applies(bed.b.nic.caps(), Quirk::SendWithInvNotReported);
    assert_eq!(pool.stats().grants.peer_invalidations, reported as u64);
    let st = write(&bed.a, &bed.qa, &src, 8, g.addr() as u64, g.rkey());
    assert!(refused(st), "the key died with the SEND_WITH_INV: {st:?}");
    revoke(&mut g, &bed.b);
    drop(g);
    nothing_leaked(&pool);
}

#[test]
fn without_windows_a_grant_is_a_region_of_its_own() {
    let _s = serial();
    let bed = soft_bed(rdma_pool::nic::soft::SoftConfig {
        max_mw: 0,
        mw_type1: false,
        mw_type2: false,
        ..Default::default()
    });
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 4096];
    let (_src, src) = scratch(&bed.a, 2, 0x42);
    // Auto isolates: without type 2 windows it refuses rather than fall back to a key any QP
    // of the PD may use.
    assert!(matches!(
        // SAFETY: refused: nothing is granted.
        unsafe { pool.grant_with(&buf[..100], &bed.qb, Access::REMOTE_WRITE, GrantKind::Auto) },
        Err(rdma_pool::grant::GrantError::Unsupported(_))
    ));
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    let mut g = unsafe {
        pool.grant_with(
            &buf[..100],
            &bed.qb,
            Access::REMOTE_WRITE,
            rdma_pool::grant::GrantKind::Region,
        )
    }
    .unwrap();
    bound(&mut g, &bed.b);
    assert_eq!((g.kind(), g.is_dedicated()), (GrantKind::Region, true));
    assert_eq!(pool.stats().grants.dedicated_regions, 1);
    let w = g.wire();
    assert_eq!(
        write(&bed.a, &bed.qa, &src, 2, w.addr + 98, w.rkey),
        WcStatus::Success
    );
    assert!(refused(write(
        &bed.a,
        &bed.qa,
        &src,
        2,
        w.addr + 99,
        w.rkey
    )));
    let (qa, _qb) = connect(&bed.a, &bed.b);
    revoke(&mut g, &bed.b);
    assert!(refused(write(&bed.a, &qa, &src, 2, w.addr, w.rkey)));
    let (_qa3, qb3) = connect(&bed.a, &bed.b);
    assert!(matches!(
        // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
        unsafe { pool.grant_with(&buf, &qb3, Access::REMOTE_WRITE, GrantKind::Type2) },
        Err(rdma_pool::grant::GrantError::Unsupported(_))
    ));
    drop(g);
    nothing_leaked(&pool);
}

/// A grant with `REMOTE_ATOMIC`, of each kind: the peer's fetch-and-add and compare-and-swap
/// land in the granted word (read meanwhile by atomic copy); another word's offset outside the
/// grant, or a misaligned one, is refused.
#[test]
fn an_atomic_grant_takes_the_peers_atomics() {
    let _s = serial();
    for kind in [GrantKind::Type2, GrantKind::Type1, GrantKind::Region] {
        let mut bed = bed();
        let pool = pool_on(&bed.b.pd);
        let buf = vec![in &pool; 0u8; 64];
        let mut g = pool
            .grant_owned_with(buf, &bed.qb, Access::REMOTE_ATOMIC, kind)
            .map_err(|(_, e)| e)
            .unwrap();
        g.wait(&bed.b.cq, |wc| panic!("{wc:?}")).unwrap();
        let w = g.wire();
        let (old, old_mr) = scratch(&bed.a, 8, 0);
        let word = |b: &Buffer| u64::from_ne_bytes(b.as_slice()[..8].try_into().unwrap());
        // SAFETY: `old` outlives the request and is read after its completion.
        unsafe {
            bed.qa
                .post_fetch_add(1, old_mr.sge(0, 8).unwrap(), w.addr + 8, w.rkey, 41)
        }
        .unwrap();
        assert_eq!(bed.a.wait().status, WcStatus::Success, "{kind:?}");
        // SAFETY: as above.
        unsafe {
            bed.qa
                .post_compare_swap(2, old_mr.sge(0, 8).unwrap(), w.addr + 8, w.rkey, 41, 42)
        }
        .unwrap();
        assert_eq!(bed.a.wait().status, WcStatus::Success, "{kind:?}");
        assert_eq!(word(&old), 41);
        let mut got = [0u8; 8];
        assert_eq!(g.read_at(8, &mut got), 8);
        assert_eq!(u64::from_ne_bytes(got), 42, "{kind:?}");
        // Past the grant's end: refused.
        // SAFETY: as above.
        unsafe {
            bed.qa
                .post_fetch_add(3, old_mr.sge(0, 8).unwrap(), w.addr + 64, w.rkey, 1)
        }
        .unwrap();
        assert!(refused(bed.a.wait().status), "{kind:?}");
        (bed.qa, bed.qb) = connect(&bed.a, &bed.b);
        let buf = g.revoke(&bed.b.cq, |_| {}).map_err(|(_, e)| e).unwrap();
        assert_eq!(buf[8], 42);
        drop(buf);
        nothing_leaked(&pool);
    }
}
