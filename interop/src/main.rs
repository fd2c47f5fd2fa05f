//! sideway owns the connection, rdma-pool the memory: an interop example run as two processes.
//!
//! The server opens its device, PD, CQ and RC QP with `sideway` and connects the QP with
//! sideway's own calls; rdma-pool adopts them (`Nic::from_raw_context`, `Pd::from_raw`,
//! `Cq::from_raw`, `Qp::from_raw`), builds a `Pool` on the PD and grants one buffer to the
//! client through a type 2 window bound on sideway's QP. sideway keeps polling the CQ; every
//! completion it polls is handed to rdma-pool with `Cq::deliver`, which takes the grant's own.
//! The client is sideway only: it READs the granted bytes with the key, and after the
//! revocation sees the key refused.
//!
//! ```text
//! cargo run -p rdma-pool-interop                        # the demo: server here, client child
//! SIDEWAY_SERVER_DEV=mlx5_0 SIDEWAY_CLIENT_DEV=mlx5_1 cargo run -p rdma-pool-interop
//! ```
//! The two processes exchange their QP numbers and GIDs (and the grant) over the child's
//! stdin and stdout. Without an RDMA device the demo says so and exits 0.

use rdma_pool::Pool;
use rdma_pool::grant::GrantWire;
use rdma_pool::nic::{self, Completion, Nic, Rkey, WcOpcode, WcStatus};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionQueue, GenericCompletionQueue};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// sideway's objects of one side.
struct Side {
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    cq: Arc<BasicCompletionQueue>,
    qp: BasicQueuePair,
}

impl Side {
    fn open(dev: &str) -> Result<Option<Side>> {
        let Ok(list) = DeviceList::new() else {
            return Ok(None);
        };
        let Some(device) = list.iter().find(|d| d.name() == dev) else {
            return Ok(None);
        };
        let ctx = device.open()?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq_builder().setup_cqe(64).build()?;
        let handle = GenericCompletionQueue::from(Arc::clone(&cq));
        let mut builder = pd.create_qp_builder();
        let mut qp = builder
            .setup_max_send_wr(16)
            .setup_max_recv_wr(16)
            .setup_send_cq(handle.clone())
            .setup_recv_cq(handle)
            .build()?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(1)
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite,
            );
        qp.modify(&attr)?;
        Ok(Some(Side { ctx, pd, cq, qp }))
    }

    /// "qpn gid-hex" of this side.
    fn endpoint(&self) -> Result<String> {
        let gid = self.ctx.query_gid(1, 0)?;
        let hex: String = gid.raw.iter().map(|b| format!("{b:02x}")).collect();
        Ok(format!("{} {hex}", self.qp.qp_number()))
    }

    /// Connect to "qpn gid-hex" with sideway's calls (RTR, RTS).
    fn connect(&mut self, remote: &str) -> Result<()> {
        let mut it = remote.split_whitespace();
        let qpn: u32 = it.next().ok_or("no qpn")?.parse()?;
        let hex = it.next().ok_or("no gid")?;
        let mut raw = [0u8; 16];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
        }
        let gid = Gid { raw };
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(Mtu::Mtu1024)
            .setup_dest_qp_num(qpn)
            .setup_rq_psn(qpn & 0xff_ffff)
            .setup_max_dest_read_atomic(1)
            .setup_min_rnr_timer(12);
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(0)
            .setup_port(1)
            .setup_service_level(0)
            .setup_grh_src_gid_index(0)
            .setup_grh_dest_gid(&gid)
            .setup_grh_hop_limit(1);
        attr.setup_address_vector(&ah);
        self.qp.modify(&attr)?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.qp.qp_number() & 0xff_ffff)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(1);
        self.qp.modify(&attr)?;
        Ok(())
    }

    /// Poll with sideway until `done`; each completion goes through `each` first.
    fn poll_until(
        &self,
        mut each: impl FnMut(u64, u32, u32, u32),
        mut done: impl FnMut() -> bool,
    ) -> Result<()> {
        let end = Instant::now() + Duration::from_secs(20);
        while !done() {
            if let Ok(mut poller) = self.cq.start_poll() {
                // sideway's poller must end its poll when dropped: no `for` over a borrow.
                #[allow(clippy::while_let_on_iterator)]
                while let Some(wc) = poller.next() {
                    each(wc.wr_id(), wc.status(), wc.opcode(), wc.byte_len());
                }
            }
            if Instant::now() > end {
                return Err("timed out polling".into());
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// The opcode a sideway completion reports, as rdma-pool's.
fn opcode(raw: u32) -> WcOpcode {
    match raw {
        0 => WcOpcode::Send,
        1 => WcOpcode::RdmaWrite,
        2 => WcOpcode::RdmaRead,
        5 => WcOpcode::BindMw,
        6 => WcOpcode::LocalInv,
        128 => WcOpcode::Recv,
        other => WcOpcode::Other(other),
    }
}

fn server(dev: &str, client_dev: &str) -> Result<()> {
    let Some(mut side) = Side::open(dev)? else {
        println!("sideway_interop: no device {dev}; nothing to run");
        return Ok(());
    };
    let me = std::env::current_exe()?;
    let mut child = Command::new(me)
        .args(["client", client_dev])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut to_client = child.stdin.take().ok_or("no stdin")?;
    let mut from_client = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut line = String::new();
    let mut read_line = |line: &mut String| -> Result<String> {
        line.clear();
        from_client.read_line(line)?;
        Ok(line.trim().to_owned())
    };

    // sideway connects the QP.
    writeln!(to_client, "{}", side.endpoint()?)?;
    side.connect(&read_line(&mut line)?)?;

    // rdma-pool adopts sideway's objects: nothing is destroyed twice, they stay sideway's.
    // SAFETY: `side` outlives every rdma-pool handle below (dropped at the end of this fn,
    // after them: they are declared later).
    let (nic, pd, cq, qp) = unsafe {
        let nic = Nic::from_raw_context(side.ctx.context().as_ptr().cast())?;
        let pd = nic::Pd::from_raw(&nic, side.pd.pd().as_ptr().cast())?;
        let cq = nic::Cq::from_raw(&nic, side.cq.cq().as_ptr().cast())?;
        let qp = nic::Qp::from_raw(&pd, side.qp.qp().as_ptr().cast(), &cq, &cq)?;
        (nic, pd, cq, qp)
    };
    let pool = Pool::new(&pd)?;
    let buf = allocator_api2::vec![in &pool; b'S'; 4096];
    let mut grant = pool.grant(&buf, &qp)?;
    // sideway polls; rdma-pool takes its own completions (the bind) through `deliver`.
    let qpn = qp.qpn();
    let deliver = |wr_id, status, op, byte_len| {
        let wc = Completion {
            wr_id,
            status: WcStatus::from_raw(status),
            opcode: opcode(op),
            byte_len,
            qp_num: qpn,
            ..Completion::default()
        };
        // SAFETY: a completion sideway polled from this CQ, handed over once.
        if !unsafe { cq.deliver(&wc) } {
            eprintln!("server: an application completion {wc:?}");
        }
    };
    side.poll_until(deliver, || pool.stats().grants.wrs_in_flight == 0)?;
    let w = grant.wire();
    writeln!(to_client, "grant {} {} {}", w.addr, w.len, w.rkey.0)?;
    let said = read_line(&mut line)?;
    if said != "read SSSS" {
        return Err(format!("the client read {said:?}").into());
    }
    // Revoke: the invalidation is posted on sideway's QP, its completion polled by sideway.
    grant.start_revoke()?;
    side.poll_until(deliver, || grant.is_revoked())?;
    writeln!(to_client, "revoked")?;
    let said = read_line(&mut line)?;
    if !said.starts_with("refused") {
        return Err(format!("after the revocation the client says {said:?}").into());
    }
    drop(to_client);
    if !child.wait()?.success() {
        return Err("the client failed".into());
    }
    // rdma-pool's handles go before sideway's objects.
    drop(grant);
    drop(buf);
    drop(pool);
    drop((qp, cq, pd, nic));
    println!("sideway_interop on {dev}/{client_dev}: the grant worked, its revocation held");
    Ok(())
}

/// The client: sideway only. Talks over stdin/stdout; logs go to stderr.
fn client(dev: &str) -> Result<()> {
    let mut side = Side::open(dev)?.ok_or("no client device")?;
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut next = || -> Result<String> { Ok(lines.next().ok_or("server gone")??) };
    let server_ep = next()?;
    println!("{}", side.endpoint()?);
    std::io::stdout().flush()?;
    side.connect(&server_ep)?;
    let mut mem = vec![0u8; 4096];
    // SAFETY: `mem` outlives the region (dropped after it, at the end of this fn).
    let mr = unsafe {
        side.pd
            .reg_mr(mem.as_mut_ptr() as usize, 4096, AccessFlags::LocalWrite)?
    };
    let grant = next()?;
    let mut it = grant.split_whitespace().skip(1);
    let wire = GrantWire {
        addr: it.next().ok_or("addr")?.parse()?,
        len: it.next().ok_or("len")?.parse()?,
        rkey: Rkey(it.next().ok_or("rkey")?.parse()?),
    };
    let read = |side: &mut Side, mem: &mut Vec<u8>, id: u64| -> Result<u32> {
        let mut guard = side.qp.start_post_send();
        let wr = guard
            .construct_wr(id, WorkRequestFlags::Signaled)
            .setup_read(wire.rkey.0, wire.addr);
        // SAFETY: `mem` is registered in `mr` and untouched until the completion is polled.
        unsafe { wr.setup_sge(mr.lkey(), mem.as_mut_ptr() as u64, 4) };
        guard.post()?;
        let status = std::cell::Cell::new(None);
        side.poll_until(|_, s, _, _| status.set(Some(s)), || status.get().is_some())?;
        Ok(status.get().unwrap_or(u32::MAX))
    };
    let status = read(&mut side, &mut mem, 1)?;
    if status != 0 {
        return Err(format!("the READ through the grant failed with status {status}").into());
    }
    println!("read {}", String::from_utf8_lossy(&mem[..4]));
    std::io::stdout().flush()?;
    if next()? != "revoked" {
        return Err("expected the revocation".into());
    }
    let status = read(&mut side, &mut mem, 2)?;
    println!(
        "{} {status}",
        if status != 0 { "refused" } else { "accepted" }
    );
    std::io::stdout().flush()?;
    drop(mr);
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("client") {
        return client(args.get(1).map(String::as_str).unwrap_or("rxe1"));
    }
    // No role (or a test harness's arguments): the demo, server here, client as a child.
    let dev = std::env::var("SIDEWAY_SERVER_DEV").unwrap_or_else(|_| "rxe0".into());
    let client_dev = std::env::var("SIDEWAY_CLIENT_DEV").unwrap_or_else(|_| "rxe1".into());
    server(&dev, &client_dev)
}
