//! Quick start: two in-process peers on the embedded default NIC (the soft NIC when no RDMA
//! device is present). Take a buffer from the pool's arena — registered up front, nothing to
//! register per buffer — RDMA WRITE it into the peer, READ it back, and watch the peer be
//! refused when it tries the pool's own rkey.
//!
//! Run with `cargo run --example quickstart` (or `bash scripts/demo.sh`).

use rdma_pool::arena::{Arena, ArenaConfig};
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

    // Our buffer comes from the arena: registered when its slab was committed, so it is
    // NIC-ready as it is. The peer registers its buffer by hand.
    let arena = Arena::new(
        &pd,
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 26,
            ..Default::default()
        },
    )?;
    let run = arena.alloc_run(4096, 4096)?;
    // SAFETY: the run is ours, mapped and registered while the arena lives.
    let mine = unsafe { std::slice::from_raw_parts_mut(run.as_ptr(), 4096) };
    let msg = b"zero-copy hello from rdma-pool";
    mine[..msg.len()].copy_from_slice(msg);
    let keys = arena.keys_of(mine.as_ptr()).expect("arena memory has keys");
    let mut theirs = Buffer::new(4096)?;
    let remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: `theirs` outlives its region (dropped at the end of main, after it).
    let their_mr = unsafe { peer_pd.reg_mr(theirs.as_mut_ptr(), theirs.len(), remote) }?;
    println!(
        "arena buffer at {:p}: lkey {} (region of {} KiB) / peer rkey {}",
        mine.as_ptr(),
        keys.lkey,
        keys.len >> 10,
        their_mr.rkey()
    );

    let wait = Duration::from_secs(5);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        qp.post_write(
            1,
            &[arena.sge_of(&mine[..msg.len()])?],
            their_mr.addr() as u64,
            their_mr.rkey(),
        )
    }?;
    let wc = cq.wait_one(wait)?;
    println!("RDMA WRITE: {:?}", wc.status);
    println!(
        "peer memory now holds: {:?}",
        String::from_utf8_lossy(&theirs.as_slice()[..msg.len()])
    );

    mine.fill(0);
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe {
        qp.post_read(
            2,
            &[arena.sge_of(&mine[..msg.len()])?],
            their_mr.addr() as u64,
            their_mr.rkey(),
        )
    }?;
    println!("RDMA READ: {:?}", cq.wait_one(wait)?.status);
    assert_eq!(&mine[..msg.len()], msg);
    println!(
        "read back: {:?}",
        String::from_utf8_lossy(&mine[..msg.len()])
    );

    // The pool's own regions carry no remote rights: its rkey gives a peer nothing (peers
    // reach pool memory only through per-buffer grants).
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe { peer_qp.post_read(3, &[their_mr.sge(0, 8)?], mine.as_ptr() as u64, keys.rkey) }?;
    let wc = peer_cq.wait_one(wait)?;
    println!(
        "peer RDMA READ of our buffer with the pool's rkey {}: {:?} (peer QP now {:?})",
        keys.rkey,
        wc.status,
        peer_qp.state()?
    );
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    println!("arena: {:?}", arena.stats());
    if let Some(soft) = peer_nic.as_soft() {
        println!("peer soft NIC counters: {:?}", soft.counters());
    }
    Ok(())
}
