//! One pool across two rails: every buffer of the pool is registered on two NICs at once, and
//! one 8 MiB buffer is striped across both, half of it WRITTEN through each NIC, with no
//! `reg_mr` in user code.
//!
//! `cargo run --example two_rails` runs on two soft NICs. `RDMA_POOL_RAILS=rxe0,rxe1 cargo run
//! --example two_rails` runs on two verbs devices (the QEMU test bed runs it on Soft-RoCE's
//! `rxe0` and `rxe1`). Each rail's peer lives on the other device, as in a two-host bed.

use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages};
use rdma_pool::nic::{Access, Buffer, Cq, Mr, Nic, Pd, Qp, QpCaps, Sge, WcStatus};
use std::time::Duration;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const LEN: usize = 8 << 20;

/// One rail: the pool's QP on the device, and a peer (on the other device) with a buffer it
/// registered for the pool to WRITE into.
struct Rail {
    nic: Nic,
    cq: Cq,
    qp: Qp,
    peer_cq: Cq,
    _peer_qp: Qp,
    peer_mr: Mr,
    peer_mem: Buffer,
}

fn rail(nic: &Nic, pd: &Pd, peer_nic: &Nic, peer_pd: &Pd) -> Res<Rail> {
    let cq = nic.create_cq(64)?;
    let peer_cq = peer_nic.create_cq(64)?;
    let qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    let peer_qp = peer_pd.create_qp(&peer_cq, &peer_cq, QpCaps::default())?;
    qp.connect(&peer_qp.endpoint()?)?;
    peer_qp.connect(&qp.endpoint()?)?;
    let mut peer_mem = Buffer::new(LEN / 2)?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    // SAFETY: `peer_mem` lives as long as the region (both are dropped with the `Rail`, the
    // region first: fields drop in order).
    let peer_mr = unsafe { peer_pd.reg_mr(peer_mem.as_mut_ptr(), peer_mem.len(), access)? };
    Ok(Rail {
        nic: nic.clone(),
        cq,
        qp,
        peer_cq,
        _peer_qp: peer_qp,
        peer_mr,
        peer_mem,
    })
}

fn open_rails() -> Res<(Nic, Nic)> {
    match std::env::var("RDMA_POOL_RAILS") {
        Ok(names) => {
            let mut it = names.split(',');
            let a = it.next().ok_or("RDMA_POOL_RAILS names two devices")?;
            let b = it.next().ok_or("RDMA_POOL_RAILS names two devices")?;
            Ok((Nic::open(a)?, Nic::open(b)?))
        }
        Err(_) => Ok((Nic::soft(), Nic::soft())),
    }
}

fn main() -> Res<()> {
    let (n0, n1) = open_rails()?;
    let (pd0, pd1) = (n0.alloc_pd()?, n1.alloc_pd()?);
    let cfg = ArenaConfig {
        reserve: 1 << 32,
        chunk: 1 << 26,
        hugepages: Hugepages::Prefer,
        ..Default::default()
    };
    let pool = Pool::with_config(&pd0, cfg)?;
    // A buffer made before the second rail exists: attaching registers it there too.
    let mut data = allocator_api2::vec![in &pool; 0u8; LEN];
    pool.attach(&pd1)?;
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    for nic in [&n0, &n1] {
        let k = pool
            .keys_of_on(data.as_ptr(), nic)
            .ok_or("a rail without keys")?;
        println!(
            "{:>6}: lkey {:#010x} over {} MiB at {:#x}",
            nic.caps().name,
            k.lkey.0,
            k.len >> 20,
            k.addr
        );
    }
    // Each rail's peer sits on the other device.
    let rails = [rail(&n0, &pd0, &n1, &pd1)?, rail(&n1, &pd1, &n0, &pd0)?];
    let half = LEN / 2;
    for (r, rl) in rails.iter().enumerate() {
        let part = &data[r * half..(r + 1) * half];
        let sge: Sge = pool.sge_of_on(part, &rl.nic)?;
        // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
        unsafe {
            rl.qp.post_write(
                r as u64,
                &[sge],
                rl.peer_mr.addr() as u64,
                rl.peer_mr.rkey(),
            )
        }?;
    }
    for (r, rl) in rails.iter().enumerate() {
        let wc = rl.cq.wait_one(Duration::from_secs(30))?;
        if wc.status != WcStatus::Success {
            return Err(format!("rail {r}: WRITE completed with {:?}", wc.status).into());
        }
        let _ = rl.peer_cq.poll_one()?;
        let want = &data[r * half..(r + 1) * half];
        if rl.peer_mem.as_slice() != want {
            return Err(format!("rail {r}: the peer got the wrong bytes").into());
        }
        println!(
            "rail {r} ({}): {} MiB WRITTEN and checked",
            rl.nic.caps().name,
            half >> 20
        );
    }
    for s in pool.stats().rails {
        println!(
            "attached rail {} ({}): {:?} ({}), {} MiB registered in {} regions",
            s.index,
            s.device,
            s.mode,
            s.mode_reason.as_str(),
            s.registered_bytes >> 20,
            s.mrs
        );
    }
    drop(rails);
    drop(data);
    pool.detach(&pd1)?;
    println!("detached {}: rail 0's keys unchanged", n1.caps().name);
    Ok(())
}
