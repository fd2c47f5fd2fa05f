//! No key comes back: a revoked or stale key of any kind never names a later grant within the
//! key horizon, whatever the device does with the indices it gets back (rereg kept keys, new
//! keys, no rereg, windows deallocated after a failed QP); `Auto` chooses only type 2 windows,
//! whose variants a peer cannot predict.

use super::*;
use allocator_api2::vec;
use rdma_pool::grant::{GrantError, GrantLimits};
use rdma_pool::nic::soft::{ReregMode, SoftConfig};
use std::collections::HashMap;

/// Every key a grant of `pool` gave out, with the grant count it was issued at.
#[derive(Default)]
struct Seen(HashMap<u32, usize>);

impl Seen {
    /// Note the key of grant number `n`; no earlier grant may have had it within `horizon`.
    fn fresh(&mut self, key: Rkey, n: usize, horizon: usize, what: &str) {
        if let Some(&m) = self.0.get(&key.0) {
            assert!(
                n - m >= horizon,
                "{what}: grant {n} got key {key} of grant {m}, within the horizon {horizon}"
            );
        }
        self.0.insert(key.0, n);
    }
}

/// Grant and revoke `n` times, round-robin over 4 buffers (so addresses repeat), with the
/// kinds `kinds` in turn: every key is new, and every 64th grant the first grant's stale key
/// is tried on the new grant's address from the peer: refused.
fn churn(bed: &mut Bed, pool: &Pool, kinds: &[GrantKind], n: usize, what: &str) {
    let bufs: Vec<_> = (0..4).map(|i| vec![in pool; i as u8; 4096]).collect();
    let (_src, src) = scratch(&bed.a, 8, 0xee);
    let mut seen = Seen::default();
    let mut first = None;
    for i in 0..n {
        let kind = kinds[i % kinds.len()];
        // SAFETY: the test touches the buffers only after every grant on them was revoked.
        let mut g = unsafe { pool.grant_with(&bufs[i % 4], &bed.qb, Access::REMOTE_WRITE, kind) }
            .unwrap_or_else(|e| panic!("{what}: grant {i} ({kind:?}): {e}"));
        bound(&mut g, &bed.b);
        seen.fresh(g.rkey(), i, usize::MAX, what);
        let stale = *first.get_or_insert(g.rkey());
        if i > 0 && i % 64 == 0 {
            let st = write(&bed.a, &bed.qa, &src, 8, g.addr() as u64, stale);
            assert!(
                refused(st),
                "{what}: the first key wrote into grant {i}: {st:?}"
            );
            // The refusal failed the connection (RC): revoke on the failed QP, reconnect.
            revoke(&mut g, &bed.b);
            drop(g);
            (bed.qa, bed.qb) = connect(&bed.a, &bed.b);
            continue;
        }
        revoke(&mut g, &bed.b);
    }
    for b in &bufs {
        assert!(
            b.iter().all(|&x| x < 4),
            "{what}: no stale key wrote anything"
        );
    }
}

#[test]
fn no_revoked_key_comes_back_for_any_kind_whatever_rereg_does() {
    let _s = serial();
    for mode in [
        ReregMode::Mlx5,
        ReregMode::KeepKeys,
        ReregMode::ChangeKeys,
        ReregMode::Unsupported,
    ] {
        let mut bed = soft_bed(SoftConfig {
            rereg: mode,
            ..Default::default()
        });
        let pool = pool_on(&bed.b.pd);
        for kind in [GrantKind::Type2, GrantKind::Type1, GrantKind::Region] {
            // 300 > the 128 grants after which a region key came back, > 256 variants.
            churn(&mut bed, &pool, &[kind], 300, &format!("{mode:?} {kind:?}"));
        }
        let s = pool.stats().grants;
        if matches!(mode, ReregMode::Mlx5 | ReregMode::KeepKeys) {
            assert_eq!(s.regions_retired, 300, "{mode:?}: {s:?}");
        }
        nothing_leaked(&pool);
    }
}

#[test]
fn kinds_mixed_never_share_a_key_on_the_device_used_by_the_suite() {
    let _s = serial();
    let mut bed = bed();
    let pool = pool_on(&bed.b.pd);
    churn(
        &mut bed,
        &pool,
        &[
            GrantKind::Type2,
            GrantKind::Region,
            GrantKind::Type1,
            GrantKind::Auto,
        ],
        400,
        "mixed",
    );
    nothing_leaked(&pool);
}

#[test]
fn a_window_deallocated_after_its_qp_failed_gives_no_later_grant_its_keys() {
    let _s = serial();
    for mode in [ReregMode::Mlx5, ReregMode::Unsupported] {
        let mut bed = soft_bed(SoftConfig {
            rereg: mode,
            ..Default::default()
        });
        let pool = pool_on(&bed.b.pd);
        let buf = vec![in &pool; 0u8; 4096];
        let (_src, src) = scratch(&bed.a, 8, 1);
        let mut stale = Vec::new();
        for kind in [GrantKind::Type1, GrantKind::Type2] {
            // A few keys of the window first, so that several variants are stale.
            for _ in 0..3 {
                // SAFETY: the buffer is read only after the revocation.
                let mut g =
                    unsafe { pool.grant_with(&buf, &bed.qb, Access::REMOTE_WRITE, kind) }.unwrap();
                bound(&mut g, &bed.b);
                stale.push(g.rkey());
                revoke(&mut g, &bed.b);
            }
            // SAFETY: as above.
            let mut g =
                unsafe { pool.grant_with(&buf, &bed.qb, Access::REMOTE_WRITE, kind) }.unwrap();
            bound(&mut g, &bed.b);
            stale.push(g.rkey());
            // The server's QP fails: revocation deallocates the window.
            let (_m, local) = scratch(&bed.b, 8, 0);
            // SAFETY: the read's memory stays allocated and unread until its completion.
            unsafe {
                bed.qb
                    .post_read(9, &[local.sge(0, 8).unwrap()], 0x1000, Rkey(0x00ba_d0ff))
            }
            .unwrap();
            bed.b.wait();
            revoke(&mut g, &bed.b);
            drop(g);
            let (qa, qb) = connect(&bed.a, &bed.b);
            (bed.qa, bed.qb) = (qa, qb);
        }
        assert_eq!(pool.stats().grants.revoked_by_dealloc, 2, "{mode:?}");
        // Every later grant, of every kind, has a key none of the stale ones is.
        for i in 0..300 {
            let kind = [GrantKind::Region, GrantKind::Type1, GrantKind::Type2][i % 3];
            // SAFETY: as above.
            let mut g =
                unsafe { pool.grant_with(&buf, &bed.qb, Access::REMOTE_WRITE, kind) }.unwrap();
            bound(&mut g, &bed.b);
            assert!(
                !stale.contains(&g.rkey()),
                "{mode:?}: grant {i} ({kind:?}) got the stale key {}",
                g.rkey()
            );
            if i % 50 == 0 {
                for &k in &stale {
                    let st = write(&bed.a, &bed.qa, &src, 8, g.addr() as u64, k);
                    assert!(refused(st), "{mode:?}: stale key {k} wrote: {st:?}");
                    // The refusal failed the connection (RC): reconnect.
                    (bed.qa, bed.qb) = connect(&bed.a, &bed.b);
                }
            }
            revoke(&mut g, &bed.b);
        }
        assert!(buf.iter().all(|&b| b == 0));
        drop(buf);
        nothing_leaked(&pool);
    }
}

#[test]
fn a_small_max_mw_refuses_grants_rather_than_give_a_key_back_early() {
    let _s = serial();
    let bed = soft_bed(SoftConfig {
        max_mw: 2,
        ..Default::default()
    });
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 64];
    let mut seen = Seen::default();
    // Type 1: two keys per grant (bind, unbind), 127 grants per window.
    let mut n = 0;
    let refused_at = loop {
        // SAFETY: the buffer is read only after the revocation.
        match unsafe { pool.grant_with(&buf, &bed.qb, Access::REMOTE_READ, GrantKind::Type1) } {
            Ok(mut g) => {
                bound(&mut g, &bed.b);
                seen.fresh(g.rkey(), n, usize::MAX, "max_mw 2");
                revoke(&mut g, &bed.b);
                n += 1;
            }
            Err(GrantError::Limit { what: "max_mw", .. }) => break n,
            Err(e) => panic!("grant {n}: {e}"),
        }
        assert!(n < 1000, "never refused: windows were given back early");
    };
    assert_eq!(refused_at, 2 * 127, "both windows' keys used, then refused");
    // A key's bound is the horizon in force when it died: a shorter one set now does not give
    // those keys back (the windows' indices have no fresh variant left), and the error says
    // which setting would have.
    pool.set_grant_limits(GrantLimits {
        key_horizon: 100,
        ..Default::default()
    });
    // SAFETY: as above.
    match unsafe { pool.grant_with(&buf, &bed.qb, Access::REMOTE_READ, GrantKind::Type1) } {
        Err(GrantError::Limit {
            what: "max_mw",
            hint,
            ..
        }) => assert!(hint.contains("key_horizon"), "{hint}"),
        Err(e) => panic!("{e}"),
        Ok(g) => panic!(
            "a key of an index spent under the old horizon came back: {}",
            g.rkey()
        ),
    }
    assert!(pool.stats().grants.refused >= 2);
    drop(buf);
    drop(pool);
    // A shorter horizon, chosen knowingly from the start, lets windows go after it.
    let bed = soft_bed(SoftConfig {
        max_mw: 2,
        ..Default::default()
    });
    let pool = pool_on(&bed.b.pd);
    pool.set_grant_limits(GrantLimits {
        key_horizon: 100,
        ..Default::default()
    });
    let buf = vec![in &pool; 0u8; 64];
    let mut seen = Seen::default();
    for i in 0..600 {
        // SAFETY: as above.
        let mut g =
            unsafe { pool.grant_with(&buf, &bed.qb, Access::REMOTE_READ, GrantKind::Type1) }
                .unwrap_or_else(|e| panic!("grant {i} under a 100-grant horizon: {e}"));
        bound(&mut g, &bed.b);
        seen.fresh(g.rkey(), i, 100, "horizon 100");
        revoke(&mut g, &bed.b);
    }
    assert!(pool.stats().grants.windows_recycled > 0);
    nothing_leaked(&pool);
}

#[test]
fn retired_regions_are_bounded_by_a_quarter_of_max_mr_and_their_keys_stay_refused() {
    let _s = serial();
    for mode in [ReregMode::Mlx5, ReregMode::Unsupported] {
        let bed = soft_bed(SoftConfig {
            max_mr: 64,
            rereg: mode,
            ..Default::default()
        });
        let pool = pool_on(&bed.b.pd);
        let buf = vec![in &pool; 0u8; 64];
        let mut seen = Seen::default();
        // 600 region grants on a device of 64 regions: at most 16 stay retired. Without an
        // mkey cache the oldest go early (the key book keeps their keys refused); with one
        // (Mlx5) only holding keeps a key dead, so region grants are refused instead.
        for i in 0..600 {
            let mut g = match pool.grant_read_with(&buf, &bed.qb, GrantKind::Region) {
                Ok(g) => g,
                Err(GrantError::Limit {
                    what: "retired regions",
                    max: 16,
                    ..
                }) if mode == ReregMode::Mlx5 => {
                    assert_eq!(i, 16, "refused once 16 are held");
                    break;
                }
                Err(e) => panic!("{mode:?}: region grant {i}: {e}"),
            };
            seen.fresh(g.rkey(), i, usize::MAX, &format!("{mode:?}"));
            revoke(&mut g, &bed.b);
        }
        let s = pool.stats().grants;
        match mode {
            ReregMode::Unsupported => assert_eq!(s.regions_retired, 0),
            _ => assert_eq!((s.regions_retired, s.refused), (16, 1), "{s:?}"),
        }
        assert!(s.region_placeholders <= 16, "{s:?}");
        // Windows still work meanwhile, and the arena still registers its memory.
        let big = vec![in &pool; 1u8; 32 << 20];
        assert!(pool.keys_of(big.as_ptr()).is_some());
        let mut g = pool.grant(&buf, &bed.qb).unwrap();
        revoke(&mut g, &bed.b);
        drop(g);
        nothing_leaked(&pool);
    }
}

#[test]
fn auto_chooses_only_a_window_bound_to_the_peers_qp() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 64];
    let mut g = pool.grant(&buf, &bed.qb).unwrap();
    assert_eq!(g.kind(), GrantKind::Type2);
    revoke(&mut g, &bed.b);
    drop(g);
    // A device with type 1 windows only: Auto refuses instead of a PD-wide key.
    let bed = soft_bed(SoftConfig {
        mw_type2: false,
        ..Default::default()
    });
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 64];
    assert!(matches!(
        pool.grant(&buf, &bed.qb),
        Err(GrantError::Unsupported(_))
    ));
    let mut g = pool
        .grant_read_with(&buf, &bed.qb, GrantKind::Type1)
        .unwrap();
    revoke(&mut g, &bed.b);
}

#[test]
fn type2_keys_follow_no_step_a_peer_could_predict() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 64];
    let mut variants = Vec::new();
    for _ in 0..64 {
        let mut g = pool.grant(&buf, &bed.qb).unwrap();
        bound(&mut g, &bed.b);
        variants.push(g.rkey().variant());
        revoke(&mut g, &bed.b);
    }
    let steps: std::collections::HashSet<u8> = variants
        .windows(2)
        .map(|w| w[1].wrapping_sub(w[0]))
        .collect();
    assert!(steps.len() > 8, "variants {variants:?}");
    nothing_leaked(&pool);
}

#[test]
fn a_peers_own_pd_isolates_pd_wide_kinds() {
    let _s = serial();
    let bed = bed();
    let pool = pool_on(&bed.b.pd);
    // Peer B gets a PD of its own on the server's device, with the arena attached to it.
    let pd_b = bed.b.nic.alloc_pd().unwrap();
    pool.attach(&pd_b).unwrap();
    let buf = vec![in &pool; 0u8; 256];
    let (_src, src) = scratch(&bed.a, 8, 0x5a);
    for kind in [GrantKind::Region, GrantKind::Type1] {
        let (qa_b, qb_b) = connect_into_pd(&bed.a, &bed.b, &pd_b);
        let (qa, _qb) = connect(&bed.a, &bed.b);
        // SAFETY: the buffer is read only after the revocation.
        let mut g = unsafe { pool.grant_with(&buf, &qb_b, Access::REMOTE_WRITE, kind) }.unwrap();
        g.wait(&bed.b.cq, |wc| panic!("{wc:?}")).unwrap();
        let w = g.wire();
        // Peer A, connected into the pool's own PD, holds B's key: refused.
        let st = write(&bed.a, &qa, &src, 8, w.addr, w.rkey);
        assert!(refused(st), "{kind:?}: another PD's key worked: {st:?}");
        // B's own connection works.
        assert_eq!(
            write(&bed.a, &qa_b, &src, 8, w.addr, w.rkey),
            WcStatus::Success
        );
        g.revoke(&bed.b.cq, |_| {}).unwrap();
        drop(g);
        assert!(buf[..8].iter().all(|&b| b == 0x5a));
    }
    drop(buf);
    nothing_leaked(&pool);
}

/// Fail the server's QP (a READ with a bogus key from the server side).
fn fail_qp(bed: &Bed) {
    let (_m, local) = scratch(&bed.b, 8, 0);
    // SAFETY: the read's memory stays allocated until its completion is polled.
    unsafe {
        bed.qb
            .post_read(9, &[local.sge(0, 8).unwrap()], 0x1000, Rkey(0x00ba_d0ff))
    }
    .unwrap();
    bed.b.wait();
}

/// QP numbers are per device: a peer's SEND_WITH_INV on one device, whose QP number and key
/// happen to equal another device's live grant's, kills nothing there (found by the attack
/// review: the other pool skipped its LOCAL_INV and freed memory its peer's key still read).
#[test]
fn a_send_with_inv_on_another_device_kills_no_key_here() {
    let _s = serial();
    let bed_x = soft_bed(SoftConfig::default());
    let bed_y = soft_bed(SoftConfig::default());
    assert_eq!(
        bed_x.qb.qpn(),
        bed_y.qb.qpn(),
        "QP numbers coincide across devices"
    );
    let pool_x = pool_on(&bed_x.b.pd);
    let pool_y = pool_on(&bed_y.b.pd);
    let buf_y = vec![in &pool_y; 0x77u8; 4096];
    let buf_x = vec![in &pool_x; 0u8; 4096];
    let (_r, recv) = scratch(&bed_x.b, 64, 0);
    let (_ry, _recv_y) = scratch(&bed_y.b, 64, 0); // the same key layout on both devices
    let mut gy = pool_y
        .grant_read_with(&buf_y, &bed_y.qb, GrantKind::Type2)
        .unwrap();
    bound(&mut gy, &bed_y.b);
    let ky = gy.rkey();
    // X's peer SEND_WITH_INVs every key pool X gives it, Y's among them sooner or later.
    let (_s2, src) = scratch(&bed_x.a, 64, 4);
    let mut met = false;
    for _ in 0..254 {
        let mut gx = pool_x
            .grant_read_with(&buf_x, &bed_x.qb, GrantKind::Type2)
            .unwrap();
        bound(&mut gx, &bed_x.b);
        met |= gx.rkey() == ky;
        // SAFETY: the receive's memory stays allocated until its completion is polled.
        unsafe { bed_x.qb.post_recv(5, &[recv.sge(0, 64).unwrap()]) }.unwrap();
        // SAFETY: the sent memory stays allocated until its completion is polled.
        unsafe {
            bed_x
                .qa
                .post_send_with_inv(6, &[src.sge(0, 8).unwrap()], gx.rkey())
        }
        .unwrap();
        assert_eq!(bed_x.a.wait().status, WcStatus::Success);
        assert_eq!(bed_x.b.wait().status, WcStatus::Success);
        revoke(&mut gx, &bed_x.b);
    }
    assert!(met, "the same key turned up on the other device");
    assert_eq!(pool_y.stats().grants.peer_invalidations, 0);
    revoke(&mut gy, &bed_y.b);
    drop(gy);
    let addr = buf_y.as_ptr() as u64;
    drop(buf_y);
    let _secret = vec![in &pool_y; 0x5eu8; 4096]; // the same block, a new owner
    let (d, dst) = scratch(&bed_y.a, 64, 0);
    let st = read(&bed_y.a, &bed_y.qa, &dst, 64, addr, ky);
    assert!(refused(st), "Y's revoked key still reads: {st:?}");
    assert!(d.as_slice().iter().all(|&b| b == 0));
}

/// Two pools on one PD: pool A's window is deallocated after its QP failed and the device
/// refuses the placeholder; the taint is the process's, so pool B never gets A's stale keys.
#[test]
fn two_pools_on_one_pd_never_share_a_stale_key() {
    let _s = serial();
    let mut bed = soft_bed(SoftConfig::default());
    let pool_a = pool_on(&bed.b.pd);
    let pool_b = pool_on(&bed.b.pd);
    let buf_a = vec![in &pool_a; 0u8; 4096];
    let buf_b = vec![in &pool_b; 0x5eu8; 4096];
    let mut stale = Vec::new();
    for _ in 0..20 {
        let mut g = pool_a
            .grant_read_with(&buf_a, &bed.qb, GrantKind::Type2)
            .unwrap();
        bound(&mut g, &bed.b);
        stale.push(g.rkey());
        revoke(&mut g, &bed.b);
    }
    let mut g = pool_a
        .grant_read_with(&buf_a, &bed.qb, GrantKind::Type2)
        .unwrap();
    bound(&mut g, &bed.b);
    stale.push(g.rkey());
    fail_qp(&bed);
    bed.b
        .nic
        .as_soft()
        .unwrap()
        .fail_next(rdma_pool::nic::Verb::AllocMw, 1, libc::ENOMEM);
    revoke(&mut g, &bed.b);
    drop(g);
    assert_eq!(pool_a.stats().grants.revoked_by_dealloc, 1);
    (bed.qa, bed.qb) = connect(&bed.a, &bed.b);
    for i in 0..300 {
        let mut g = pool_b
            .grant_read_with(&buf_b, &bed.qb, GrantKind::Type2)
            .unwrap();
        bound(&mut g, &bed.b);
        assert!(
            !stale.contains(&g.rkey()),
            "pool B's grant {i} got pool A's stale key {}",
            g.rkey()
        );
        revoke(&mut g, &bed.b);
    }
}

/// Region grants per device variant: 3000 by default; `RDMA_POOL_REGION_GRANTS` overrides it
/// (smoke sizes: 600 in the ASan and `--no-default-features` passes, past two wraps of the 256
/// variants of a recycled index; 300 in the emulated rxe guest, past one wrap and the 128
/// grants after which a key came back in #52).
fn region_grants() -> usize {
    std::env::var("RDMA_POOL_REGION_GRANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

/// Region grants only (small `max_mr`, every rereg mode, with and without windows): no revoked
/// key comes back within the horizon on any device variant; grants never stop where the device
/// has no mkey cache, and stop with a typed `Limit` once a quarter of `max_mr` is held where it
/// has one (Mlx5: only holding the region keeps its key dead).
#[test]
fn region_keys_never_come_back_on_any_device_variant() {
    let _s = serial();
    for windows in [true, false] {
        for mode in [
            ReregMode::Mlx5,
            ReregMode::KeepKeys,
            ReregMode::ChangeKeys,
            ReregMode::Unsupported,
        ] {
            let bed = soft_bed(SoftConfig {
                rereg: mode,
                max_mr: 64,
                max_mw: if windows { 1 << 14 } else { 0 },
                mw_type1: windows,
                mw_type2: windows,
                ..Default::default()
            });
            let pool = pool_on(&bed.b.pd);
            let bufs = [vec![in &pool; 0x11u8; 64], vec![in &pool; 0x22u8; 64]];
            let mut seen = Seen::default();
            for i in 0..region_grants() {
                let what = format!("windows {windows}, {mode:?}, grant {i}");
                let mut g = match pool.grant_read_with(&bufs[i % 2], &bed.qb, GrantKind::Region) {
                    Ok(g) => g,
                    Err(GrantError::Limit {
                        what: "retired regions",
                        ..
                    }) if mode == ReregMode::Mlx5 => break,
                    Err(e) => panic!("{what}: {e}"),
                };
                seen.fresh(g.rkey(), i, usize::MAX, &what);
                revoke(&mut g, &bed.b);
            }
            // Windows are still there for type 2 grants (placeholders do not use them up).
            if windows {
                let mut g = pool.grant(&bufs[0], &bed.qb).unwrap();
                revoke(&mut g, &bed.b);
            }
        }
    }
}

/// A dropped pool's windows go back to the device: every key they gave out stays tainted for
/// the next pool on the PD, which holds those indices rather than step through their
/// variants again (found by the second attack review: the next pool's first grant had a
/// dropped pool's stale key, and a stale READ returned the new pool's bytes).
#[test]
fn a_dropped_pools_keys_never_name_the_next_pools_grants() {
    let _s = serial();
    for kind in [GrantKind::Type1, GrantKind::Type2] {
        let bed = soft_bed(SoftConfig::default());
        let mut stale = std::collections::HashSet::new();
        {
            let pool_a = pool_on(&bed.b.pd);
            let buf_a = vec![in &pool_a; 0u8; 4096];
            for _ in 0..300 {
                let mut g = pool_a.grant_read_with(&buf_a, &bed.qb, kind).unwrap();
                bound(&mut g, &bed.b);
                stale.insert(g.rkey());
                revoke(&mut g, &bed.b);
            }
        }
        let pool_b = pool_on(&bed.b.pd);
        let buf_b = vec![in &pool_b; 0x5eu8; 4096];
        for i in 0..300 {
            let mut g = pool_b.grant_read_with(&buf_b, &bed.qb, kind).unwrap();
            bound(&mut g, &bed.b);
            assert!(
                !stale.contains(&g.rkey()),
                "{kind:?}: the next pool's grant {i} got the dropped pool's key {}",
                g.rkey()
            );
            revoke(&mut g, &bed.b);
        }
    }
}

/// A revoked region grant's index released after the retired bound may come back as a window:
/// the window skips the stale region key's variant (found by the second attack review: a
/// type 2 window stepped through its variants onto the region's key).
#[test]
fn a_released_region_key_never_becomes_a_windows_key() {
    let _s = serial();
    for mode in [ReregMode::KeepKeys, ReregMode::Mlx5, ReregMode::Unsupported] {
        let bed = soft_bed(SoftConfig {
            rereg: mode,
            max_mr: 64,
            ..Default::default()
        });
        let pool = pool_on(&bed.b.pd);
        let old = vec![in &pool; 0x11u8; 4096];
        let secret = vec![in &pool; 0x5eu8; 4096];
        let mut stale = std::collections::HashSet::new();
        for _ in 0..40 {
            let mut g = match pool.grant_read_with(&old, &bed.qb, GrantKind::Region) {
                Ok(g) => g,
                // An mkey cache: refused once a quarter of max_mr is held.
                Err(GrantError::Limit { .. }) if mode == ReregMode::Mlx5 => break,
                Err(e) => panic!("{mode:?}: {e}"),
            };
            stale.insert(g.rkey());
            revoke(&mut g, &bed.b);
        }
        for i in 0..600 {
            let kind = [GrantKind::Type2, GrantKind::Type1][i % 2];
            let mut g = pool.grant_read_with(&secret, &bed.qb, kind).unwrap();
            bound(&mut g, &bed.b);
            assert!(
                !stale.contains(&g.rkey()),
                "{mode:?}: window grant {i} ({kind:?}) got a revoked region key {}",
                g.rkey()
            );
            revoke(&mut g, &bed.b);
        }
    }
}

/// Without `rereg_mr` a revoked region's index is held by a placeholder region (on one dummy
/// page, no remote right): they count against a quarter of `max_mr` with the retired regions,
/// and leave the device's windows to grants.
#[test]
fn region_placeholders_are_bounded_and_leave_windows_for_grants() {
    let _s = serial();
    for max_mw in [4, 64] {
        let bed = soft_bed(SoftConfig {
            rereg: ReregMode::Unsupported,
            max_mw,
            max_mr: 256,
            ..Default::default()
        });
        let pool = pool_on(&bed.b.pd);
        let buf = vec![in &pool; 0u8; 64];
        for i in 0..300 {
            let mut g = pool
                .grant_read_with(&buf, &bed.qb, GrantKind::Region)
                .unwrap_or_else(|e| panic!("max_mw {max_mw}: region grant {i}: {e}"));
            revoke(&mut g, &bed.b);
        }
        let s = pool.stats().grants;
        assert!(s.region_placeholders + s.regions_retired <= 64, "{s:?}");
        assert!(s.region_placeholders > 0, "{s:?}");
        let mut g = pool
            .grant(&buf, &bed.qb)
            .unwrap_or_else(|e| panic!("max_mw {max_mw}: a type 2 grant after the churn: {e}"));
        revoke(&mut g, &bed.b);
        drop(g);
        nothing_leaked(&pool);
    }
}
