//! Grants: a server gives each of two clients a key to its own buffer, and nothing else. A
//! client using the other's key, a key that was revoked, or an address one byte outside its
//! grant is refused by the NIC.
//!
//! Runs on the embedded default (the soft NIC when no RDMA device is present): `cargo run
//! --example grants`. On a machine with RDMA devices it uses the first for the server and the
//! second (if any) for the clients.

use allocator_api2::vec;
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages};
use rdma_pool::grant::GrantWire;
use rdma_pool::nic::{Access, Buffer, Cq, Mr, Nic, NicKind, Pd, Qp, QpCaps, WcStatus};
use std::time::Duration;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The clients' side: a device, a PD, a CQ and a registered scratch buffer.
struct Clients {
    pd: Pd,
    cq: Cq,
    mr: Mr,
    _mem: Buffer,
}

/// One connection: the server's QP (grants are bound on it) and the client's.
struct Conn {
    server: Qp,
    client: Qp,
}

fn connect(spd: &Pd, scq: &Cq, c: &Clients) -> Res<Conn> {
    let server = spd.create_qp(scq, scq, QpCaps::default())?;
    let client = c.pd.create_qp(&c.cq, &c.cq, QpCaps::default())?;
    server.connect(&client.endpoint()?)?;
    client.connect(&server.endpoint()?)?;
    Ok(Conn { server, client })
}

/// The client WRITEs `len` bytes at `addr` with `w.rkey`, or READs them: the completion.
fn access(
    c: &Clients,
    qp: &Qp,
    write: bool,
    addr: u64,
    len: usize,
    w: &GrantWire,
) -> Res<WcStatus> {
    let sge = c.mr.sge(0, len)?;
    if write {
        // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
        unsafe { qp.post_write(1, &[sge], addr, w.rkey) }?;
    } else {
        // SAFETY: the read's memory stays allocated and unread until its completion is polled.
        unsafe { qp.post_read(1, &[sge], addr, w.rkey) }?;
    }
    Ok(c.cq.wait_one(Duration::from_secs(10))?.status)
}

fn main() -> Res<()> {
    let nic = Nic::open_default()?;
    let client_nic = match nic.kind() {
        NicKind::Soft => Nic::soft(),
        NicKind::Verbs => rdma_pool::nic::device_names()
            .into_iter()
            .find(|n| *n != nic.caps().name)
            .map_or_else(|| Ok(nic.clone()), |n| Nic::open(&n))?,
    };
    println!(
        "server on {} ({}), clients on {}",
        nic.caps().name,
        nic.caps().driver,
        client_nic.caps().name
    );

    let spd = nic.alloc_pd()?;
    let scq = nic.create_cq(64)?;
    let cfg = ArenaConfig {
        reserve: 1 << 32,
        chunk: 1 << 26,
        hugepages: Hugepages::Off,
        ..Default::default()
    };
    let pool = Pool::with_config(&spd, cfg)?;
    let mut mem = Buffer::new(4096)?;
    let cpd = client_nic.alloc_pd()?;
    // SAFETY: `mem` outlives the region (both live in `clients`, the region dropped first).
    let mr = unsafe { cpd.reg_mr(mem.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }?;
    let clients = Clients {
        cq: client_nic.create_cq(64)?,
        pd: cpd,
        mr,
        _mem: mem,
    };
    let ignore = |_| {};

    let buf_a = vec![in &pool; b'A'; 4096];
    let buf_b = vec![in &pool; b'B'; 4096];
    let (a, b) = (
        connect(&spd, &scq, &clients)?,
        connect(&spd, &scq, &clients)?,
    );
    // Grants with a write right own their buffers (the program gets them back once the keys
    // are dead), so the peer never writes memory the program reads.
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let mut ga = pool.grant_owned(buf_a, &a.server, rw).map_err(|(_, e)| e)?;
    let mut gb = pool.grant_owned(buf_b, &b.server, rw).map_err(|(_, e)| e)?;
    ga.wait(&scq, ignore)?;
    gb.wait(&scq, ignore)?;
    let (wa, wb) = (ga.wire(), gb.wire());
    println!(
        "grant A: {:?}, {} bytes at {:#x}, {} wire bytes",
        ga.kind(),
        wa.len,
        wa.addr,
        wa.to_bytes().len()
    );
    println!(
        "grant B: {:?}, {} bytes at {:#x}",
        gb.kind(),
        wb.len,
        wb.addr
    );

    let mut failures = 0;
    let mut check = |what: &str, st: WcStatus, allowed: bool| {
        let ok = (st == WcStatus::Success) == allowed;
        failures += !ok as u32;
        let verdict = if st == WcStatus::Success {
            "allowed"
        } else {
            "refused"
        };
        println!(
            "  {} {what}: {verdict} ({st:?})",
            if ok { "ok  " } else { "FAIL" }
        );
    };
    check(
        "A reads its own buffer",
        access(&clients, &a.client, false, wa.addr, 4096, &wa)?,
        true,
    );
    check(
        "B writes its own buffer",
        access(&clients, &b.client, true, wb.addr, 64, &wb)?,
        true,
    );
    // Each refusal moves both QPs of the connection to the error state, as RC does.
    check(
        "A writes one byte past its grant",
        access(&clients, &a.client, true, wa.addr + 4096, 1, &wa)?,
        false,
    );
    check(
        "B uses A's key (through its own QP)",
        access(&clients, &b.client, false, wa.addr, 64, &wa)?,
        false,
    );
    let buf_a = ga.revoke(&scq, ignore).map_err(|(_, e)| e)?;
    let buf_b = gb.revoke(&scq, ignore).map_err(|(_, e)| e)?;
    println!(
        "B's buffer back after revocation: {:?}...",
        String::from_utf8_lossy(&buf_b[..8])
    );
    // A fresh connection for A, a fresh grant, revoked: the old key is dead.
    let a2 = connect(&spd, &scq, &clients)?;
    let mut g = pool
        .grant_owned(buf_a, &a2.server, Access::REMOTE_WRITE)
        .map_err(|(_, e)| e)?;
    g.wait(&scq, ignore)?;
    let w = g.wire();
    check(
        "A writes through a live grant",
        access(&clients, &a2.client, true, w.addr, 64, &w)?,
        true,
    );
    let _buf_a = g.revoke(&scq, ignore).map_err(|(_, e)| e)?;
    check(
        "A writes with the revoked key",
        access(&clients, &a2.client, true, w.addr, 64, &w)?,
        false,
    );
    let s = pool.stats().grants;
    println!(
        "grants issued {}, revoked {}, open {}, dedicated regions {}, windows {} ({} retired)",
        s.issued, s.revoked, s.open, s.dedicated_regions, s.windows, s.windows_retired
    );
    if failures > 0 || s.open != 0 {
        return Err(format!("{failures} unexpected outcomes").into());
    }
    println!("every peer reached exactly its own buffer");
    Ok(())
}
