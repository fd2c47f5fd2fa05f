// A raw receive lets the NIC write memory the program may free: it is `unsafe`.
use rdma_pool::Pool;
use rdma_pool::nic::{Nic, QpCaps};

fn main() {
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(8).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let pool = Pool::new(&pd).unwrap();
    let rb = allocator_api2::vec![in &pool; 0u8; 64];
    qp.post_recv(1, &[pool.sge_of(&rb).unwrap()]).unwrap();
    drop(rb);
}
