//! A small RDMA service whose global allocator is the pool: its ordinary `String`s and `Vec`s
//! are posted as-is — as the local source of RDMA WRITEs and the local target of RDMA READs —
//! to a peer, with no registration call and no `unsafe` anywhere in the service's code: each
//! buffer travels with its work request and comes back with the completion. The peer (another
//! machine in real life: here a second device, or the same verbs device) exposes a landing
//! zone registered the usual way.
//!
//! Run with `cargo run --example global_allocator` (the soft NIC when no RDMA device is present;
//! `RDMA_POOL_NIC=soft|verbs|<device>` picks one, `RUST_LOG=info` shows the choice).

use rdma_pool::GlobalPool;
use rdma_pool::nic::{Access, Buffer, Nic, NicKind, QpCaps, WcStatus};
use std::collections::HashMap;
use std::time::Duration;

#[global_allocator]
static A: GlobalPool = GlobalPool::new();

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

    // WRITE them to the peer, as they are: each one travels with its request and comes back.
    let greeting = greeting.into_bytes();
    let big = index.remove("key-63").expect("inserted above");
    let mut off = 0u64;
    let mut sent = Vec::new();
    for (id, bytes) in [(1, greeting), (2, big), (3, table)] {
        let len = bytes.len() as u64;
        let done = qp
            .post_write_owned(id, bytes, raddr + off, rkey)?
            .wait(wait)?;
        assert_eq!(done.completion.status, WcStatus::Success);
        off += len;
        sent.push(done.buf);
    }
    let landed = &landing.as_slice()[..off as usize];
    assert_eq!(landed, sent.concat());
    println!(
        "WRITE: a String ({} B), a HashMap value ({} B) and a Vec ({} B) landed at the peer",
        sent[0].len(),
        sent[1].len(),
        sent[2].len()
    );
    index.insert("key-63".into(), sent.swap_remove(1));

    // READ the peer's bytes back into a fresh Vec.
    let back = vec![0u8; off as usize];
    let mut back = qp.post_read_owned(4, back, raddr, rkey)?.wait(wait)?.buf;
    assert_eq!(&back[..], landed);
    back.truncate(sent[0].len());
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
