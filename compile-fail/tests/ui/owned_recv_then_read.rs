// An owned receive takes the buffer: the program cannot read it until the completion gives it
// back.
use rdma_pool::nic::{Nic, QpCaps};

fn main() {
    let nic = Nic::soft();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(8).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let buf = vec![0u8; 64];
    let posted = qp.post_recv_owned(1, buf).unwrap();
    println!("{}", buf[0]);
    drop(posted);
}
