//! Pools created and dropped while other threads poll the CQ their grants post on: the
//! completion router walks the live pools' grants (through the quarantine hook the facade
//! installs) while pools drop theirs (taking the hook out first), and the grants' own waits
//! see the completions other threads consumed. Found worth keeping by the
//! hostile review of #42; a use-after-free here would crash or leak a pool's completion.

use super::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

#[test]
fn pools_churn_while_other_threads_poll_their_grants_cq() {
    let _s = serial();
    let (na, nb) = nics();
    let (a, b) = (Side::new(na), Side::new(nb));
    let cq = b.nic.create_cq(4096).unwrap();
    let caps = QpCaps {
        max_send_wr: 512,
        ..Default::default()
    };
    let qps: Vec<(Qp, Qp)> = (0..3)
        .map(|_| {
            let qb = b.pd.create_qp(&cq, &cq, caps).unwrap();
            let qa = a.qp();
            link(&qa, &qb);
            (qa, qb)
        })
        .collect();
    let (stop, polled, made) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(Relaxed) {
                    // Every completion on this CQ is a pool's bind or invalidation: none may
                    // come out to the application, whichever pool it belonged to.
                    if let Some(wc) = cq.poll_one().unwrap() {
                        panic!("a pool's completion came out: {wc:?}");
                    }
                    polled.fetch_add(1, Relaxed);
                }
            });
        }
        let workers: Vec<_> = qps
            .iter()
            .enumerate()
            .map(|(t, (_qa, qb))| {
                let (b, made, cq) = (&b, &made, &cq);
                s.spawn(move || {
                    for i in 0..20 {
                        let pool = Pool::with_config(&b.pd, small_arena()).unwrap();
                        let bufs: Vec<_> = (0..6)
                            .map(|j| allocator_api2::vec![in &pool; (i + j) as u8; 64 << j])
                            .collect();
                        let mut grants: Vec<_> =
                            bufs.iter().map(|v| pool.grant(v, qb).unwrap()).collect();
                        // Bound before anything else happens to them: on a device, a window
                        // deallocated under a bind still in the send queue fails that bind,
                        // which puts the QP in error (rxe does).
                        for g in &mut grants {
                            g.wait(cq, |wc| panic!("{wc:?}")).unwrap();
                        }
                        if (i + t) % 3 == 0 {
                            // Forgotten: the pool's drop kills their keys.
                            grants.drain(..).for_each(std::mem::forget);
                        } else {
                            for mut g in grants.drain(..) {
                                g.revoke(cq, |wc| panic!("{wc:?}")).unwrap();
                            }
                        }
                        drop(grants);
                        drop(bufs);
                        assert!(pool.stats().alloc.small_allocated_bytes < 1 << 20);
                        drop(pool);
                        made.fetch_add(1, Relaxed);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Relaxed);
    });
    assert_eq!(made.into_inner(), 60);
    assert!(polled.into_inner() > 0);
    // The process can still make pools, and grant from them.
    let pool = Pool::with_config(&b.pd, small_arena()).unwrap();
    let v = allocator_api2::vec![in &pool; 1u8; 4096];
    let mut g = pool.grant(&v, &qps[0].1).unwrap();
    g.wait(&cq, |wc| panic!("{wc:?}")).unwrap();
    g.revoke(&cq, |wc| panic!("{wc:?}")).unwrap();
}
