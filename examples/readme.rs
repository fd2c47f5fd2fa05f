// examples/readme.rs: cargo run --example readme
use rdma_pool::nic::{Access, QpCaps, WcStatus};
use std::time::Duration;

#[global_allocator] // every heap allocation of the program is NIC-registered memory
static A: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The pool's device (a verbs device if there is one, else the in-process soft NIC) and
    // its protection domain: a QP created there can post any heap buffer as it is.
    let (nic, pd) = (A.nic()?, A.pd()?);
    let cq = nic.create_cq(16)?;
    let client = pd.create_qp(&cq, &cq, QpCaps::default())?;
    let server = pd.create_qp(&cq, &cq, QpCaps::default())?; // the peer: here, in-process
    client.connect(&server.endpoint()?)?;
    server.connect(&client.endpoint()?)?;

    // The server grants the client a key to one page of its heap, usable through `server` only.
    let page = vec![0u8; 4096];
    let mut grant = A
        .grant_owned(page, &server, Access::REMOTE_WRITE)
        .map_err(|(_, e)| e)?;
    grant.wait(&cq, |_| {})?; // the memory window is bound
    let wire = grant.wire(); // addr, len, rkey: what a server sends its client

    // The client WRITEs an ordinary Vec<u8> there: no ibv_reg_mr, no unsafe.
    let record = format!("order {} filled at {}", 42, 17.5).into_bytes();
    let write = client.post_write_owned(1, record, wire.addr, wire.rkey)?;
    let done = write.wait(Duration::from_secs(5))?; // the completion, and the Vec back
    assert_eq!(done.completion.status, WcStatus::Success);

    let page = grant.revoke(&cq, |_| {}).map_err(|(_, e)| e)?; // the key dies, the page is back
    println!("{}", String::from_utf8_lossy(&page[..done.buf.len()]));
    Ok(())
}
