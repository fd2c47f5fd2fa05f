//! Foreign CQs and QPs (`Cq::from_raw`, `Qp::from_raw`): objects created with raw libibverbs
//! calls, as rdma_cm or `sideway` would, carry grants and owned posts, with their completions
//! polled either through the wrapper or by the "other library" and handed over with
//! `Cq::deliver`. On the soft NIC (`cargo test`) only the refusals run; the verbs paths run in
//! the rxe guest (`RDMA_POOL_TEST_NIC=verbs`).

#![cfg_attr(not(feature = "verbs"), allow(unused_imports))]

mod common;

use common::*;
use rdma_pool::Pool;
use rdma_pool::nic::*;
use std::ffi::c_void;
use std::time::Instant;

#[test]
fn a_soft_nic_refuses_raw_objects() {
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(4).unwrap();
    let fake = 0x1000 as *mut c_void;
    // SAFETY: a soft NIC refuses before reading the pointer.
    let e = unsafe { Cq::from_raw(&nic, fake) }.unwrap_err();
    // Without the verbs backend there is no raw object at all: NoDevice.
    assert!(
        matches!(e, Error::InvalidArgument { .. } | Error::NoDevice),
        "{e}"
    );
    // SAFETY: as above.
    let e = unsafe { Qp::from_raw(&pd, fake, &cq, &cq) }.unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { .. } | Error::NoDevice),
        "{e}"
    );
}

/// Raw verbs objects of `nic`'s context, destroyed on drop (the "other library").
#[cfg(feature = "verbs")]
struct Raw {
    pd: *mut rdma_sys::ibv_pd,
    cq: *mut rdma_sys::ibv_cq,
    qp: *mut rdma_sys::ibv_qp,
}

#[cfg(feature = "verbs")]
impl Raw {
    fn new(nic: &Nic) -> Raw {
        let ctx = nic
            .raw_context()
            .expect("a verbs NIC")
            .cast::<rdma_sys::ibv_context>();
        // SAFETY: plain libibverbs calls on a live context; every object is checked.
        unsafe {
            let pd = rdma_sys::ibv_alloc_pd(ctx);
            assert!(!pd.is_null());
            let cq =
                rdma_sys::ibv_create_cq(ctx, 64, std::ptr::null_mut(), std::ptr::null_mut(), 0);
            assert!(!cq.is_null());
            let mut init: rdma_sys::ibv_qp_init_attr = std::mem::zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = rdma_sys::ibv_qp_type::IBV_QPT_RC;
            init.cap.max_send_wr = 32;
            init.cap.max_recv_wr = 32;
            init.cap.max_send_sge = 1;
            init.cap.max_recv_sge = 1;
            let qp = rdma_sys::ibv_create_qp(pd, &mut init);
            assert!(!qp.is_null());
            Raw { pd, cq, qp }
        }
    }

    /// Poll the CQ as the other library does; route through `cq.deliver`; return the
    /// application's completions.
    fn poll_and_deliver(&self, cq: &Cq) -> Vec<Completion> {
        let mut out = Vec::new();
        // SAFETY: a live CQ; `wc` has room for one completion.
        unsafe {
            let mut wc: rdma_sys::ibv_wc = std::mem::zeroed();
            while rdma_sys::ibv_poll_cq(self.cq, 1, &mut wc) == 1 {
                let c = Completion::from_raw((&raw const wc).cast());
                if !cq.deliver(&c) {
                    out.push(c);
                }
            }
        }
        out
    }
}

#[cfg(feature = "verbs")]
impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once, after every wrapper (dropped before this).
        unsafe {
            assert_eq!(rdma_sys::ibv_destroy_qp(self.qp), 0);
            assert_eq!(rdma_sys::ibv_destroy_cq(self.cq), 0);
            assert_eq!(rdma_sys::ibv_dealloc_pd(self.pd), 0);
        }
    }
}

#[cfg(feature = "verbs")]
#[test]
fn grants_and_owned_posts_work_on_foreign_objects() {
    let _g = serial();
    if !on_verbs() {
        eprintln!("the verbs paths run in the rxe guest");
        return;
    }
    let (na, nb) = nics();
    let raw = Raw::new(&na);
    // SAFETY: `raw` outlives every wrapper and handle below (declared first, dropped last).
    let (pd, cq) = unsafe {
        let pd = Pd::from_raw(&na, raw.pd.cast()).unwrap();
        let cq = Cq::from_raw(&na, raw.cq.cast()).unwrap();
        (pd, cq)
    };
    // Wrong wrappers are refused.
    let other_cq = na.create_cq(4).unwrap();
    // SAFETY: as above.
    let e = unsafe { Qp::from_raw(&pd, raw.qp.cast(), &other_cq, &cq) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let own_pd = na.alloc_pd().unwrap();
    // SAFETY: as above.
    let e = unsafe { Qp::from_raw(&own_pd, raw.qp.cast(), &cq, &cq) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    // SAFETY: as above.
    let qp = unsafe { Qp::from_raw(&pd, raw.qp.cast(), &cq, &cq) }.unwrap();
    assert!(qp.caps().max_send_wr >= 32 && qp.caps().max_recv_wr >= 32);
    // SAFETY: a live QP.
    assert_eq!(qp.qpn(), unsafe { (*raw.qp).qp_num });

    let peer = Side::new(nb);
    let pqp = peer.qp();
    link(&qp, &pqp);

    // A grant on the foreign QP, its bind completion polled by the "other library".
    let pool = Pool::new(&pd).unwrap();
    let buf = allocator_api2::vec![in &pool; 0x5au8; 4096];
    let mut grant = pool.grant(&buf, &qp).unwrap();
    let start = Instant::now();
    let mut apps = Vec::new();
    while pool.stats().grants.wrs_in_flight > 0 {
        apps.extend(raw.poll_and_deliver(&cq));
        assert!(start.elapsed() < WAIT, "the bind never completed");
    }
    assert!(
        apps.is_empty(),
        "the bind's completion is the crate's: {apps:?}"
    );
    let wire = grant.wire();
    let (back, back_mr) = peer.reg_buf(64, 0, Access::LOCAL_WRITE);
    // SAFETY: `back` outlives the request, which completes below.
    unsafe {
        pqp.post_read(1, &[back_mr.sge(0, 64).unwrap()], wire.addr, wire.rkey)
            .unwrap()
    };
    assert_eq!(peer.wait().status, WcStatus::Success);
    assert!(back.as_slice().iter().all(|&x| x == 0x5a));
    grant.start_revoke().unwrap();
    let start = Instant::now();
    while !grant.is_revoked() {
        assert!(raw.poll_and_deliver(&cq).is_empty());
        assert!(start.elapsed() < WAIT, "the revocation never completed");
    }
    drop(grant);
    // SAFETY: as above.
    unsafe {
        pqp.post_read(2, &[back_mr.sge(0, 64).unwrap()], wire.addr, wire.rkey)
            .unwrap()
    };
    assert_ne!(
        peer.wait().status,
        WcStatus::Success,
        "a revoked key is dead"
    );

    // An owned receive on the foreign QP: its completion reaches the handle through deliver.
    // (The peer's QP is in the error state after the refused READ: a fresh pair.)
    drop(pqp);
    let raw2 = Raw::new(&na);
    // SAFETY: `raw2` outlives the wrappers below.
    let (pd2, cq2) = unsafe {
        (
            Pd::from_raw(&na, raw2.pd.cast()).unwrap(),
            Cq::from_raw(&na, raw2.cq.cast()).unwrap(),
        )
    };
    // SAFETY: as above.
    let qp2 = unsafe { Qp::from_raw(&pd2, raw2.qp.cast(), &cq2, &cq2) }.unwrap();
    let pqp2 = peer.qp();
    link(&qp2, &pqp2);
    let pool2: &'static Pool = keep_pool(Pool::new(&pd2).unwrap());
    let rx = qp2
        .post_recv_owned(3, allocator_api2::vec![in pool2; 0u8; 64])
        .unwrap();
    pqp2.post_inline(4, SendOp::Send, b"foreign", SendFlags::SIGNALED)
        .unwrap();
    peer.wait();
    let start = Instant::now();
    let rx = loop {
        assert!(raw2.poll_and_deliver(&cq2).is_empty());
        if rx.is_complete() {
            break rx;
        }
        assert!(start.elapsed() < WAIT, "the receive never completed");
    };
    let done = rx.take().unwrap();
    assert_eq!(&done.buf[..7], b"foreign");
    // The application's own completions stay the application's.
    let app_buf = allocator_api2::vec![in pool2; 0u8; 64];
    let sge = pool2.sge_of(&app_buf).unwrap();
    // SAFETY: `app_buf` outlives the receive, which completes below.
    unsafe { qp2.post_recv(5, &[sge]).unwrap() };
    pqp2.post_inline(6, SendOp::SendWithImm(11), b"x", SendFlags::SIGNALED)
        .unwrap();
    peer.wait();
    let start = Instant::now();
    let mut apps = Vec::new();
    while apps.is_empty() {
        apps = raw2.poll_and_deliver(&cq2);
        assert!(start.elapsed() < WAIT);
    }
    assert_eq!((apps[0].wr_id, apps[0].imm_data), (5, Some(11)));
    drop((qp2, pqp2, qp, app_buf, buf));
    // `pool2` is 'static (owned requests take 'static buffers): its regions keep `raw2`'s PD
    // in use for the rest of the process.
    std::mem::forget(raw2);
}
