//! Network buffers from a `Pool`: `allocator_api2::vec::Vec::new_in(pool)` gives memory that
//! is registered already, so a `Vec` is posted as-is — as the local source of RDMA WRITEs and
//! the local target of RDMA READs — between two peers on the soft NIC, with no `unsafe`: the
//! `Vec` travels with its work request and comes back with the completion (the pool lives for
//! the program, as a buffer of a posted request may outlive any scope). No `reg_mr` per buffer: the soft NIC's counters show the registrations the pool made
//! for its slabs, not one per buffer.
//!
//! Run with `cargo run --example vec_new_in`.

use allocator_api2::vec::Vec;
use rdma_pool::Pool;
use rdma_pool::nic::{Access, Buffer, Nic, QpCaps, WcStatus};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (nic, peer_nic) = (Nic::soft(), Nic::soft());
    let (pd, peer_pd) = (nic.alloc_pd()?, peer_nic.alloc_pd()?);
    let (cq, peer_cq) = (nic.create_cq(64)?, peer_nic.create_cq(64)?);
    let qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    let peer_qp = peer_pd.create_qp(&peer_cq, &peer_cq, QpCaps::default())?;
    qp.connect(&peer_qp.endpoint()?)?;
    peer_qp.connect(&qp.endpoint()?)?;

    // The peer's landing zone, registered the usual way.
    let mut landing = Buffer::new(1 << 16)?;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: `landing` outlives its region.
    let landing_mr = unsafe { peer_pd.reg_mr(landing.as_mut_ptr(), landing.len(), rw) }?;

    let pool: &'static Pool = Box::leak(Box::new(Pool::new(&pd)?));
    let wait = Duration::from_secs(5);
    let mut offset = 0u64;
    for (i, text) in ["first message", "a second, longer message", "third"]
        .iter()
        .enumerate()
    {
        // A network buffer is just a Vec in the pool.
        let mut msg: Vec<u8, &Pool> = Vec::new_in(pool);
        msg.extend_from_slice(text.as_bytes());
        let lkey = pool.sge_of(&msg)?.lkey;
        let raddr = landing_mr.addr() as u64 + offset;
        let done = qp
            .post_write_owned(i as u64, msg, raddr, landing_mr.rkey())?
            .wait(wait)?;
        assert_eq!(done.completion.status, WcStatus::Success);
        println!(
            "WRITE from Vec at {:p} (lkey {lkey}): {text:?}",
            done.buf.as_ptr()
        );
        offset += done.buf.len() as u64;
    }
    let written = &landing.as_slice()[..offset as usize];
    println!("peer memory: {:?}", String::from_utf8_lossy(written));

    // And the other way: READ the peer's bytes into a Vec of the pool.
    let mut back: Vec<u8, &Pool> = Vec::new_in(pool);
    back.resize(offset as usize, 0);
    let back = qp
        .post_read_owned(9, back, landing_mr.addr() as u64, landing_mr.rkey())?
        .wait(wait)?
        .buf;
    assert_eq!(&back[..], written);
    println!(
        "READ into Vec at {:p}: {:?}",
        back.as_ptr(),
        String::from_utf8_lossy(&back)
    );
    let regs = nic.as_soft().map(|s| s.counters().registrations);
    println!(
        "registrations on our NIC: {regs:?} (the pool's slabs), buffers posted: 4, pool: {} live blocks",
        pool.live_blocks()
    );
    Ok(())
}
