//! Completion channels and the tokio layer (feature `tokio`), on the soft NIC in `cargo test`
//! and on rxe in the QEMU bed: waits sleep on the channel (measured in CPU time, not assumed),
//! wake on completions from other threads, stay cancel-safe, and waiters of one CQ wake each
//! other when one of them takes the other's completion.

mod common;

use common::*;
use rdma_pool::Pool;
use rdma_pool::nic::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::timeout;

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    // SAFETY: getrusage writes into a zeroed rusage we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Two sides whose CQs are async, a connected QP pair on them.
struct AsyncBed {
    a: Side,
    b: Side,
    acq: AsyncCq,
    bcq: AsyncCq,
    qa: Qp,
    qb: Qp,
}

fn async_bed() -> AsyncBed {
    let (na, nb) = nics();
    let (a, b) = (Side::new(na), Side::new(nb));
    let (acq, bcq) = (
        AsyncCq::new(&a.nic, 256).unwrap(),
        AsyncCq::new(&b.nic, 256).unwrap(),
    );
    let caps = QpCaps {
        max_send_sge: 2,
        max_recv_sge: 2,
        ..Default::default()
    };
    let qa = a.pd.create_qp(acq.cq(), acq.cq(), caps).unwrap();
    let qb = b.pd.create_qp(bcq.cq(), bcq.cq(), caps).unwrap();
    link(&qa, &qb);
    AsyncBed {
        a,
        b,
        acq,
        bcq,
        qa,
        qb,
    }
}

#[test]
fn an_idle_wait_sleeps_instead_of_polling() {
    let _g = serial();
    runtime().block_on(async {
        let bed = async_bed();
        let before = thread_cpu();
        let r = timeout(Duration::from_millis(600), bed.bcq.next()).await;
        let spent = thread_cpu() - before;
        assert!(r.is_err(), "nothing was posted: {r:?}");
        assert!(
            spent < Duration::from_millis(150),
            "a sleeping wait burnt {spent:?}"
        );
    });
    // The blocking wait of a CQ with a channel sleeps too.
    let (na, _) = nics();
    let channel = na.create_comp_channel().unwrap();
    let cq = na.create_cq_on(16, &channel).unwrap();
    let before = thread_cpu();
    assert!(matches!(
        cq.wait_one(Duration::from_millis(600)),
        Err(Error::Timeout(_))
    ));
    let spent = thread_cpu() - before;
    assert!(
        spent < Duration::from_millis(150),
        "wait_one burnt {spent:?}"
    );
}

#[test]
fn a_completion_from_another_thread_wakes_the_task() {
    let _g = serial();
    runtime().block_on(async {
        let bed = Arc::new(async_bed());
        let (_dst, dmr) = bed.b.reg_buf(4096, 0, Access::LOCAL_WRITE);
        // SAFETY: the buffer outlives the receive, which completes below.
        unsafe { bed.qb.post_recv(1, &[dmr.sge(0, 4096).unwrap()]).unwrap() };
        let sender = {
            let bed = bed.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                bed.qa
                    .post_inline(2, SendOp::SendWithImm(77), b"hello", SendFlags::SIGNALED)
                    .unwrap();
            })
        };
        let wc = timeout(WAIT, bed.bcq.next()).await.unwrap().unwrap();
        assert_eq!((wc.wr_id, wc.byte_len, wc.imm_data), (1, 5, Some(77)));
        let sent = timeout(WAIT, bed.acq.next()).await.unwrap().unwrap();
        assert_eq!((sent.wr_id, sent.status), (2, WcStatus::Success));
        sender.join().unwrap();
    });
}

#[test]
fn a_cancelled_wait_loses_no_completion() {
    let _g = serial();
    runtime().block_on(async {
        let bed = async_bed();
        // SAFETY: no memory.
        unsafe { bed.qb.post_recv(1, &[]).unwrap() };
        for _ in 0..3 {
            assert!(
                timeout(Duration::from_millis(20), bed.bcq.next())
                    .await
                    .is_err()
            );
        }
        bed.qa
            .post_inline(2, SendOp::Send, &[], SendFlags::SIGNALED)
            .unwrap();
        let mut out = [Completion::default(); 4];
        let n = timeout(WAIT, bed.bcq.poll(&mut out))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((n, out[0].wr_id), (1, 1));
    });
}

#[test]
fn waiters_on_one_cq_wake_each_other_when_one_takes_the_others_completion() {
    let _g = serial();
    runtime().block_on(async {
        let bed = Arc::new(async_bed());
        let pool: &'static Pool = keep_pool(Pool::new(&bed.b.pd).unwrap());
        for round in 0..20u64 {
            // A raw receive (the application's completion) and an owned one, awaited by two
            // tasks; whichever runs first after the event takes both completions from the
            // device and the channel's events: the other must still wake.
            // SAFETY: no memory.
            unsafe { bed.qb.post_recv(round * 10 + 1, &[]).unwrap() };
            let mut owned = bed
                .qb
                .post_recv_owned(round * 10 + 2, allocator_api2::vec![in pool; 0u8; 64])
                .unwrap();
            let (b1, b2) = (bed.clone(), bed.clone());
            let own = tokio::spawn(async move {
                owned.ready(&b1.bcq).await.unwrap();
                owned.take().unwrap()
            });
            let app = tokio::spawn(async move { b2.bcq.next().await.unwrap() });
            // Both tasks go to sleep first.
            tokio::time::sleep(Duration::from_millis(20)).await;
            bed.qa
                .post_inline(3, SendOp::Send, &[], SendFlags::SIGNALED)
                .unwrap();
            bed.qa
                .post_inline(4, SendOp::Send, b"owned", SendFlags::SIGNALED)
                .unwrap();
            let (done, wc) = timeout(WAIT, async { tokio::join!(own, app) })
                .await
                .expect("both waiters woke");
            assert_eq!(wc.unwrap().wr_id, round * 10 + 1);
            assert_eq!(&done.unwrap().buf[..5], b"owned");
            for _ in 0..2 {
                timeout(WAIT, bed.acq.next()).await.unwrap().unwrap();
            }
        }
    });
}

#[test]
fn owned_posts_are_awaited() {
    let _g = serial();
    runtime().block_on(async {
        let bed = async_bed();
        let pool_b: &'static Pool = keep_pool(Pool::new(&bed.b.pd).unwrap());
        let pool_a: &'static Pool = keep_pool(Pool::new(&bed.a.pd).unwrap());
        let rx = bed
            .qb
            .post_recv_owned(1, allocator_api2::vec![in pool_b; 0u8; 256])
            .unwrap();
        let tx = bed
            .qa
            .post_send_owned(2, allocator_api2::vec![in pool_a; 9u8; 100])
            .unwrap();
        let sent = timeout(WAIT, tx.wait_async(&bed.acq))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(sent.completion.status, WcStatus::Success);
        let got = timeout(WAIT, rx.wait_async(&bed.bcq))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.completion.byte_len, 100);
        assert!(got.buf[..100].iter().all(|&x| x == 9));
        // A handle awaited on another CQ is refused, and kept.
        let mut rx = bed
            .qb
            .post_recv_owned(3, allocator_api2::vec![in pool_b; 0u8; 16])
            .unwrap();
        let e = rx.ready(&bed.acq).await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(!rx.is_complete());
    });
}

#[test]
fn grants_are_awaited_and_a_cancelled_revocation_finishes_later() {
    let _g = serial();
    runtime().block_on(async {
        let bed = async_bed();
        let pool = Pool::new(&bed.b.pd).unwrap();
        let buf = allocator_api2::vec![in &pool; 0x61u8; 4096];
        let mut grant = match pool.grant(&buf, &bed.qb) {
            Ok(g) => g,
            Err(rdma_pool::grant::GrantError::Unsupported(why)) => {
                eprintln!("no type 2 windows here ({why}): region grant");
                pool.grant_read_with(&buf, &bed.qb, rdma_pool::grant::GrantKind::Region)
                    .unwrap()
            }
            Err(e) => panic!("{e}"),
        };
        timeout(WAIT, grant.wait_async(&bed.bcq, |_| {}))
            .await
            .unwrap()
            .unwrap();
        // The peer reads through the key.
        let wire = grant.wire();
        let (back, back_mr) = bed.a.reg_buf(64, 0, Access::LOCAL_WRITE);
        // SAFETY: `back` outlives the request, which completes below.
        unsafe {
            bed.qa
                .post_read(9, &[back_mr.sge(0, 64).unwrap()], wire.addr, wire.rkey)
                .unwrap()
        };
        let wc = timeout(WAIT, bed.acq.next()).await.unwrap().unwrap();
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
        assert!(back.as_slice().iter().all(|&x| x == 0x61));
        // Cancel the revocation before it could finish, then finish it.
        let _ = timeout(Duration::ZERO, grant.revoke_async(&bed.bcq, |_| {})).await;
        timeout(WAIT, grant.revoke_async(&bed.bcq, |_| {}))
            .await
            .unwrap()
            .unwrap();
        assert!(grant.is_revoked());
        drop(grant);
        assert_eq!(pool.stats().grants.open, 0);
    });
}

#[test]
fn solicited_only_notifications_fire_for_solicited_messages_and_errors() {
    let _g = serial();
    let (na, nb) = nics();
    let (a, b) = (Side::new(na), Side::new(nb));
    let channel = b.nic.create_comp_channel().unwrap();
    let bcq = b.nic.create_cq_on(64, &channel).unwrap();
    let qa = a.qp();
    let qb = b.pd.create_qp(&bcq, &bcq, QpCaps::default()).unwrap();
    link(&qa, &qb);
    // SAFETY: no memory.
    unsafe {
        qb.post_recv(1, &[]).unwrap();
        qb.post_recv(2, &[]).unwrap();
    }
    bcq.req_notify(true).unwrap();
    qa.post_inline(3, SendOp::Send, &[], SendFlags::SIGNALED)
        .unwrap();
    a.wait();
    assert!(
        !channel.wait_readable(Duration::from_millis(300)).unwrap(),
        "an unsolicited message does not fire a solicited-only arm"
    );
    qa.post_inline(
        4,
        SendOp::Send,
        &[],
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    )
    .unwrap();
    assert!(channel.wait_readable(WAIT).unwrap());
    assert_eq!(channel.take_events().unwrap(), 1);
    assert_eq!(channel.take_events().unwrap(), 0, "taking never blocks");
    let ids: Vec<u64> = (0..2)
        .map(|_| bcq.poll_one().unwrap().unwrap().wr_id)
        .collect();
    assert_eq!(ids, [1, 2]);
    // An arm fires once: the next completion after it, not the ones already queued.
    bcq.req_notify(false).unwrap();
    // SAFETY: no memory.
    unsafe { qb.post_recv(5, &[]).unwrap() };
    qa.post_inline(6, SendOp::Send, &[], SendFlags::SIGNALED)
        .unwrap();
    assert!(channel.wait_readable(WAIT).unwrap());
    assert_eq!(channel.take_events().unwrap(), 1);
    // SAFETY: no memory.
    unsafe { qb.post_recv(7, &[]).unwrap() };
    qa.post_inline(8, SendOp::Send, &[], SendFlags::SIGNALED)
        .unwrap();
    assert!(!channel.wait_readable(Duration::from_millis(300)).unwrap());
}

#[test]
fn misuse_is_refused_with_an_error_not_a_panic() {
    let _g = serial();
    let (na, nb) = nics();
    // No channel.
    let plain = na.create_cq(4).unwrap();
    assert!(matches!(
        plain.req_notify(false),
        Err(Error::InvalidArgument { .. })
    ));
    // No runtime.
    let e = AsyncCq::new(&na, 4).unwrap_err();
    assert!(e.to_string().contains("tokio runtime"), "{e}");
    // A runtime without its I/O driver.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let e = rt.block_on(async { AsyncCq::new(&na, 4).unwrap_err() });
    assert!(e.to_string().contains("I/O driver"), "{e}");
    runtime().block_on(async {
        let e = AsyncCq::from_cq(plain.clone()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        // One channel, two watchers: refused.
        let channel = na.create_comp_channel().unwrap();
        let first = AsyncCq::from_cq(na.create_cq_on(4, &channel).unwrap()).unwrap();
        assert!(AsyncCq::from_cq(na.create_cq_on(4, &channel).unwrap()).is_err());
        drop(first);
        // A channel of another device.
        let other = nb.create_comp_channel().unwrap();
        if !na.same_device(&nb) {
            let e = na.create_cq_on(4, &other).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        }
    });
}

/// Every future of the async layer can be spawned on a multi-threaded runtime.
#[test]
fn the_async_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let nic = Nic::soft();
    let rt = runtime();
    let _e = rt.enter();
    let cq = AsyncCq::new(&nic, 4).unwrap();
    send(&cq.next());
    let mut out = [Completion::default(); 1];
    send(&cq.poll(&mut out));
    let pd = nic.alloc_pd().unwrap();
    let pool = Pool::new(&pd).unwrap();
    let qp = pd.create_qp(cq.cq(), cq.cq(), QpCaps::default()).unwrap();
    let peer = nic
        .alloc_pd()
        .unwrap()
        .create_qp(cq.cq(), cq.cq(), QpCaps::default())
        .unwrap();
    link(&qp, &peer);
    let buf = allocator_api2::vec![in &pool; 0u8; 64];
    let mut grant = pool.grant(&buf, &qp).unwrap();
    send(&grant.wait_async(&cq, |_| {}));
    send(&grant.revoke_async(&cq, |_| {}));
    let leaked: &'static Pool = keep_pool(Pool::new(&pd).unwrap());
    let rx = peer
        .post_recv_owned(1, allocator_api2::vec![in leaked; 0u8; 8])
        .unwrap();
    send(&rx.wait_async(&cq));
}

// Regression tests from the hostile review (#40): waits that the channel does not report.

fn leak_pool(pd: &Pd) -> &'static Pool {
    keep_pool(Pool::new(pd).unwrap())
}

/// Two sides whose QPs complete on shared async CQs (for spawned tasks).
struct AB {
    a: Side,
    b: Side,
    acq: Arc<AsyncCq>,
    bcq: Arc<AsyncCq>,
    qa: Qp,
    qb: Qp,
}

fn ab(depth: u32, caps: QpCaps) -> AB {
    let (na, nb) = nics();
    let (a, b) = (Side::new(na), Side::new(nb));
    let acq = Arc::new(AsyncCq::new(&a.nic, depth).unwrap());
    let bcq = Arc::new(AsyncCq::new(&b.nic, depth).unwrap());
    let qa = a.pd.create_qp(acq.cq(), acq.cq(), caps).unwrap();
    let qb = b.pd.create_qp(bcq.cq(), bcq.cq(), caps).unwrap();
    link(&qa, &qb);
    AB {
        a,
        b,
        acq,
        bcq,
        qa,
        qb,
    }
}

/// A receive awaited with `Posted::ready`; its QP is destroyed meanwhile: the handle holds a
/// flush at once (`Posted::take` gives it), so the waiting task must wake.
#[test]
fn a_task_awaiting_an_owned_request_wakes_when_its_qp_is_destroyed() {
    let _g = serial();
    runtime().block_on(async {
        let AB { b, bcq, qb, qa, .. } = ab(64, QpCaps::default());
        let pool = leak_pool(&b.pd);
        let mut rx = qb
            .post_recv_owned(1, allocator_api2::vec![in pool; 0u8; 64])
            .unwrap();
        let cq = bcq.clone();
        let waiter = tokio::spawn(async move {
            rx.ready(&cq).await.unwrap();
            rx.take().unwrap()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(qb);
        let done = timeout(Duration::from_secs(3), waiter)
            .await
            .expect("the waiter woke after its QP's destruction flushed the request")
            .unwrap();
        assert_eq!(done.completion.status, WcStatus::WrFlushErr);
        drop(qa);
    });
}

/// The same through an SRQ: all QPs and the SRQ are dropped while a task awaits an owned
/// SRQ receive.
#[test]
fn a_task_awaiting_an_srq_receive_wakes_when_the_srq_is_destroyed() {
    let _g = serial();
    runtime().block_on(async {
        let (na, _nb) = nics();
        let pd = na.alloc_pd().unwrap();
        let acq = Arc::new(AsyncCq::new(&na, 64).unwrap());
        let srq = pd.create_srq(acq.cq(), 8, 1).unwrap();
        let pool = leak_pool(&pd);
        let mut rx = srq
            .post_recv_owned(1, allocator_api2::vec![in pool; 0u8; 64])
            .unwrap();
        let cq = acq.clone();
        let waiter = tokio::spawn(async move {
            rx.ready(&cq).await.unwrap();
            rx.take().unwrap()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(srq);
        let done = timeout(Duration::from_secs(3), waiter)
            .await
            .expect("the waiter woke after the SRQ's destruction flushed the receive")
            .unwrap();
        assert_eq!(done.completion.status, WcStatus::WrFlushErr);
    });
}

/// A synchronous `Cq::wait_one` on the AsyncCq's own CQ (documented: "for synchronous polls")
/// from another thread consumes the channel event; the task awaiting its owned request on the
/// same CQ is never woken although the request completed.
#[test]
fn a_blocking_wait_on_the_same_cq_does_not_steal_a_tasks_wakeup() {
    let _g = serial();
    runtime().block_on(async {
        let AB {
            a, b, acq, qa, qb, ..
        } = ab(64, QpCaps::default());
        let pa = leak_pool(&a.pd);
        let pb = leak_pool(&b.pd);
        // No receive yet: the SEND parks at the responder.
        let mut tx = qa
            .post_send_owned(1, allocator_api2::vec![in pa; 7u8; 16])
            .unwrap();
        let cq = acq.clone();
        let waiter = tokio::spawn(async move {
            tx.ready(&cq).await.unwrap();
            tx.take().unwrap()
        });
        tokio::time::sleep(Duration::from_millis(50)).await; // the task sleeps, armed
        let sync_cq = acq.cq().clone();
        let t = std::thread::spawn(move || sync_cq.wait_one(Duration::from_millis(300)));
        std::thread::sleep(Duration::from_millis(100)); // it sleeps on the channel too
        // The runtime thread is busy here (not in epoll_wait) while the completion comes.
        let rx = qb
            .post_recv_owned(2, allocator_api2::vec![in pb; 0u8; 64])
            .unwrap();
        let sync = t.join().unwrap();
        assert!(
            sync.is_err(),
            "the sync waiter only saw the owned completion"
        );
        let done = timeout(Duration::from_secs(3), waiter)
            .await
            .expect("the awaiting task woke: its request completed")
            .unwrap();
        assert_eq!(done.completion.status, WcStatus::Success);
        drop(rx);
    });
}
