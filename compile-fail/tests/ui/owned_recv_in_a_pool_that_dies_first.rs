// A buffer of a pool that does not outlive the request cannot be posted: the handle could be
// leaked and the pool dropped while the NIC writes.
use rdma_pool::Pool;
use rdma_pool::nic::{Nic, QpCaps};

fn main() {
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(8).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let pool = Pool::new(&pd).unwrap();
    let posted = qp.post_recv_owned(1, allocator_api2::vec![in &pool; 0u8; 64]);
    drop(posted);
}
