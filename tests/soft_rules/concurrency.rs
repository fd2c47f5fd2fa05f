//! Rules: the soft NIC is `Send + Sync`, keeps its invariants (`validate`), and neither deadlocks
//! nor reorders under many threads.

use crate::common::*;
use rdma_pool::nic::*;
use std::time::Duration;

#[test]
fn soft_nic_is_send_and_sync_and_keeps_its_invariants() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Nic>();
    assert_send_sync::<rdma_pool::nic::soft::SoftNic>();
    let bed = default_bed();
    let (_mem, mr, mut w1) = bed.b.window_over(4096, 0, MwType::Type1);
    let mut w2 = bed.b.pd.alloc_mw(MwType::Type2).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe {
        bed.qb
            .bind_mw(1, &mut w1, &mr, 0, 4096, Access::REMOTE_READ)
    }
    .unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    let k2 = unsafe {
        bed.qb
            .post_bind_mw(2, &mut w2, &mr, 0, 64, Access::REMOTE_READ)
    }
    .unwrap();
    let soft = bed.b.nic.as_soft().unwrap();
    soft.validate().unwrap();
    bed.qb.post_local_inv(3, k2).unwrap();
    // SAFETY: the bound memory outlives the window, and the test reads it only after the peer's access completed.
    unsafe { bed.qb.bind_mw(4, &mut w1, &mr, 0, 0, Access::empty()) }.unwrap();
    for _ in 0..4 {
        assert_eq!(bed.b.wait().status, WcStatus::Success);
    }
    soft.validate().unwrap();
    drop((w1, w2));
    mr.dereg().unwrap();
    soft.validate().unwrap();
}

#[test]
fn concurrent_writers_on_many_qps() {
    let (na, nb) = (Nic::soft(), Nic::soft());
    let (a, b) = (Side::new(na), Side::new(nb));
    let (dst, dst_mr) = b.reg_buf(8 * 4096, 0, RW);
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let (a, b, dst_mr) = (&a, &b, &dst_mr);
            s.spawn(move || {
                let cq = a.nic.create_cq(64).unwrap();
                let qa = a.pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
                let qb = b.qp();
                link(&qa, &qb);
                let (_src, src_mr) = a.reg_buf(4096, t + 1, Access::LOCAL_WRITE);
                for _ in 0..50 {
                    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
                    unsafe {
                        qa.post_write(
                            t as u64,
                            &[src_mr.sge(0, 4096).unwrap()],
                            dst_mr.addr() as u64 + t as u64 * 4096,
                            dst_mr.rkey(),
                        )
                    }
                    .unwrap();
                    assert_eq!(cq.wait_one(WAIT).unwrap().status, WcStatus::Success);
                }
            });
        }
    });
    for t in 0..8 {
        assert!(
            dst.as_slice()[t * 4096..(t + 1) * 4096]
                .iter()
                .all(|&x| x == t as u8 + 1)
        );
    }
    assert_eq!(b.nic.as_soft().unwrap().counters().rejected_accesses, 0);
}

#[test]
fn sends_both_ways_from_many_threads_neither_deadlock_nor_reorder() {
    // Two QPs sending to each other while both post receives from other threads: every lock
    // path of the send engine and the receive side at once. A watchdog turns a deadlock into a
    // failure instead of a hang.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        const N: u64 = 300;
        let side = |nic: Nic| {
            let pd = nic.alloc_pd().unwrap();
            let cq = nic.create_cq(4 * N as u32).unwrap();
            Side { nic, pd, cq }
        };
        let (a, b) = (side(Nic::soft()), side(Nic::soft()));
        let caps = QpCaps {
            max_send_wr: 2 * N as u32,
            max_recv_wr: 2 * N as u32,
            ..Default::default()
        };
        let qa = a.pd.create_qp(&a.cq, &a.cq, caps).unwrap();
        let qb = b.pd.create_qp(&b.cq, &b.cq, caps).unwrap();
        link(&qa, &qb);
        let bed = Bed { a, b, qa, qb };
        let mut sa = buf(4096, 1);
        let mut sb = buf(4096, 2);
        let mut ra = buf(N as usize * 8, 0);
        let mut rb = buf(N as usize * 8, 0);
        let (sa_mr, sb_mr) = (
            bed.a.reg(&mut sa, Access::LOCAL_WRITE).unwrap(),
            bed.b.reg(&mut sb, Access::LOCAL_WRITE).unwrap(),
        );
        let (ra_mr, rb_mr) = (
            bed.a.reg(&mut ra, Access::LOCAL_WRITE).unwrap(),
            bed.b.reg(&mut rb, Access::LOCAL_WRITE).unwrap(),
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
                (0..N).for_each(|i| {
                    unsafe { bed.qa.post_send(i, &[sa_mr.sge(0, 8).unwrap()]) }.unwrap()
                })
            });
            s.spawn(|| {
                // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
                (0..N).for_each(|i| {
                    unsafe { bed.qb.post_send(i, &[sb_mr.sge(0, 8).unwrap()]) }.unwrap()
                })
            });
            s.spawn(|| {
                (0..N).for_each(|i| {
                    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
                    unsafe {
                        bed.qb
                            .post_recv(1000 + i, &[rb_mr.sge(i as usize * 8, 8).unwrap()])
                    }
                    .unwrap()
                })
            });
            s.spawn(|| {
                (0..N).for_each(|i| {
                    // SAFETY: the receive's memory stays allocated and unread until its completion is polled.
                    unsafe {
                        bed.qa
                            .post_recv(1000 + i, &[ra_mr.sge(i as usize * 8, 8).unwrap()])
                    }
                    .unwrap()
                })
            });
        });
        // Each CQ holds N send and N receive completions, each kind in posting order.
        for (side, fill, rbuf) in [(&bed.a, 2u8, &ra), (&bed.b, 1u8, &rb)] {
            let (mut sends, mut recvs) = (Vec::new(), Vec::new());
            for _ in 0..2 * N {
                let wc = side.wait();
                assert_eq!(wc.status, WcStatus::Success);
                if wc.opcode == WcOpcode::Recv {
                    recvs.push(wc.wr_id)
                } else {
                    sends.push(wc.wr_id)
                }
            }
            assert_eq!(sends, (0..N).collect::<Vec<_>>());
            assert_eq!(recvs, (1000..1000 + N).collect::<Vec<_>>());
            assert!(rbuf.as_slice().iter().all(|&x| x == fill));
        }
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("no deadlock, and every check passed");
}
