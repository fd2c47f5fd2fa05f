//! Quick start: two in-process peers on the embedded default NIC (the soft NIC when no RDMA
//! device is present). Register a buffer, RDMA WRITE into the peer, READ it back, and watch a
//! wrong rkey be rejected.
//!
//! Run with `cargo run --example quickstart` (or `bash scripts/demo.sh`).

use rdma_pool::nic::{Access, Buffer, Nic, NicKind, QpCaps, WcStatus};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let nic = Nic::open_default()?;
    // Two ends of a connection. On a real device both live on the same port; on the soft NIC
    // the second is a second in-process device, a separate "machine".
    let peer_nic = match nic.kind() {
        NicKind::Soft => Nic::soft(),
        NicKind::Verbs => nic.clone(),
    };
    println!(
        "NIC: {} ({:?}, driver {})",
        nic.caps().name,
        nic.kind(),
        nic.caps().driver
    );

    let (pd, peer_pd) = (nic.alloc_pd()?, peer_nic.alloc_pd()?);
    let (cq, peer_cq) = (nic.create_cq(16)?, peer_nic.create_cq(16)?);
    let qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    let peer_qp = peer_pd.create_qp(&peer_cq, &peer_cq, QpCaps::default())?;
    qp.connect(&peer_qp.endpoint()?)?;
    peer_qp.connect(&qp.endpoint()?)?;

    // Our buffer and the peer's. Registration is what rdma-pool does once, up front, for every
    // allocation; here it is done by hand.
    let mut mine = Buffer::new(4096)?;
    let mut theirs = Buffer::new(4096)?;
    let msg = b"zero-copy hello from rdma-pool";
    mine.as_mut_slice()[..msg.len()].copy_from_slice(msg);
    // SAFETY: both buffers outlive their regions (dropped at the end of main, after them).
    let my_mr = unsafe { pd.reg_mr(mine.as_mut_ptr(), mine.len(), Access::LOCAL_WRITE) }?;
    let remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: as above.
    let their_mr = unsafe { peer_pd.reg_mr(theirs.as_mut_ptr(), theirs.len(), remote) }?;
    println!(
        "registered: lkey {} / peer rkey {}",
        my_mr.lkey(),
        their_mr.rkey()
    );

    let wait = Duration::from_secs(5);
    qp.post_write(
        1,
        &[my_mr.sge(0, msg.len())?],
        their_mr.addr() as u64,
        their_mr.rkey(),
    )?;
    let wc = cq.wait_one(wait)?;
    println!("RDMA WRITE: {:?}", wc.status);
    println!(
        "peer memory now holds: {:?}",
        String::from_utf8_lossy(&theirs.as_slice()[..msg.len()])
    );

    mine.as_mut_slice().fill(0);
    qp.post_read(
        2,
        &[my_mr.sge(0, msg.len())?],
        their_mr.addr() as u64,
        their_mr.rkey(),
    )?;
    println!("RDMA READ: {:?}", cq.wait_one(wait)?.status);
    assert_eq!(&mine.as_slice()[..msg.len()], msg);
    println!(
        "read back: {:?}",
        String::from_utf8_lossy(&mine.as_slice()[..msg.len()])
    );

    let wrong = rdma_pool::nic::Rkey(their_mr.rkey().0 ^ 0x100);
    qp.post_write(3, &[my_mr.sge(0, 8)?], their_mr.addr() as u64, wrong)?;
    let wc = cq.wait_one(wait)?;
    println!(
        "RDMA WRITE with a wrong rkey {wrong}: {:?} (QP now {:?})",
        wc.status,
        qp.state()?
    );
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    if let Some(soft) = peer_nic.as_soft() {
        println!("peer soft NIC counters: {:?}", soft.counters());
    }
    Ok(())
}
