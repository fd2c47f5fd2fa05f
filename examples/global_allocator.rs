//! A small RDMA service whose global allocator is the pool: its ordinary `String`s and `Vec`s
//! are posted as-is — as the local source of RDMA WRITEs and the local target of RDMA READs —
//! to a peer, with no registration call anywhere in the service's code. The peer (another
//! machine in real life: here a second device, or the same verbs device) exposes a landing
//! zone registered the usual way.
//!
//! Run with `cargo run --example global_allocator` (the soft NIC when no RDMA device is present;
//! `RDMA_POOL_NIC=soft|verbs|<device>` picks one, `RUST_LOG=info` shows the choice).

use rdma_pool::GlobalPool;
use rdma_pool::nic::{Access, Buffer, Nic, NicKind, QpCaps, Sge, WcStatus};
use std::collections::HashMap;
use std::time::Duration;

#[global_allocator]
static A: GlobalPool = GlobalPool::new();

/// One SGE over `bytes`, with the lkey `rdma_pool::keys_of` finds for any heap pointer.
fn sge(bytes: &[u8]) -> Sge {
    let keys = rdma_pool::keys_of(bytes.as_ptr()).expect("every heap block is registered");
    assert!(keys.contains(bytes.as_ptr() as usize, bytes.len()));
    Sge {
        addr: bytes.as_ptr() as u64,
        length: bytes.len() as u32,
        lkey: keys.lkey,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    // The pool's own NIC and PD: QPs there can post any heap buffer with its lkey.
    let (nic, pd) = (A.nic()?, A.pd()?);
    let cq = nic.create_cq(64)?;
    let qp = pd.create_qp(&cq, &cq, QpCaps::default())?;

    // The peer and its landing zone.
    let peer_nic = match nic.kind() {
        NicKind::Soft => Nic::soft(),
        _ => nic.clone(),
    };
    let peer_pd = peer_nic.alloc_pd()?;
    let peer_cq = peer_nic.create_cq(64)?;
    let peer_qp = peer_pd.create_qp(&peer_cq, &peer_cq, QpCaps::default())?;
    qp.connect(&peer_qp.endpoint()?)?;
    peer_qp.connect(&qp.endpoint()?)?;
    let mut landing = Buffer::new(4 << 20)?;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: `landing` outlives its region.
    let landing_mr = unsafe { peer_pd.reg_mr(landing.as_mut_ptr(), landing.len(), rw) }?;
    let (raddr, rkey) = (landing_mr.addr() as u64, landing_mr.rkey());
    let wait = Duration::from_secs(10);

    // Ordinary heap data of the service, built the ordinary way.
    let greeting = format!(
        "hello from pid {} over {}",
        std::process::id(),
        nic.caps().name
    );
    let mut index: HashMap<String, Vec<u8>> = HashMap::new();
    for i in 0..64u32 {
        index.insert(
            format!("key-{i}"),
            i.to_le_bytes().repeat(1 + i as usize * 97),
        );
    }
    let table: Vec<u8> = (0..(2u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();

    // WRITE them to the peer, as they are.
    let mut off = 0u64;
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { qp.post_write(1, &[sge(greeting.as_bytes())], raddr, rkey) }?;
    assert_eq!(cq.wait_one(wait)?.status, WcStatus::Success);
    off += greeting.len() as u64;
    let big = index.get("key-63").expect("inserted above");
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { qp.post_write(2, &[sge(big)], raddr + off, rkey) }?;
    assert_eq!(cq.wait_one(wait)?.status, WcStatus::Success);
    off += big.len() as u64;
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { qp.post_write(3, &[sge(&table)], raddr + off, rkey) }?;
    assert_eq!(cq.wait_one(wait)?.status, WcStatus::Success);
    off += table.len() as u64;
    let landed = &landing.as_slice()[..off as usize];
    assert_eq!(&landed[..greeting.len()], greeting.as_bytes());
    assert_eq!(&landed[landed.len() - table.len()..], &table[..]);
    println!(
        "WRITE: a String ({} B), a HashMap value ({} B) and a Vec ({} B) landed at the peer",
        greeting.len(),
        big.len(),
        table.len()
    );

    // READ the peer's bytes back into a fresh Vec.
    let mut back = vec![0u8; off as usize];
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe { qp.post_read(4, &[sge(&back)], raddr, rkey) }?;
    assert_eq!(cq.wait_one(wait)?.status, WcStatus::Success);
    assert_eq!(&back[..], landed);
    back.truncate(greeting.len());
    println!("READ into a Vec: {:?}", String::from_utf8(back)?);

    let stats = rdma_pool::stats().expect("the pool is the global allocator");
    let pool = stats.pool.as_ref().expect("ready");
    println!(
        "pool: {:?}, {} MiB committed in {} registrations ({:?}: {}); {} allocations served \
         while provisioning (bootstrap), {} degraded, {} MiB unregistered",
        stats.state,
        pool.arena.committed_bytes >> 20,
        pool.arena.mrs,
        pool.arena.mode,
        pool.arena.mode_reason.as_str(),
        stats.reentrant_allocations,
        stats.degraded_allocations,
        pool.arena.unregistered_bytes >> 20
    );
    Ok(())
}
