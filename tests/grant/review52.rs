//! What the hostile review of #52's key book found, as regression tests: a type 1 grant on a
//! device whose windows land only on indices with stale next variants looped for ever (horizon
//! 0 after keys died under the default one); held region indices of several pools used up
//! `max_mr` (the arena then served unregistered memory); a full key book refused every grant
//! for good; a revoke after a peer's SEND_WITH_INV failed the QP.

use super::*;
use allocator_api2::vec;
use rdma_pool::grant::{GrantError, GrantLimits};
use rdma_pool::nic::soft::{ReregMode, SoftConfig};
use std::collections::HashSet;
use std::time::Duration;

/// Run `f` on a thread of its own; fail if it does not return within `secs` (a hang is the
/// bug: the test process then ends with the failure).
fn within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => t.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(e) = t.join() {
                std::panic::resume_unwind(e);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("no return within {secs} s: a grant loops")
        }
    }
}

/// Keys of every kind die under the default horizon, then the pool's horizon drops to 0: each
/// later grant returns (issued, or refused with a typed `Limit`), none carries a dead key, and
/// grants go on (the review: type 1 grant #124 never returned).
#[test]
fn a_lowered_horizon_neither_loops_nor_gives_dead_keys_back() {
    let _s = serial();
    within(120, || {
        for kind in [GrantKind::Type2, GrantKind::Type1, GrantKind::Region] {
            let bed = default_bed();
            let pool = pool_on(&bed.b.pd);
            let buf = vec![in &pool; 0x5eu8; 4096];
            let mut dead = HashSet::new();
            for _ in 0..4 {
                let mut g = pool.grant_read_with(&buf, &bed.qb, kind).unwrap();
                bound(&mut g, &bed.b);
                dead.insert(g.rkey());
                revoke(&mut g, &bed.b);
            }
            pool.set_grant_limits(GrantLimits {
                key_horizon: 0,
                ..Default::default()
            });
            let mut issued = 0;
            for i in 0..700 {
                let mut g = match pool.grant_read_with(&buf, &bed.qb, kind) {
                    Ok(g) => g,
                    Err(GrantError::Limit { hint, .. }) => {
                        assert!(hint.contains("key_horizon"), "{kind:?}: {hint}");
                        continue;
                    }
                    Err(e) => panic!("{kind:?}: grant {i}: {e}"),
                };
                bound(&mut g, &bed.b);
                assert!(
                    !dead.contains(&g.rkey()),
                    "{kind:?}: grant {i} carries {}, which died under the default horizon",
                    g.rkey()
                );
                issued += 1;
                revoke(&mut g, &bed.b);
            }
            assert!(
                issued >= 600,
                "{kind:?}: only {issued} of 700 grants issued"
            );
        }
    });
}

/// Six pools on a device of 64 regions, each revoking 40 region grants: held indices take at
/// most a quarter of `max_mr` for the whole device, so the arena and the application can
/// still register, and (without an mkey cache) region grants never stop; with one, they are
/// refused with a typed `Limit` beyond the device's quarter.
#[test]
fn held_region_indices_never_use_up_the_devices_regions() {
    let _s = serial();
    for mode in [ReregMode::KeepKeys, ReregMode::Unsupported, ReregMode::Mlx5] {
        let bed = soft_bed(SoftConfig {
            rereg: mode,
            max_mr: 64,
            ..Default::default()
        });
        let mut pools = Vec::new();
        let mut issued = 0;
        for p in 0..6 {
            let pool = pool_on(&bed.b.pd);
            let buf = vec![in &pool; 0u8; 64];
            for i in 0..40 {
                match pool.grant_read_with(&buf, &bed.qb, GrantKind::Region) {
                    Ok(mut g) => {
                        issued += 1;
                        revoke(&mut g, &bed.b);
                    }
                    Err(GrantError::Limit {
                        what: "retired regions",
                        ..
                    }) if mode == ReregMode::Mlx5 => break,
                    Err(e) => panic!("{mode:?}: pool {p}'s region grant {i}: {e}"),
                }
            }
            let s = pool.stats().grants;
            assert!(s.regions_retired + s.region_placeholders <= 16, "{s:?}");
            drop(buf);
            pools.push(pool);
        }
        match mode {
            ReregMode::Mlx5 => assert_eq!(issued, 16, "a quarter of max_mr, device-wide"),
            _ => assert_eq!(issued, 240, "{mode:?}: region grants never stop"),
        }
        // The arena of a new pool and the application still register.
        let pool = pool_on(&bed.b.pd);
        let big = vec![in &pool; 1u8; 1 << 20];
        assert!(pool.keys_of(big.as_ptr()).is_some(), "{mode:?}: degraded");
        let (_b, mr) = scratch(&bed.b, 4096, 0);
        drop(mr);
        drop(big);
        drop(pool);
        drop(pools);
        bed.b.nic.as_soft().unwrap().validate().unwrap();
    }
}

/// A full key book refuses, and each refusal ticks the horizon's clock: entries released under
/// a short horizon lapse, and the book takes new keys again (the review: a full book refused
/// every grant for good once every new grant needed a new entry).
#[test]
fn a_full_key_book_drains_as_refusals_pass_the_horizon() {
    let _s = serial();
    let short = GrantLimits {
        key_horizon: 50,
        ..Default::default()
    };
    // Keys on fresh devices (new entries each), released under the short horizon.
    let mut beds = Vec::new();
    let probe = default_bed();
    let probe_pool = pool_on(&probe.b.pd);
    let entries = probe_pool.stats().grants.key_book_entries as usize;
    let old = rdma_pool::grant::set_key_book_capacity(entries + 64);
    let mut filled = 0;
    'fill: for _ in 0..16 {
        let bed = default_bed();
        let pool = pool_on(&bed.b.pd);
        pool.set_grant_limits(short);
        let buf = vec![in &pool; 0u8; 64];
        let mut open = Vec::new();
        for _ in 0..16 {
            match pool.grant(&buf, &bed.qb) {
                Ok(mut g) => {
                    bound(&mut g, &bed.b);
                    open.push(g);
                    filled += 1;
                }
                Err(GrantError::Limit {
                    what: "key book", ..
                }) => {
                    open.iter_mut().for_each(|g| revoke(g, &bed.b));
                    break 'fill;
                }
                Err(e) => panic!("{e}"),
            }
        }
        open.iter_mut().for_each(|g| revoke(g, &bed.b));
        drop(open);
        drop(buf);
        drop(pool);
        beds.push(bed);
    }
    assert!(filled >= 32, "the book took {filled} keys");
    // The probe's device has no entry: refused until 50 refusals passed, then granted.
    let buf = vec![in &probe_pool; 0u8; 64];
    let mut refusals = 0;
    let got = loop {
        match probe_pool.grant(&buf, &probe.qb) {
            Ok(g) => break g,
            Err(GrantError::Limit {
                what: "key book", ..
            }) => refusals += 1,
            Err(e) => panic!("{e}"),
        }
        assert!(refusals <= 200, "the book never drained");
    };
    rdma_pool::grant::set_key_book_capacity(old);
    assert!(refusals >= 1, "the book was full");
    assert!(probe_pool.stats().grants.refused >= refusals);
    let mut got = got;
    revoke(&mut got, &probe.b);
}

/// A peer's SEND_WITH_INV, then `revoke` before the application polled the receive: the pool
/// sees the invalidation first and the QP stays ready (the review: LOCAL_INV of the window
/// the peer had invalidated failed the QP).
#[test]
fn a_revoke_after_a_peers_send_with_inv_keeps_the_qp() {
    let _s = serial();
    let bed = default_bed();
    if applies(bed.b.nic.caps(), Quirk::SendWithInvNotReported) {
        return;
    }
    let pool = pool_on(&bed.b.pd);
    let buf = vec![in &pool; 0u8; 64];
    let mut g = pool.grant(&buf, &bed.qb).unwrap();
    bound(&mut g, &bed.b);
    let (_r, rmr) = scratch(&bed.b, 64, 0);
    // SAFETY: the receive buffer stays allocated until its completion is polled.
    unsafe { bed.qb.post_recv(7, &[rmr.sge(0, 64).unwrap()]) }.unwrap();
    let (_s, smr) = scratch(&bed.a, 16, 1);
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa
            .post_send_with_inv(8, &[smr.sge(0, 16).unwrap()], g.rkey())
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    let mut seen = Vec::new();
    g.revoke(&bed.b.cq, |wc| seen.push(wc.wr_id)).unwrap();
    assert_eq!(
        seen,
        [7],
        "the application's receive came out of the revoke's poll"
    );
    assert_eq!(bed.qb.state().unwrap(), QpState::Ready);
    assert_eq!(pool.stats().grants.peer_invalidations, 1);
}
