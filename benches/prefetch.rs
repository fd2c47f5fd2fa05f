//! What ODP prefetch saves a peer, in one run (read the ratio): a burst of RDMA WRITEs (64 KiB
//! into each of 8 buffers) into fresh pool memory — purged and handed out again before every
//! burst — on an ODP pool,
//!
//! - `odp_write_burst/no_prefetch`: the NIC faults every page in during the burst;
//! - `odp_write_burst/prefetched`: the pool prefetched the memory (`advise_mr`, FLUSH) when it
//!   revived it, outside the timed burst.
//!
//! Soft NIC with a simulated NIC page-fault cost of 20 µs (hardware: tens of µs to ms); the
//! faults per burst are printed at the end.

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages, Registration};
use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};
use rdma_pool::nic::{Access, Buffer, Nic, QpCaps, WcStatus};
use std::alloc::Layout;
use std::time::Duration;

const BUFS: usize = 8;
const BURST: usize = 64 << 10;

fn soft() -> Nic {
    Nic::soft_with(SoftConfig {
        memlock: MemlockLimit::Unlimited,
        fault_cost: Duration::from_micros(20),
        ..Default::default()
    })
}

fn bursts(c: &mut Criterion) {
    let (server, client) = (soft(), soft());
    let pd = server.alloc_pd().expect("a PD");
    let cq = server.create_cq(16).expect("a CQ");
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).expect("a QP");
    let cpd = client.alloc_pd().expect("a PD");
    let ccq = client.create_cq(64).expect("a CQ");
    let peer = cpd.create_qp(&ccq, &ccq, QpCaps::default()).expect("a QP");
    qp.connect(&peer.endpoint().expect("endpoint"))
        .expect("connect");
    peer.connect(&qp.endpoint().expect("endpoint"))
        .expect("connect");
    let mut src = Buffer::new(BURST).expect("a buffer");
    // SAFETY: `src` outlives the region.
    let smr = unsafe { cpd.reg_mr(src.as_mut_ptr(), BURST, Access::LOCAL_WRITE) }.expect("an MR");
    let layout = Layout::from_size_align(2 << 20, 4096).expect("a layout");
    let faults = || server.as_soft().map_or(0, |s| s.counters().page_faults);

    let mut g = c.benchmark_group("odp_write_burst");
    for (name, prefetch) in [("no_prefetch", false), ("prefetched", true)] {
        let cfg = ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            registration: Registration::Odp,
            remote: Access::REMOTE_WRITE,
            purge_delay: None,
            prefetch,
            ..Default::default()
        };
        // SAFETY: no peer gets the pool's key (the bench measures local prefetch).
        let pool = unsafe { Pool::with_remote_rights(&pd, cfg) }.expect("a pool");
        let blocks: Vec<*mut u8> = (0..BUFS).map(|_| pool.alloc(layout)).collect();
        let blocks = std::cell::RefCell::new(blocks);
        // Purge and hand out again: the pages the burst writes are fresh.
        let renew = |blocks: &mut Vec<*mut u8>| {
            for &p in blocks.iter() {
                // SAFETY: live blocks of `pool` with `layout`.
                unsafe { pool.free_sized(p, layout) };
            }
            pool.purge();
            for p in blocks.iter_mut() {
                *p = pool.alloc(layout);
                assert!(!p.is_null());
            }
        };
        let burst = |blocks: &[*mut u8]| {
            for (i, &p) in blocks.iter().enumerate() {
                let rkey = pool.keys_of(p).expect("keys").rkey;
                let sge = smr.sge(0, BURST).expect("an SGE");
                // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
                unsafe { peer.post_write(i as u64, &[sge], p as u64, rkey) }.expect("posted");
            }
            for _ in 0..blocks.len() {
                let wc = ccq.wait_one(Duration::from_secs(10)).expect("a completion");
                assert_eq!(wc.status, WcStatus::Success);
            }
        };
        g.bench_function(name, |b| {
            b.iter_batched(
                || renew(&mut blocks.borrow_mut()),
                |()| burst(&blocks.borrow()),
                BatchSize::PerIteration,
            )
        });
        let mut blocks = blocks.into_inner();
        renew(&mut blocks);
        let before = faults();
        burst(&blocks);
        eprintln!("{name}: {} NIC page faults per burst", faults() - before);
        for &p in &blocks {
            // SAFETY: as above.
            unsafe { pool.free_sized(p, layout) };
        }
    }
    g.finish();
}

criterion_group!(benches, bursts);
criterion_main!(benches);
