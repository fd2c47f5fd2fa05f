// A write grant owns its buffer: the program cannot read it while the peer may write.
use rdma_pool::Pool;
use rdma_pool::nic::{Access, Nic, QpCaps};

fn main() {
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(8).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let pool = Pool::new(&pd).unwrap();
    let buf = allocator_api2::vec![in &pool; 0u8; 64];
    let g = pool.grant_owned(buf, &qp, Access::REMOTE_WRITE).unwrap();
    println!("{}", buf[0]);
    drop(g);
}
