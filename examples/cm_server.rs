//! A tokio server on rdma_cm whose every buffer comes from the `GlobalPool`: each client gets
//! one page of the server's heap granted to it alone (an rkey only its QP can use, revoked
//! when it leaves) and a request/reply service over SEND/RECV, with no `unsafe` anywhere.
//!
//! ```text
//! RDMA_POOL_NIC=mlx5_0 cargo run --features tokio --example cm_server -- server 192.168.1.10:7471
//! RDMA_POOL_NIC=mlx5_0 cargo run --features tokio --example cm_server -- client 192.168.1.10:7471
//! ```
//! Without a role it runs the demo: a server and two clients as three processes on the
//! address in `RDMA_POOL_DEMO_ADDR` (default `10.77.0.2:7471`, the rxe test bed's), exiting 0
//! when every client got its page and its replies.

use rdma_pool::GlobalPool;
use rdma_pool::cm::{self, CmListener, CmOptions, Connection, QpSpec};
use rdma_pool::global::GlobalConfig;
use rdma_pool::grant::GrantWire;
use rdma_pool::nic::{AsyncCq, QpCaps, WcStatus};
use std::net::SocketAddr;
use std::process::Command;

/// Every `Vec`, `Box` and `String` below is NIC-registered memory, on rdma_cm's device
/// context (so rdma_cm's QPs accept the pool's PD).
#[global_allocator]
static A: GlobalPool = GlobalPool::with_config(GlobalConfig {
    open: Some(cm::open_default),
    ..GlobalConfig::DEFAULT
});

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn spec<'a>(cq: &'a AsyncCq) -> Result<QpSpec<'a>> {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    Ok(QpSpec {
        caps,
        ..QpSpec::new(A.pd()?, cq.cq())
    })
}

// ANCHOR: server
/// Accept `clients` connections (forever with `None`), each served by its own task.
async fn server(addr: SocketAddr, clients: Option<usize>) -> Result<()> {
    let listener = CmListener::bind(addr)?;
    let mut tasks = Vec::new();
    while clients.is_none_or(|n| tasks.len() < n) {
        let cq = AsyncCq::new(A.nic()?, 64)?;
        let conn = listener
            .accept_async(&spec(&cq)?, b"", &CmOptions::default())
            .await?;
        tasks.push(tokio::spawn(serve(conn, cq)));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// One client: its own page, then upper-cased replies until it leaves.
async fn serve(mut conn: Connection, cq: AsyncCq) -> Result<()> {
    let page = vec![b'#'; 4096]; // the server's heap: registered, and this client's alone
    let mut grant = A.grant(&page, conn.qp())?;
    grant.wait_async(&cq, |_| {}).await?;
    let wire = grant.wire().to_bytes().to_vec();
    conn.qp().post_send_owned(0, wire)?.wait_async(&cq).await?;
    loop {
        let mut req = conn.qp().post_recv_owned(1, vec![0u8; 256])?;
        tokio::select! {
            r = req.ready(&cq) => r?,
            r = conn.disconnected() => break r?, // the client left
        }
        let req = req.take().map_err(|_| "not complete")?;
        if req.completion.status != WcStatus::Success {
            break; // flushed: the connection is gone
        }
        let reply = req.buf.to_ascii_uppercase();
        conn.qp().post_send_owned(2, reply)?.wait_async(&cq).await?;
    }
    grant.revoke_async(&cq, |_| {}).await?; // the key is dead before the page is freed
    Ok(())
}
// ANCHOR_END: server

/// Connect, read the granted page by RDMA READ, ask twice, leave.
async fn client(addr: SocketAddr) -> Result<()> {
    let resolved = cm::resolve_async(addr, &CmOptions::default()).await?;
    let cq = AsyncCq::new(A.nic()?, 64)?;
    let conn = resolved
        .connect_async(&spec(&cq)?, b"", &CmOptions::default())
        .await?;
    let wire = conn.qp().post_recv_owned(0, vec![0u8; 64])?;
    let wire = wire.wait_async(&cq).await?;
    let wire = GrantWire::from_bytes(&wire.buf).ok_or("not a grant")?;
    let page = vec![0u8; wire.len as usize];
    let page = conn.qp().post_read_owned(1, page, wire.addr, wire.rkey)?;
    let page = page.wait_async(&cq).await?;
    if page.completion.status != WcStatus::Success || page.buf.iter().any(|&b| b != b'#') {
        return Err(format!("the granted page: {:?}", page.completion).into());
    }
    for word in ["hello", "rdma-pool"] {
        let reply = conn.qp().post_recv_owned(2, vec![0u8; 256])?;
        let sent = conn.qp().post_send_owned(3, word.as_bytes().to_vec())?;
        sent.wait_async(&cq).await?;
        let reply = reply.wait_async(&cq).await?;
        if reply.buf != word.to_ascii_uppercase().as_bytes() {
            return Err(format!("reply {:?} to {word}", reply.buf).into());
        }
    }
    println!("client {:?}: page read, 2 replies", conn.local_addr());
    conn.disconnect()?;
    Ok(())
}

/// Three processes: a server for two clients, and the two clients.
fn demo() -> Result<()> {
    let addr: SocketAddr = std::env::var("RDMA_POOL_DEMO_ADDR")
        .unwrap_or_else(|_| "10.77.0.2:7471".into())
        .parse()?;
    // The device that has the address: the children's pools must be on it.
    let device = match CmListener::bind(addr).map(|l| l.nic()) {
        Ok(Some(nic)) => nic.caps().name.clone(),
        other => {
            println!("cm_server demo: no RDMA device has {addr} ({other:?}); nothing to run");
            return Ok(());
        }
    };
    let me = std::env::current_exe()?;
    let run = |role: &str| {
        Command::new(&me)
            .args([role, &addr.to_string()])
            .env("RDMA_POOL_NIC", &device)
            .spawn()
    };
    let server = Command::new(&me)
        .args(["server", &addr.to_string(), "2"])
        .env("RDMA_POOL_NIC", &device)
        .spawn()?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    let clients = [run("client")?, run("client")?];
    // A watchdog: a stuck process fails the demo instead of hanging it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut ok = true;
    for mut p in clients.into_iter().chain([server]) {
        loop {
            if let Some(status) = p.try_wait()? {
                ok &= status.success();
                break;
            }
            if std::time::Instant::now() > deadline {
                let _ = p.kill();
                ok = false;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    if !ok {
        return Err("a server or client process failed or hung".into());
    }
    println!("cm_server demo on {device} {addr}: server and 2 clients passed");
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Runtime::new()?;
    match args.first().map(String::as_str) {
        Some("server") => {
            let addr = args.get(1).ok_or("server ADDR [CLIENTS]")?.parse()?;
            let n = args.get(2).map(|n| n.parse()).transpose()?;
            rt.block_on(server(addr, n))
        }
        Some("client") => rt.block_on(client(args.get(1).ok_or("client ADDR")?.parse()?)),
        // No role (or a test harness's arguments): the demo.
        _ => demo(),
    }
}
