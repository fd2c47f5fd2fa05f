//! Owned posts (`Qp::post_*_owned`): the buffer travels with the work request, comes back with
//! its completion, and is never freed while the NIC may touch it — in safe code only. Runs on
//! the soft NIC pair and on the rxe pair of the test bed.

#[path = "../common/mod.rs"]
mod common;

use allocator_api2::vec::Vec as PoolVec;
use common::*;
use rdma_pool::Pool;
use rdma_pool::nic::*;
use std::time::{Duration, Instant};

/// Pools that live for the test binary (owned buffers are `'static`), reachable from here so
/// that the leak checker of the ASan run does not count them.
static KEPT: std::sync::Mutex<Vec<&'static Pool>> = std::sync::Mutex::new(Vec::new());

/// A pool on `pd` that lives for the test binary.
fn pool_on(pd: &Pd) -> &'static Pool {
    let pool = Box::leak(Box::new(
        Pool::with_config(pd, small_arena()).expect("pool"),
    ));
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(pool);
    pool
}

/// Poll `cq` until an application completion arrives.
fn app_completion(cq: &Cq) -> Completion {
    let start = Instant::now();
    loop {
        let mut wc = [Completion::default()];
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        assert!(start.elapsed() < WAIT, "no completion");
        std::thread::yield_now();
    }
}

/// Poll `cq` (routing owned completions) until `cond` holds.
fn poll_until(cq: &Cq, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        let mut wc = [Completion::default(); 4];
        let n = cq.poll(&mut wc).unwrap();
        assert_eq!(n, 0, "no application completion expected: {:?}", &wc[..n]);
        assert!(start.elapsed() < WAIT, "condition not reached");
        std::thread::yield_now();
    }
}

#[test]
fn a_receive_gives_its_buffer_back_with_the_bytes_that_arrived() {
    let _s = serial();
    let bed = bed();
    let (pa, pb) = (pool_on(&bed.a.pd), pool_on(&bed.b.pd));
    let rx = bed
        .qb
        .post_recv_owned(7, allocator_api2::vec![in pb; 0u8; 256])
        .unwrap();
    let tx = bed
        .qa
        .post_send_owned(8, allocator_api2::vec![in pa; 0x5a; 40])
        .unwrap();
    let sent = tx.wait(WAIT).unwrap();
    assert_eq!(
        (sent.completion.wr_id, sent.completion.status),
        (8, WcStatus::Success)
    );
    assert_eq!(sent.buf.len(), 40, "a send's buffer comes back as it went");
    let got = rx.wait(WAIT).unwrap();
    assert_eq!(
        got.completion.wr_id, 7,
        "the application's wr_id, not the crate's"
    );
    assert_eq!(got.completion.status, WcStatus::Success);
    assert_eq!(got.buf.len(), 40, "a receive keeps the bytes that arrived");
    assert!(got.buf.iter().all(|&b| b == 0x5a));
}

/// The pattern: post a receive, drop everything, allocate again, the peer sends.
#[test]
fn a_dropped_receive_parks_its_buffer_and_never_lands_in_a_new_one() {
    let _s = serial();
    let bed = bed();
    let (pa, pb) = (pool_on(&bed.a.pd), pool_on(&bed.b.pd));
    let live = pb.live_blocks();
    let posted = bed
        .qb
        .post_recv_owned(1, allocator_api2::vec![in pb; 0u8; 64])
        .unwrap();
    drop(posted);
    assert_eq!(bed.b.cq.parked(), 1);
    assert_eq!(pb.live_blocks(), live + 1, "the parked buffer is not freed");
    // A new buffer of the same size: not the parked block.
    let fresh: PoolVec<u8, _> = allocator_api2::vec![in pb; 0u8; 64];
    let tx = bed
        .qa
        .post_send_owned(2, allocator_api2::vec![in pa; 0xee; 16])
        .unwrap();
    assert_eq!(tx.wait(WAIT).unwrap().completion.status, WcStatus::Success);
    poll_until(&bed.b.cq, || bed.b.cq.parked() == 0);
    assert!(
        fresh.iter().all(|&b| b == 0),
        "the peer's bytes landed in a new buffer"
    );
    assert_eq!(
        pb.live_blocks(),
        live + 1,
        "the parked buffer was freed at its completion"
    );
    drop(fresh);
    assert_eq!(pb.live_blocks(), live);
}

#[test]
fn destroying_the_qp_returns_in_flight_buffers_flushed_and_frees_parked_ones() {
    let _s = serial();
    let bed = bed();
    let pb = pool_on(&bed.b.pd);
    let live = pb.live_blocks();
    let kept = bed
        .qb
        .post_recv_owned(1, allocator_api2::vec![in pb; 3u8; 128])
        .unwrap();
    let parked = bed
        .qb
        .post_recv_owned(2, allocator_api2::vec![in pb; 0u8; 128])
        .unwrap();
    drop(parked);
    assert_eq!(bed.b.cq.parked(), 1);
    assert!(!kept.is_complete());
    let Bed { a, b, qa, qb } = bed;
    drop(qb);
    assert_eq!(
        b.cq.parked(),
        0,
        "destroying the QP released the parked buffer"
    );
    let done = kept.wait(Duration::ZERO).unwrap();
    assert_eq!(done.completion.status, WcStatus::WrFlushErr);
    assert_eq!((done.completion.wr_id, done.buf.len()), (1, 128));
    assert!(
        done.buf.iter().all(|&x| x == 3),
        "a flushed buffer is untouched"
    );
    drop(done);
    assert_eq!(pb.live_blocks(), live);
    drop((a, qa));
}

#[test]
fn an_owned_read_hands_the_buffer_back_with_the_remote_bytes() {
    let _s = serial();
    let bed = bed();
    let pa = pool_on(&bed.a.pd);
    let mut src = buf(4096, 0x33);
    let mr = reg_in(
        &bed.b.pd,
        &mut src,
        Access::LOCAL_WRITE | Access::REMOTE_READ,
    )
    .unwrap();
    let posted = bed
        .qa
        .post_read_owned(
            9,
            allocator_api2::vec![in pa; 0u8; 512],
            mr.addr() as u64,
            mr.rkey(),
        )
        .unwrap();
    let done = posted.wait(WAIT).unwrap();
    assert_eq!(done.completion.status, WcStatus::Success);
    assert_eq!(done.buf.len(), 512);
    assert!(done.buf.iter().all(|&b| b == 0x33));
    // A read under a key that does not cover it fails; the buffer still comes back.
    let posted = bed
        .qa
        .post_read_owned(10, done.buf, mr.addr() as u64, Rkey(mr.rkey().0 ^ 0x100))
        .unwrap();
    let failed = posted.wait(WAIT).unwrap();
    assert_ne!(failed.completion.status, WcStatus::Success);
    assert_eq!(
        failed.buf.len(),
        512,
        "a failed read tells the buffer nothing"
    );
}

#[test]
fn memory_of_no_pool_is_refused_and_given_back_untouched() {
    let _s = serial();
    let bed = bed();
    // This test binary's global allocator is the system's: no registration covers it.
    let heap = vec![9u8; 100];
    let e = bed.qa.post_send_owned(1, heap).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidArgument { .. }),
        "{:?}",
        e.error
    );
    assert_eq!(e.buf, vec![9u8; 100]);
    assert_eq!(bed.a.cq.parked(), 0);
    // A refused post (here: the receive queue is full) gives the buffer back too.
    let pb = pool_on(&bed.b.pd);
    let mut posted = Vec::new();
    let refused = loop {
        match bed
            .qb
            .post_recv_owned(posted.len() as u64, allocator_api2::vec![in pb; 1u8; 8])
        {
            Ok(p) => posted.push(p),
            Err(e) => break e,
        }
        assert!(posted.len() <= 1 << 16, "the receive queue never filled");
    };
    assert!(posted.len() >= QpCaps::default().max_recv_wr as usize);
    assert_eq!(&refused.buf[..], &[1u8; 8]);
    drop(posted);
    assert!(bed.b.cq.parked() > 0);
}

#[test]
fn raw_posts_refuse_the_crates_wr_ids() {
    let _s = serial();
    let bed = bed();
    for id in [0x5250u64 << 48, 0x5251 << 48 | 7] {
        assert!(is_reserved_wr_id(id));
        // SAFETY: no memory is posted (no SGE).
        let e = unsafe { bed.qa.post_send(id, &[]) }.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        // SAFETY: as above.
        let e = unsafe { bed.qb.post_recv(id, &[]) }.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        assert!(bed.qa.post_local_inv(id, Rkey(1)).is_err());
    }
}

#[test]
fn application_completions_read_while_a_handle_waits_come_back_in_order() {
    let _s = serial();
    let bed = bed();
    let (pa, pb) = (pool_on(&bed.a.pd), pool_on(&bed.b.pd));
    let rx = bed
        .qb
        .post_recv_owned(1, allocator_api2::vec![in pb; 0u8; 64])
        .unwrap();
    // Two raw sends of the application's, then an owned one, on the same CQ.
    for id in [100, 101] {
        // SAFETY: no memory is posted (a zero-length SEND); the receive is owned.
        unsafe { bed.qa.post_send(id, &[]) }.unwrap();
    }
    let rx2 = bed
        .qb
        .post_recv_owned(2, allocator_api2::vec![in pb; 0u8; 64])
        .unwrap();
    let rx3 = bed
        .qb
        .post_recv_owned(3, allocator_api2::vec![in pb; 0u8; 64])
        .unwrap();
    let tx = bed
        .qa
        .post_send_owned(102, allocator_api2::vec![in pa; 1u8; 8])
        .unwrap();
    let done = tx.wait(WAIT).unwrap();
    assert_eq!(done.completion.wr_id, 102);
    assert_eq!(app_completion(&bed.a.cq).wr_id, 100);
    assert_eq!(app_completion(&bed.a.cq).wr_id, 101);
    for (p, n) in [(rx, 0), (rx2, 0), (rx3, 8)] {
        let d = p.wait(WAIT).unwrap();
        assert_eq!((d.completion.status, d.buf.len()), (WcStatus::Success, n));
    }
}

/// A receive that succeeded before its QP was destroyed (and before anyone polled) reports
/// the success and the bytes, not a flush: the completion left in the device wins.
#[test]
fn a_receive_completed_before_its_qp_died_still_reports_its_bytes() {
    let _s = serial();
    let bed = bed();
    let (pa, pb) = (pool_on(&bed.a.pd), pool_on(&bed.b.pd));
    let rx = bed
        .qb
        .post_recv_owned(4, allocator_api2::vec![in pb; 0u8; 128])
        .unwrap();
    let tx = bed
        .qa
        .post_send_owned(5, allocator_api2::vec![in pa; 0x3c; 48])
        .unwrap();
    assert_eq!(tx.wait(WAIT).unwrap().completion.status, WcStatus::Success);
    let Bed { a, b, qa, qb } = bed;
    drop(qb);
    let got = rx.wait(WAIT).unwrap();
    assert_eq!(
        got.completion.status,
        WcStatus::Success,
        "{:?}",
        got.completion
    );
    assert_eq!(got.buf.len(), 48);
    assert!(got.buf.iter().all(|&x| x == 0x3c));
    drop((a, b, qa));
}

/// Another thread waiting on a handle polls the same CQ: the application's completions still
/// come out of `Cq::poll` each once, in the device's order.
#[test]
fn a_waiting_handle_never_reorders_the_applications_completions() {
    let _s = serial();
    let bed = bed();
    let pa = pool_on(&bed.a.pd);
    // A handle on the CQ that never completes: a receive on a QP never connected.
    let lone = bed.a.qp();
    let idle = lone
        .post_recv_owned(0, allocator_api2::vec![in pa; 0u8; 8])
        .unwrap();
    // `qa` in the error state: every request posted completes at once, flushed, in order.
    let (_m, local) = (bed.a.nic.clone(), buf(8, 0));
    let mut local = local;
    let mr = reg_in(&bed.a.pd, &mut local, Access::LOCAL_WRITE).unwrap();
    // SAFETY: `local` outlives the request, and is not read until its completion.
    unsafe {
        bed.qa
            .post_read(u64::MAX >> 1, &[mr.sge(0, 8).unwrap()], 0x1000, Rkey(0xbad))
    }
    .unwrap();
    let start = Instant::now();
    while bed.qa.state().unwrap() != QpState::Error {
        let mut wc = [Completion::default(); 4];
        bed.a.cq.poll(&mut wc).unwrap();
        assert!(start.elapsed() < WAIT, "the QP never failed");
    }
    let mut wc = [Completion::default(); 4];
    while bed.a.cq.poll(&mut wc).unwrap() > 0 {}
    /// Stops the waiter however the test ends.
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = Stop(&stop);
        s.spawn(|| {
            let mut h = idle;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                h = h.wait(Duration::ZERO).unwrap_err().posted;
            }
        });
        const N: u64 = 100_000;
        let (mut posted, mut next) = (1u64, 1u64);
        let start = Instant::now();
        while next <= N {
            while posted <= N && posted - next < 16 {
                bed.qa.post_local_inv(posted, Rkey(1)).unwrap();
                posted += 1;
            }
            let mut wc = [Completion::default(); 8];
            let n = bed.a.cq.poll(&mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!(c.wr_id, next, "out of order: {c:?}");
                next += 1;
            }
            assert!(start.elapsed() < WAIT * 3, "completions missing at {next}");
        }
    });
}

/// A QP whose destruction fails keeps its requests: their handles neither complete nor
/// panic, and later requests on the CQ are unaffected.
#[test]
fn a_qp_that_could_not_be_destroyed_keeps_its_requests() {
    let _s = serial();
    let bed = soft_bed(Default::default());
    let (pa, pb) = (pool_on(&bed.a.pd), pool_on(&bed.b.pd));
    let stuck = bed
        .qb
        .post_recv_owned(1, allocator_api2::vec![in pb; 0u8; 64])
        .unwrap();
    bed.b
        .nic
        .as_soft()
        .unwrap()
        .fail_next(Verb::DestroyQp, 1, libc::EBUSY);
    let Bed { a, b, qa, qb } = bed;
    drop(qb);
    assert!(!stuck.is_complete());
    let stuck = stuck.wait(Duration::from_millis(10)).unwrap_err().posted;
    // A fresh pair on the same CQs: its requests complete as usual.
    let (qa2, qb2) = connect(&a, &b);
    let rx = qb2
        .post_recv_owned(2, allocator_api2::vec![in pb; 0u8; 64])
        .unwrap();
    let tx = qa2
        .post_send_owned(3, allocator_api2::vec![in pa; 9u8; 8])
        .unwrap();
    assert_eq!(tx.wait(WAIT).unwrap().completion.status, WcStatus::Success);
    assert_eq!(&rx.wait(WAIT).unwrap().buf[..], &[9u8; 8]);
    assert!(!stuck.is_complete());
    drop(stuck);
    assert_eq!(b.cq.parked(), 1, "the stuck receive's buffer stays parked");
    drop((a, qa, qa2, qb2));
}

/// A pool whose own key would let a peer reach every block is refused in safe code: the
/// pool's rkey plus an owned WRITE could otherwise overwrite live and freed blocks, a READ
/// return freed blocks' old contents (and with implicit ODP, any byte of the process).
#[test]
fn pools_with_remote_rights_need_the_unsafe_constructor() {
    let _s = serial();
    let bed = bed();
    for remote in [
        Access::REMOTE_READ,
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
        Access::REMOTE,
    ] {
        let cfg = rdma_pool::arena::ArenaConfig {
            remote,
            ..small_arena()
        };
        let e = Pool::with_config(&bed.a.pd, cfg).unwrap_err();
        assert!(
            matches!(
                e,
                rdma_pool::PoolError::Arena(rdma_pool::arena::Error::Config(_))
            ),
            "{e:?}"
        );
    }
    // An implicit ODP region's key would reach the whole process.
    let implicit = rdma_pool::arena::ArenaConfig {
        remote: Access::REMOTE_READ,
        registration: rdma_pool::arena::Registration::Odp,
        implicit_odp: true,
        ..small_arena()
    };
    assert!(rdma_pool::arena::Arena::new(&bed.a.pd, implicit).is_err());
    assert!(Pool::with_config(&bed.a.pd, small_arena()).is_ok());
    static G: rdma_pool::GlobalPool =
        rdma_pool::GlobalPool::with_config(rdma_pool::global::GlobalConfig {
            arena: rdma_pool::arena::ArenaConfig {
                remote: Access::REMOTE_WRITE,
                reserve: 1 << 32,
                ..rdma_pool::global::GlobalConfig::DEFAULT.arena
            },
            open: Some(open_pool_nic),
            ..rdma_pool::global::GlobalConfig::DEFAULT
        });
    assert!(matches!(G.init(), Err(rdma_pool::arena::Error::Config(_))));
}

/// A buffer registered together with its region is posted owned, a range at a time; it takes
/// no right a peer could write it with.
#[test]
fn registered_buffers_are_posted_owned_a_range_at_a_time() {
    let _s = serial();
    let bed = bed();
    let mut msg = bed
        .a
        .pd
        .register(Buffer::new(8192).unwrap(), Access::LOCAL_WRITE)
        .unwrap();
    msg.as_mut_slice()[100..140].fill(0x77);
    msg.set_range(100..140).unwrap();
    assert!(msg.set_range(8000..9000).is_err());
    let landing = bed
        .b
        .pd
        .register(Buffer::new(4096).unwrap(), Access::LOCAL_WRITE)
        .unwrap();
    let rx = bed.qb.post_recv_owned(1, landing).unwrap();
    let sent = bed.qa.post_send_owned(2, msg).unwrap().wait(WAIT).unwrap();
    assert_eq!(sent.completion.status, WcStatus::Success);
    let got = rx.wait(WAIT).unwrap();
    assert_eq!(
        (got.completion.status, got.completion.byte_len),
        (WcStatus::Success, 40)
    );
    assert!(got.buf.as_slice()[..40].iter().all(|&b| b == 0x77));
    // A registration of the other device is refused at post time, the buffer given back.
    let e = bed.qa.post_recv_owned(3, got.buf).unwrap_err();
    assert!(
        matches!(e.error, Error::InvalidArgument { .. }),
        "{:?}",
        e.error
    );
    assert!(e.buf.into_buffer().is_ok());
    for bad in [Access::REMOTE_WRITE, Access::REMOTE_ATOMIC, Access::MW_BIND] {
        let r = bed
            .a
            .pd
            .register(Buffer::new(4096).unwrap(), Access::LOCAL_WRITE | bad);
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{bad:?}");
    }
}
