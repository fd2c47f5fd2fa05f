// An owned grant hands out no `&mut Grant`: two could be swapped, and revoking one would give
// back a buffer whose key still works.
use rdma_pool::Pool;
use rdma_pool::nic::{Access, Nic, QpCaps};

fn main() {
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(8).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let pool = Pool::new(&pd).unwrap();
    let w = Access::REMOTE_WRITE;
    let mut a = pool.grant_owned(allocator_api2::vec![in &pool; 0u8; 64], &qp, w).unwrap();
    let mut b = pool.grant_owned(allocator_api2::vec![in &pool; 0u8; 64], &qp, w).unwrap();
    std::mem::swap(&mut *a, &mut *b);
}
