// A pool's rail is detached only through `Pool::detach`, which holds grants off and refuses a
// PD with open grants: the arena's own detach, reached through `Deref` to the core, would free
// the rail's regions under a grant being issued (found by the hostile review of #42).
use rdma_pool::Pool;
use rdma_pool::nic::Nic;

fn main() {
    let pool = Pool::new(&Nic::soft().alloc_pd().unwrap()).unwrap();
    let rail = Nic::soft().alloc_pd().unwrap();
    pool.attach(&rail).unwrap();
    let _ = pool.arena().detach(&rail);
}
