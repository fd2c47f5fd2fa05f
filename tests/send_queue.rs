//! Immediate data, inline payloads, unsignaled requests and batches, on the soft NIC in
//! `cargo test` and on rxe in the QEMU bed (`RDMA_POOL_TEST_NIC=verbs`), with the rows of
//! `quirks::RXE` where they differ.

mod common;

use common::*;
use rdma_pool::nic::quirks::{Quirk, applies};
use rdma_pool::nic::*;
use std::time::{Duration, Instant};

/// A bed whose sending QP has `caps` (its responder the usual one).
fn bed_with(caps: QpCaps) -> (Side, Side, Qp, Qp) {
    let (na, nb) = nics();
    let (a, b) = (Side::new(na), Side::new(nb));
    let qa = a.pd.create_qp(&a.cq, &a.cq, caps).unwrap();
    let qb = b.qp();
    link(&qa, &qb);
    (a, b, qa, qb)
}

fn inline_caps() -> QpCaps {
    QpCaps {
        max_inline_data: 64,
        max_send_sge: 2,
        ..Default::default()
    }
}

/// No completion arrives on `cq` for a while.
fn quiet(cq: &Cq) {
    let r = cq.wait_one(Duration::from_millis(200));
    assert!(matches!(r, Err(Error::Timeout(_))), "unexpected {r:?}");
}

#[test]
fn send_with_imm_delivers_the_immediate_in_host_order() {
    let _g = serial();
    let bed = bed();
    let (src, smr) = bed.a.reg_buf(4096, 0x5a, Access::LOCAL_WRITE);
    let (dst, dmr) = bed.b.reg_buf(4096, 0, Access::LOCAL_WRITE);
    // SAFETY: the buffers outlive the requests, which complete below.
    unsafe {
        bed.qb.post_recv(1, &[dmr.sge(0, 4096).unwrap()]).unwrap();
        bed.qa
            .post_send_with_imm(2, &[smr.sge(0, 5).unwrap()], 0xdead_beef)
            .unwrap();
    }
    let wc = bed.b.wait();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data),
        (1, WcStatus::Success, WcOpcode::Recv, 5, Some(0xdead_beef))
    );
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    assert_eq!(&dst.as_slice()[..6], &[0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0]);
    drop((src, dst));
}

#[test]
fn a_plain_send_carries_no_immediate() {
    let _g = serial();
    let bed = bed();
    let (_src, smr) = bed.a.reg_buf(64, 1, Access::LOCAL_WRITE);
    let (_dst, dmr) = bed.b.reg_buf(64, 0, Access::LOCAL_WRITE);
    // SAFETY: the buffers outlive the requests, which complete below.
    unsafe {
        bed.qb.post_recv(1, &[dmr.sge(0, 64).unwrap()]).unwrap();
        bed.qa.post_send(2, &[smr.sge(0, 8).unwrap()]).unwrap();
    }
    assert_eq!(bed.b.wait().imm_data, None);
    bed.a.wait();
}

#[test]
fn write_with_imm_lands_the_bytes_and_consumes_one_receive() {
    let _g = serial();
    let bed = bed();
    let (_src, smr) = bed.a.reg_buf(4096, 0x33, Access::LOCAL_WRITE);
    let (dst, dmr) = bed.b.reg_buf(4096, 0, RW);
    let (rbuf, rmr) = bed.b.reg_buf(64, 0xee, Access::LOCAL_WRITE);
    // SAFETY: the buffers outlive the requests, which complete below.
    unsafe {
        bed.qb.post_recv(7, &[rmr.sge(0, 64).unwrap()]).unwrap();
        bed.qa
            .post_write_with_imm(
                8,
                &[smr.sge(0, 100).unwrap()],
                dmr.addr() as u64 + 10,
                dmr.rkey(),
                42,
            )
            .unwrap();
    }
    let wc = bed.b.wait();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data),
        (
            7,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            100,
            Some(42)
        )
    );
    let sent = bed.a.wait();
    assert_eq!(
        (sent.wr_id, sent.status, sent.opcode),
        (8, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert!(dst.as_slice()[10..110].iter().all(|&x| x == 0x33));
    assert_eq!((dst.as_slice()[9], dst.as_slice()[110]), (0, 0));
    assert!(
        rbuf.as_slice().iter().all(|&x| x == 0xee),
        "the receive's own memory is not written"
    );
}

#[test]
fn write_with_imm_waits_for_a_receive_then_completes() {
    let _g = serial();
    let bed = bed();
    let (_src, smr) = bed.a.reg_buf(4096, 0x44, Access::LOCAL_WRITE);
    let (dst, dmr) = bed.b.reg_buf(4096, 0, RW);
    // SAFETY: the buffers outlive the request, which completes below.
    unsafe {
        bed.qa
            .post_write_with_imm(
                1,
                &[smr.sge(0, 64).unwrap()],
                dmr.addr() as u64,
                dmr.rkey(),
                5,
            )
            .unwrap();
    }
    quiet(&bed.a.cq);
    // SAFETY: no memory.
    unsafe { bed.qb.post_recv(2, &[]).unwrap() };
    let wc = bed.b.wait();
    assert_eq!(
        (wc.opcode, wc.imm_data, wc.byte_len),
        (WcOpcode::RecvRdmaWithImm, Some(5), 64)
    );
    assert_eq!(bed.a.wait().status, WcStatus::Success);
    assert!(dst.as_slice()[..64].iter().all(|&x| x == 0x44));
}

#[test]
fn write_with_imm_through_a_bad_key_fails_and_writes_nothing() {
    let _g = serial();
    let bed = bed();
    let (_src, smr) = bed.a.reg_buf(4096, 0x44, Access::LOCAL_WRITE);
    // Registered without REMOTE_WRITE.
    let (dst, dmr) = bed
        .b
        .reg_buf(4096, 0, Access::LOCAL_WRITE | Access::REMOTE_READ);
    // SAFETY: the buffers outlive the requests, which complete below.
    unsafe {
        bed.qb.post_recv(1, &[]).unwrap();
        bed.qa
            .post_write_with_imm(
                2,
                &[smr.sge(0, 64).unwrap()],
                dmr.addr() as u64,
                dmr.rkey(),
                5,
            )
            .unwrap();
    }
    assert_eq!(bed.a.wait().status, WcStatus::RemAccessErr);
    assert!(dst.as_slice().iter().all(|&x| x == 0));
    // The responder's receive does not report the immediate.
    if let Ok(wc) = bed.b.cq.wait_one(Duration::from_secs(2)) {
        assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
    }
}

#[test]
fn inline_sends_copy_at_post_time_from_any_memory() {
    let _g = serial();
    let (a, b, qa, qb) = bed_with(inline_caps());
    assert!(qa.caps().max_inline_data >= 64);
    let (dst, dmr) = b.reg_buf(4096, 0, RW);
    // SAFETY: the buffer outlives the receive, which completes below.
    unsafe { qb.post_recv(1, &[dmr.sge(0, 4096).unwrap()]).unwrap() };
    // Stack memory, never registered, overwritten as soon as the post returns.
    let mut data = *b"inline payload!!";
    qa.post_inline(2, SendOp::SendWithImm(3), &data, SendFlags::SIGNALED)
        .unwrap();
    data.fill(b'X');
    let wc = b.wait();
    assert_eq!((wc.byte_len, wc.imm_data), (16, Some(3)));
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(&dst.as_slice()[..16], b"inline payload!!");
    // An inline WRITE, then one that also reports.
    let w = SendOp::Write {
        remote_addr: dmr.addr() as u64 + 100,
        rkey: dmr.rkey(),
    };
    qa.post_inline(3, w, b"abc", SendFlags::SIGNALED).unwrap();
    assert_eq!(a.wait().status, WcStatus::Success);
    assert_eq!(&dst.as_slice()[100..103], b"abc");
}

#[test]
fn inline_limits_and_operations_are_refused_before_anything_is_posted() {
    let _g = serial();
    let (a, _b, qa, _qb) = bed_with(inline_caps());
    let max = qa.caps().max_inline_data as usize;
    let big = vec![0u8; max + 1];
    let e = qa
        .post_inline(1, SendOp::Send, &big, SendFlags::SIGNALED)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                limit: "max_inline_data",
                ..
            }
        ),
        "{e}"
    );
    let read = SendOp::Read {
        remote_addr: 0,
        rkey: Rkey(0),
    };
    let e = qa
        .post_inline(2, read, b"x", SendFlags::SIGNALED)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    quiet(&a.cq);
    assert_eq!(qa.state().unwrap(), QpState::Ready);
}

#[test]
fn a_device_refuses_an_inline_size_beyond_its_own() {
    let _g = serial();
    let (na, _) = nics();
    let side = Side::new(na);
    let caps = QpCaps {
        max_inline_data: 1 << 20,
        ..Default::default()
    };
    let e = side.pd.create_qp(&side.cq, &side.cq, caps).unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "{e}");
}

#[test]
fn unsignaled_requests_report_only_their_errors() {
    let _g = serial();
    let bed = bed();
    let (_src, smr) = bed.a.reg_buf(4096, 9, Access::LOCAL_WRITE);
    let (dst, dmr) = bed.b.reg_buf(4096, 0, RW);
    let sge = [smr.sge(0, 16).unwrap()];
    let wrs: Vec<SendWr> = (0..4u64)
        .map(|i| {
            let op = SendOp::Write {
                remote_addr: dmr.addr() as u64 + 16 * i,
                rkey: dmr.rkey(),
            };
            let flags = if i == 3 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            SendWr::new(10 + i, op, &sge).flags(flags)
        })
        .collect();
    // SAFETY: the buffers outlive the requests, which complete (the last signaled) below.
    unsafe { bed.qa.post_send_wrs(&wrs).unwrap() };
    let wc = bed.a.wait();
    assert_eq!((wc.wr_id, wc.status), (13, WcStatus::Success));
    quiet(&bed.a.cq);
    assert!(dst.as_slice()[..64].iter().all(|&x| x == 9));
    // An unsignaled request that fails is reported.
    let bad = SendWr::new(
        20,
        SendOp::Write {
            remote_addr: dmr.addr() as u64,
            rkey: Rkey(dmr.rkey().0 ^ 0x80),
        },
        &sge,
    )
    .flags(SendFlags::empty());
    // SAFETY: as above.
    unsafe { bed.qa.post_send_wr(&bad).unwrap() };
    let wc = bed.a.wait();
    assert_eq!((wc.wr_id, wc.status), (20, WcStatus::RemAccessErr));
}

#[test]
fn unsignaled_requests_hold_their_slots_until_a_signaled_one_completes() {
    let _g = serial();
    let depth = 8;
    let caps = QpCaps {
        max_send_wr: depth,
        ..Default::default()
    };
    let (a, b, qa, _qb) = bed_with(caps);
    let (_src, smr) = a.reg_buf(64, 1, Access::LOCAL_WRITE);
    let (_dst, dmr) = b.reg_buf(4096, 0, RW);
    let sge = [smr.sge(0, 8).unwrap()];
    let write = |id: u64, flags: SendFlags| {
        let op = SendOp::Write {
            remote_addr: dmr.addr() as u64,
            rkey: dmr.rkey(),
        };
        // SAFETY: the buffers outlive every request (the QP is dropped first).
        unsafe { qa.post_send_wr(&SendWr::new(id, op, &sge).flags(flags)) }
    };
    // Rounds of depth - 1 unsignaled and one signaled never fill the queue.
    for round in 0..3u64 {
        for i in 0..depth as u64 - 1 {
            write(round * 100 + i, SendFlags::empty()).unwrap();
        }
        write(round * 100 + 99, SendFlags::SIGNALED).unwrap();
        assert_eq!(a.wait().wr_id, round * 100 + 99);
    }
    // A queue of unsignaled requests only is full after `depth` of them.
    for i in 0..depth as u64 {
        write(1000 + i, SendFlags::empty()).unwrap();
    }
    if applies(a.nic.caps(), Quirk::UnsignaledSlotsFreedEarly) {
        // rxe frees them as they complete.
        let start = Instant::now();
        while write(2000, SendFlags::SIGNALED).is_err() {
            assert!(start.elapsed() < WAIT, "rxe never freed a slot");
            std::thread::sleep(Duration::from_millis(10));
        }
        a.wait();
    } else {
        let e = write(2000, SendFlags::SIGNALED).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOMEM), "{e}");
    }
}

#[test]
fn a_bad_request_in_a_batch_posts_none_of_it() {
    let _g = serial();
    let bed = bed();
    let (_src, smr) = bed.a.reg_buf(64, 1, Access::LOCAL_WRITE);
    let (dst, dmr) = bed.b.reg_buf(4096, 0, RW);
    let sge = [smr.sge(0, 8).unwrap()];
    let too_many = [sge[0]; 5];
    let op = SendOp::Write {
        remote_addr: dmr.addr() as u64,
        rkey: dmr.rkey(),
    };
    let reserved = 0x5250u64 << 48;
    for bad in [
        SendWr::new(2, op, &too_many),
        SendWr::new(reserved, op, &sge),
        SendWr::new(
            2,
            SendOp::Read {
                remote_addr: dmr.addr() as u64,
                rkey: dmr.rkey(),
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED | SendFlags::INLINE),
    ] {
        let wrs = [SendWr::new(1, op, &sge), bad, SendWr::new(3, op, &sge)];
        // SAFETY: nothing is posted (checked below); the buffers outlive the QP anyway.
        let e = unsafe { bed.qa.post_send_wrs(&wrs) }.unwrap_err();
        assert_eq!(e.posted, 0, "{e}");
    }
    quiet(&bed.a.cq);
    assert!(dst.as_slice().iter().all(|&x| x == 0));
    // A good batch posts all, in order.
    let wrs: Vec<SendWr> = (0..3).map(|i| SendWr::new(i, op, &sge)).collect();
    // SAFETY: the buffers outlive the requests, which complete below.
    unsafe { bed.qa.post_send_wrs(&wrs).unwrap() };
    let ids: Vec<u64> = bed.a.wait_n(3).into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, [0, 1, 2]);
}

/// A server side with one SRQ on its CQ, and `n` client QPs connected to server QPs on it.
fn srq_bed(n: usize, max_wr: u32) -> (Side, Side, Srq, Vec<(Qp, Qp)>) {
    let (na, nb) = nics();
    let (server, client) = (Side::new(na), Side::new(nb));
    let srq = server.pd.create_srq(&server.cq, max_wr, 1).unwrap();
    let caps = QpCaps {
        max_inline_data: 64,
        ..Default::default()
    };
    let pairs = (0..n)
        .map(|_| {
            let s = server.pd.create_qp_on_srq(&server.cq, &srq, caps).unwrap();
            let c = client.pd.create_qp(&client.cq, &client.cq, caps).unwrap();
            link(&s, &c);
            (s, c)
        })
        .collect();
    (server, client, srq, pairs)
}

#[test]
fn an_srq_serves_every_qp_in_posting_order() {
    let _g = serial();
    let (server, client, srq, pairs) = srq_bed(3, 16);
    for i in 0..6 {
        // SAFETY: no memory: the receives only take immediates.
        unsafe { srq.post_recv(100 + i, &[]).unwrap() };
    }
    // QP 2, then 0, then 1, twice: the SRQ's receives go out in posting order.
    let order = [2usize, 0, 1, 2, 0, 1];
    for (n, &q) in order.iter().enumerate() {
        let imm = (n as u32) << 8 | q as u32;
        pairs[q]
            .1
            .post_inline(n as u64, SendOp::SendWithImm(imm), &[], SendFlags::SIGNALED)
            .unwrap();
        let wc = server.wait();
        assert_eq!(
            (wc.wr_id, wc.qp_num, wc.imm_data),
            (100 + n as u64, pairs[q].0.qpn(), Some(imm))
        );
        client.wait();
    }
}

#[test]
fn a_message_waits_for_an_srq_receive() {
    let _g = serial();
    let (server, client, srq, pairs) = srq_bed(2, 16);
    pairs[1]
        .1
        .post_inline(1, SendOp::SendWithImm(5), &[], SendFlags::SIGNALED)
        .unwrap();
    quiet(&client.cq);
    // SAFETY: no memory.
    unsafe { srq.post_recv(9, &[]).unwrap() };
    let wc = server.wait();
    assert_eq!(
        (wc.wr_id, wc.qp_num, wc.imm_data),
        (9, pairs[1].0.qpn(), Some(5))
    );
    assert_eq!(client.wait().status, WcStatus::Success);
}

#[test]
fn a_destroyed_qp_leaves_the_srq_receives_to_the_others() {
    let _g = serial();
    let (server, client, srq, mut pairs) = srq_bed(2, 16);
    for i in 0..2 {
        // SAFETY: no memory.
        unsafe { srq.post_recv(i, &[]).unwrap() };
    }
    let (s0, c0) = pairs.remove(0);
    drop((s0, c0));
    pairs[0]
        .1
        .post_inline(3, SendOp::Send, &[], SendFlags::SIGNALED)
        .unwrap();
    let wc = server.wait();
    assert_eq!((wc.wr_id, wc.status), (0, WcStatus::Success));
    client.wait();
}

#[test]
fn srq_misuse_is_refused() {
    let _g = serial();
    let (server, _client, srq, pairs) = srq_bed(1, 4);
    // A QP on an SRQ has no receive queue of its own.
    // SAFETY: refused before anything is posted.
    let e = unsafe { pairs[0].0.post_recv(1, &[]) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    // An SRQ of another PD.
    let other = server.nic.alloc_pd().unwrap();
    let e = other
        .create_qp_on_srq(&server.cq, &srq, QpCaps::default())
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    // Too many entries, a reserved wr_id.
    let (_b, mr) = server.reg_buf(64, 0, Access::LOCAL_WRITE);
    let two = [mr.sge(0, 8).unwrap(), mr.sge(8, 8).unwrap()];
    // SAFETY: refused before anything is posted.
    let e = unsafe { srq.post_recv(1, &two) }.unwrap_err();
    assert!(matches!(e, Error::Limit { .. }), "{e}");
    // SAFETY: as above.
    let e = unsafe { srq.post_recv(0x5251 << 48, &[]) }.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    // Full: at least max_wr receives fit, and the queue ends (the device may round up).
    let mut n = 0;
    let e = loop {
        // SAFETY: no memory.
        match unsafe { srq.post_recv(n, &[]) } {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 1024, "an SRQ of 4 never filled");
    };
    assert!(n >= 4, "{n}");
    assert_eq!(e.errno(), Some(libc::ENOMEM), "{e}");
}

#[test]
fn a_recv_ring_refills_from_a_pool_across_qps_and_flushes_on_teardown() {
    let _g = serial();
    let (server, client, srq, pairs) = srq_bed(2, 8);
    let pool: &'static rdma_pool::Pool = keep_pool(rdma_pool::Pool::new(&server.pd).unwrap());
    let mut ring = RecvRing::new(&srq, 4, || allocator_api2::vec![in pool; 0u8; 128]).unwrap();
    assert_eq!((ring.posted(), ring.deficit()), (4, 0));
    for i in 0..20u8 {
        let q = (i % 2) as usize;
        pairs[q]
            .1
            .post_inline(i as u64, SendOp::Send, &[i; 9], SendFlags::SIGNALED)
            .unwrap();
        let got = ring.wait(WAIT).unwrap();
        assert_eq!(&got.buf[..], &[i; 9]);
        assert_eq!(got.completion.qp_num, pairs[q].0.qpn());
        assert_eq!(ring.posted(), 4);
        client.wait();
    }
    // The ring is deeper than the SRQ allows: refused.
    assert!(matches!(
        RecvRing::new(&srq, 9, || allocator_api2::vec![in pool; 0u8; 8]),
        Err(Error::Limit { .. })
    ));
    // An owned receive outlives the QPs and the SRQ handle: it comes back flushed when the
    // SRQ is destroyed, after its last QP.
    let rx = srq
        .post_recv_owned(77, allocator_api2::vec![in pool; 0u8; 16])
        .unwrap();
    drop((ring, pairs, srq));
    let done = rx.wait(WAIT).unwrap();
    assert_eq!(
        (done.completion.wr_id, done.completion.status),
        (77, WcStatus::WrFlushErr)
    );
    drop(server);
}

#[test]
fn connect_options_are_applied_and_checked() {
    let _g = serial();
    let (na, nb) = nics();
    let (a, b) = (Side::new(na), Side::new(nb));
    let (qa, qb) = (a.qp(), b.qp());
    // Out of range: refused before the device sees them.
    for bad in [
        ConnectOptions {
            path_mtu: Some(1000),
            ..Default::default()
        },
        ConnectOptions {
            timeout: 32,
            ..Default::default()
        },
        ConnectOptions {
            retry_cnt: 8,
            ..Default::default()
        },
    ] {
        let e = qa.connect_with(&qb.endpoint().unwrap(), &bad).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
    assert_eq!(qa.state().unwrap(), QpState::Init);
    // A GID index the port does not have.
    assert!(qa.endpoint_with(200).is_err());
    // Path MTU 1024: a 16 KiB message crosses in 16 packets (rxe) and arrives whole.
    let opts = ConnectOptions {
        path_mtu: Some(1024),
        timeout: 12,
        retry_cnt: 5,
        rnr_retry: 7,
        min_rnr_timer: 8,
        ..Default::default()
    };
    // Endpoints cross "the network" as bytes.
    let ea = Endpoint::from_bytes(&qa.endpoint().unwrap().to_bytes()).unwrap();
    let eb = Endpoint::from_bytes(&qb.endpoint().unwrap().to_bytes()).unwrap();
    qa.connect_with(&eb, &opts).unwrap();
    qb.connect_with(&ea, &opts).unwrap();
    let (_src, smr) = a.reg_buf(16384, 0x6b, Access::LOCAL_WRITE);
    let (dst, dmr) = b.reg_buf(16384, 0, RW);
    assert_eq!(
        write(
            &Bed { a, b, qa, qb },
            &smr,
            16384,
            dmr.addr() as u64,
            dmr.rkey()
        ),
        WcStatus::Success
    );
    assert!(dst.as_slice().iter().all(|&x| x == 0x6b));
}

#[cfg(feature = "serde")]
#[test]
fn wire_types_round_trip_through_serde() {
    let e = Endpoint {
        gid: [9; 16],
        qpn: 0x12_3456,
        lid: 7,
        psn: 0x65_4321,
    };
    let json = serde_json::to_string(&e).unwrap();
    assert_eq!(serde_json::from_str::<Endpoint>(&json).unwrap(), e);
    let w = rdma_pool::grant::GrantWire {
        addr: 0x7f00_0000_1000,
        len: 4096,
        rkey: Rkey(0x1234),
    };
    let json = serde_json::to_string(&w).unwrap();
    assert_eq!(
        serde_json::from_str::<rdma_pool::grant::GrantWire>(&json).unwrap(),
        w
    );
    // Out-of-range numbers are refused in JSON as in the byte form (hardware would take the
    // low 24 bits: another QP), and by connect_with.
    let hostile = r#"{"gid":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"qpn":4294967295,"lid":0,"psn":1}"#;
    assert!(serde_json::from_str::<Endpoint>(hostile).is_err());
    let nic = Nic::soft();
    let cq = nic.create_cq(4).unwrap();
    let qp = nic
        .alloc_pd()
        .unwrap()
        .create_qp(&cq, &cq, QpCaps::default())
        .unwrap();
    let wide = Endpoint { qpn: 1 << 24, ..e };
    let err = qp.connect(&wide).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    // Out-of-range numbers in the byte form are refused.
    let mut b = e.to_bytes();
    b[19] = 1;
    assert_eq!(Endpoint::from_bytes(&b), None);
}

#[test]
fn a_receive_posted_to_a_failed_qp_is_flushed_where_the_device_does_it() {
    let _g = serial();
    let bed = bed();
    let (_src, smr) = bed.a.reg_buf(64, 1, Access::LOCAL_WRITE);
    // A WRITE through a bad key fails both QPs (the responder too, IB class C error).
    assert_eq!(
        write(&bed, &smr, 8, 0x1000, Rkey(0xdead_beef)),
        WcStatus::RemAccessErr
    );
    let start = Instant::now();
    while bed.qb.state().unwrap() != QpState::Error {
        assert!(start.elapsed() < WAIT, "the responder never failed");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Drain what the failure flushed at the responder (nothing was posted there).
    while bed.b.cq.poll_one().unwrap().is_some() {}
    // SAFETY: no memory.
    unsafe { bed.qb.post_recv(5, &[]).unwrap() };
    if applies(bed.b.nic.caps(), Quirk::RecvAfterErrorWaits) {
        quiet(&bed.b.cq);
    } else {
        let wc = bed.b.wait();
        assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlushErr));
    }
}
