//! rdma_cm connection set-up (`rdma_pool::cm`), in the rxe guest (`RDMA_POOL_TEST_NIC=verbs`),
//! where veth0/rxe0 has 10.77.0.1 and veth1/rxe1 10.77.0.2: a listener and a client in two
//! threads, private data both ways, a grant over the connection, the async calls, and the
//! refusals. On a machine without RDMA devices only the refusals run.

#![cfg(feature = "verbs")]

mod common;

use common::*;
use rdma_pool::Pool;
use rdma_pool::cm::{self, CmError, CmListener, CmOptions, QpSpec};
use rdma_pool::grant::GrantWire;
use rdma_pool::nic::*;
use std::net::SocketAddr;
use std::time::Duration;

const SERVER: &str = "10.77.0.2";

fn opts() -> CmOptions {
    CmOptions {
        timeout: Duration::from_secs(20),
        ..CmOptions::default()
    }
}

fn caps() -> QpCaps {
    QpCaps {
        max_inline_data: 64,
        ..QpCaps::default()
    }
}

#[test]
fn without_rdma_devices_every_call_fails_cleanly() {
    if on_verbs() {
        return;
    }
    // No /dev/infiniband/rdma_cm here (or no device behind it): typed errors, no panic.
    if let Ok(d) = cm::devices() {
        assert!(d.is_empty() || d.iter().all(|n| n.kind() == NicKind::Verbs));
    }
    assert!(CmListener::bind("127.0.0.1:0".parse().unwrap()).is_err());
    assert!(cm::resolve("127.0.0.1:7471".parse().unwrap(), &CmOptions::default()).is_err());
    assert!(cm::open("no-such-device").is_err());
}

#[test]
fn a_client_and_a_server_connect_exchange_data_and_a_grant() {
    let _g = serial();
    if !on_verbs() {
        return;
    }
    let listener = CmListener::bind(format!("{SERVER}:0").parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    assert_ne!(addr.port(), 0);
    let snic = listener.nic().expect("bound to rxe1's address");
    assert_eq!(snic.caps().name, "rxe1");
    let server = std::thread::spawn(move || {
        let pd = snic.alloc_pd().unwrap();
        let cq = snic.create_cq(64).unwrap();
        let pool = Pool::new(&pd).unwrap();
        let spec = QpSpec {
            caps: caps(),
            ..QpSpec::new(&pd, &cq)
        };
        let mut conn = listener.accept(&spec, b"welcome", &opts()).unwrap();
        assert_eq!(conn.peer_data(), b"hello");
        // The CM padded it on the wire; the raw form shows the frame.
        assert_eq!(&conn.peer_data_raw()[..6], b"\x05hello");
        assert_eq!(conn.local_addr(), Some(addr));
        // One buffer, granted to this client only; the key goes over the connection.
        let buf = allocator_api2::vec![in &pool; 0x42u8; 4096];
        let mut grant = pool.grant(&buf, conn.qp()).unwrap();
        grant.wait(&cq, |_| {}).unwrap();
        conn.qp()
            .post_inline(
                1,
                SendOp::Send,
                &grant.wire().to_bytes(),
                SendFlags::SIGNALED,
            )
            .unwrap();
        assert_eq!(cq.wait_one(WAIT).unwrap().status, WcStatus::Success);
        // The client says when it is done reading, then leaves.
        conn.wait_disconnected(Duration::from_secs(20)).unwrap();
        grant.revoke(&cq, |_| {}).unwrap();
    });

    let resolved = cm::resolve(addr, &opts()).unwrap();
    let cnic = resolved.nic().unwrap();
    let pd = cnic.alloc_pd().unwrap();
    let cq = cnic.create_cq(64).unwrap();
    let pool = Pool::new(&pd).unwrap();
    let wire_buf = allocator_api2::vec![in &pool; 0u8; 64];
    let wire_sge = pool.sge_of(&wire_buf).unwrap();
    let spec = QpSpec {
        caps: caps(),
        ..QpSpec::new(&pd, &cq)
    };
    // The receive for the grant's wire form must be posted before the server sends: post it
    // on the QP as soon as it exists — here, right after connecting (the server waits for its
    // grant's bind first, and RNR retries cover the rest).
    let conn = resolved.connect(&spec, b"hello", &opts()).unwrap();
    assert_eq!(conn.peer_data(), b"welcome");
    assert_eq!(conn.peer_addr(), Some(addr));
    // SAFETY: `wire_buf` outlives the receive, which completes below.
    unsafe { conn.qp().post_recv(2, &[wire_sge]).unwrap() };
    let wc = cq.wait_one(WAIT).unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (2, WcStatus::Success, 20)
    );
    let wire = GrantWire::from_bytes(&wire_buf[..20]).unwrap();
    let back = allocator_api2::vec![in &pool; 0u8; 4096];
    let back_sge = pool.sge_of(&back).unwrap();
    // SAFETY: `back` outlives the read, which completes below.
    unsafe {
        conn.qp()
            .post_read(3, &[back_sge], wire.addr, wire.rkey)
            .unwrap()
    };
    assert_eq!(cq.wait_one(WAIT).unwrap().status, WcStatus::Success);
    assert!(back.iter().all(|&x| x == 0x42));
    conn.disconnect().unwrap();
    server.join().unwrap();
}

#[test]
fn refusals_are_typed_and_lose_nothing() {
    let _g = serial();
    if !on_verbs() {
        return;
    }
    let addr: SocketAddr = format!("{SERVER}:0").parse().unwrap();
    let listener = CmListener::bind(addr).unwrap();
    let addr = listener.local_addr().unwrap();
    let snic = listener.nic().unwrap();
    let spd = snic.alloc_pd().unwrap();
    let scq = snic.create_cq(16).unwrap();
    // Too much private data: refused before anything is sent.
    let e = listener
        .accept(&QpSpec::new(&spd, &scq), &[0; 197], &opts())
        .unwrap_err();
    assert!(
        matches!(e, CmError::PrivateDataTooLong { max: 195, .. }),
        "{e}"
    );
    let resolved = cm::resolve(addr, &opts()).unwrap();
    let cnic = resolved.nic().unwrap();
    let (cpd, ccq) = (cnic.alloc_pd().unwrap(), cnic.create_cq(16).unwrap());
    let e = cm::connect(addr, &QpSpec::new(&cpd, &ccq), &[0; 56], &opts()).unwrap_err();
    assert!(
        matches!(e, CmError::PrivateDataTooLong { max: 55, .. }),
        "{e}"
    );
    // A PD of another device than the route's.
    let other = ["rxe0", "rxe1"]
        .into_iter()
        .find(|n| *n != cnic.caps().name)
        .unwrap();
    let onic = cm::open(other).unwrap();
    let (opd, ocq) = (onic.alloc_pd().unwrap(), onic.create_cq(16).unwrap());
    let e = resolved
        .connect(&QpSpec::new(&opd, &ocq), b"", &opts())
        .unwrap_err();
    assert!(matches!(e, CmError::WrongDevice), "{e}");
    // A port nobody listens on: rejected (or unreachable), not a hang.
    let nobody: SocketAddr = format!("{SERVER}:9").parse().unwrap();
    let quick = CmOptions {
        timeout: Duration::from_secs(20),
        ..opts()
    };
    let e = cm::connect(nobody, &QpSpec::new(&cpd, &ccq), b"", &quick).unwrap_err();
    assert!(
        matches!(e, CmError::Rejected { .. } | CmError::Unexpected { .. }),
        "{e}"
    );
    // A listener on an address this machine does not have (TEST-NET-1).
    let e = CmListener::bind("192.0.2.1:0".parse().unwrap()).unwrap_err();
    assert!(matches!(e, CmError::Os { .. }), "{e}");
    // The PD is usable afterwards: nothing was left half-made.
    assert!(cpd.create_qp(&ccq, &ccq, QpCaps::default()).is_ok());
}

#[cfg(feature = "tokio")]
#[test]
fn async_accept_and_connect_with_async_completions() {
    let _g = serial();
    if !on_verbs() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = CmListener::bind(format!("{SERVER}:0").parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let snic = listener.nic().unwrap();
        let server = tokio::spawn(async move {
            let pd = snic.alloc_pd().unwrap();
            let cq = AsyncCq::new(&snic, 64).unwrap();
            let spec = QpSpec {
                caps: caps(),
                ..QpSpec::new(&pd, cq.cq())
            };
            let mut conn = listener.accept_async(&spec, b"", &opts()).await.unwrap();
            // SAFETY: no memory: the receive only takes the immediate.
            unsafe { conn.qp().post_recv(1, &[]).unwrap() };
            conn.qp()
                .post_inline(2, SendOp::Send, b"ready", SendFlags::SIGNALED)
                .unwrap();
            let mut got = Vec::new();
            while got.len() < 2 {
                got.push(cq.next().await.unwrap());
            }
            let imm = got.iter().find_map(|w| w.imm_data);
            assert_eq!(imm, Some(77));
            conn.disconnected().await.unwrap();
        });
        let resolved = cm::resolve_async(addr, &opts()).await.unwrap();
        let cnic = resolved.nic().unwrap();
        let pd = cnic.alloc_pd().unwrap();
        let cq = AsyncCq::new(&cnic, 64).unwrap();
        let spec = QpSpec {
            caps: caps(),
            ..QpSpec::new(&pd, cq.cq())
        };
        let conn = resolved.connect_async(&spec, b"", &opts()).await.unwrap();
        let pool: &'static Pool = keep_pool(Pool::new(&pd).unwrap());
        let rx = conn
            .qp()
            .post_recv_owned(3, allocator_api2::vec![in pool; 0u8; 64])
            .unwrap();
        let got = tokio::time::timeout(WAIT, rx.wait_async(&cq))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got.buf[..], b"ready");
        conn.qp()
            .post_inline(4, SendOp::SendWithImm(77), &[], SendFlags::SIGNALED)
            .unwrap();
        let wc = tokio::time::timeout(WAIT, cq.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((wc.wr_id, wc.status), (4, WcStatus::Success));
        conn.disconnect().unwrap();
        tokio::time::timeout(Duration::from_secs(20), server)
            .await
            .unwrap()
            .unwrap();
    });
}
