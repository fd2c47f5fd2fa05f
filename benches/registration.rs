//! What rdma-pool exists to avoid: registering every buffer. Peers in one run, on the soft NIC:
//! - `reg_dereg/pinned_4k` and `reg_dereg/odp_4k`: one `ibv_reg_mr` + `ibv_dereg_mr` per buffer;
//! - `write_4k/preregistered` vs `write_4k/register_each`: an RDMA WRITE from a buffer that is
//!   already registered, against registering it for that one write.
//! - `odp_first_touch/fault` vs `odp_first_touch/prefetched`: a WRITE into cold ODP pages with a
//!   simulated fault cost, against pages prefetched with `advise_mr(FLUSH)` beforehand (outside
//!   the timed part: prefetch is done off the critical path).
//!
//! Read the ratios between peers; absolute soft-NIC times say nothing about hardware.

use criterion::{Criterion, criterion_group, criterion_main};
use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};
use rdma_pool::nic::*;
use std::hint::black_box;
use std::time::Duration;

fn nic() -> Nic {
    Nic::soft_with(SoftConfig {
        memlock: MemlockLimit::Unlimited,
        ..Default::default()
    })
}

fn reg_dereg(c: &mut Criterion) {
    let nic = nic();
    let pd = nic.alloc_pd().unwrap();
    let mut buf = Buffer::new(4096).unwrap();
    let mut g = c.benchmark_group("reg_dereg");
    for (name, access) in [
        ("pinned_4k", Access::LOCAL_WRITE),
        ("odp_4k", Access::LOCAL_WRITE | Access::ON_DEMAND),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                // SAFETY: `buf` outlives the region.
                let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 4096, access) }.unwrap();
                black_box(mr.lkey());
            })
        });
    }
    g.finish();
}

struct Pair {
    a: Pd,
    cq: Cq,
    qa: Qp,
    _qb: Qp,
    dst: Mr,
    _keep: (Nic, Buffer),
}

fn pair(dst_access: Access, cfg: SoftConfig) -> Pair {
    let (na, nb) = (nic(), Nic::soft_with(cfg));
    let (a, b) = (na.alloc_pd().unwrap(), nb.alloc_pd().unwrap());
    let (cq, cqb) = (na.create_cq(64).unwrap(), nb.create_cq(64).unwrap());
    let qa = a.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    let qb = b.create_qp(&cqb, &cqb, QpCaps::default()).unwrap();
    qa.connect(&qb.endpoint().unwrap()).unwrap();
    qb.connect(&qa.endpoint().unwrap()).unwrap();
    let mut buf = Buffer::new(1 << 20).unwrap();
    // SAFETY: the buffer is kept in the pair, after the region.
    let dst = unsafe { b.reg_mr(buf.as_mut_ptr(), buf.len(), dst_access) }.unwrap();
    Pair {
        a,
        cq,
        qa,
        _qb: qb,
        dst,
        _keep: (nb, buf),
    }
}

fn write_4k(c: &mut Criterion) {
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let p = pair(
        rw,
        SoftConfig {
            memlock: MemlockLimit::Unlimited,
            ..Default::default()
        },
    );
    let mut src = Buffer::new(4096).unwrap();
    // SAFETY: `src` outlives the region.
    let pre = unsafe { p.a.reg_mr(src.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }.unwrap();
    let mut g = c.benchmark_group("write_4k");
    g.bench_function("preregistered", |b| {
        b.iter(|| {
            // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
            unsafe {
                p.qa.post_write(
                    1,
                    &[pre.sge(0, 4096).unwrap()],
                    p.dst.addr() as u64,
                    p.dst.rkey(),
                )
            }
            .unwrap();
            black_box(p.cq.wait_one(Duration::from_secs(1)).unwrap());
        })
    });
    let mut src2 = Buffer::new(4096).unwrap();
    g.bench_function("register_each", |b| {
        b.iter(|| {
            // SAFETY: `src2` outlives the region.
            let mr = unsafe { p.a.reg_mr(src2.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }.unwrap();
            // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
            unsafe {
                p.qa.post_write(
                    1,
                    &[mr.sge(0, 4096).unwrap()],
                    p.dst.addr() as u64,
                    p.dst.rkey(),
                )
            }
            .unwrap();
            black_box(p.cq.wait_one(Duration::from_secs(1)).unwrap());
        })
    });
    g.finish();
}

fn odp_first_touch(c: &mut Criterion) {
    let cfg = SoftConfig {
        fault_cost: Duration::from_micros(20),
        ..Default::default()
    };
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::ON_DEMAND;
    let mut src = Buffer::new(64 * 1024).unwrap();
    let mut g = c.benchmark_group("odp_first_touch");
    g.sample_size(20);
    for prefetch in [false, true] {
        g.bench_function(if prefetch { "prefetched" } else { "fault" }, |b| {
            b.iter_batched(
                || {
                    let p = pair(rw, cfg.clone());
                    if prefetch {
                        let sge = p.dst.sge(0, 64 * 1024).unwrap();
                        p.dst
                            .pd()
                            .advise_mr(Advice::PrefetchWrite, AdviseFlags::FLUSH, &[sge])
                            .unwrap();
                    }
                    // SAFETY: `src` outlives the region.
                    let s = unsafe { p.a.reg_mr(src.as_mut_ptr(), 64 * 1024, Access::LOCAL_WRITE) }
                        .unwrap();
                    (p, s)
                },
                |(p, s)| {
                    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
                    unsafe {
                        p.qa.post_write(
                            1,
                            &[s.sge(0, 64 * 1024).unwrap()],
                            p.dst.addr() as u64,
                            p.dst.rkey(),
                        )
                    }
                    .unwrap();
                    black_box(p.cq.wait_one(Duration::from_secs(5)).unwrap());
                    // Returned, so tearing the pair down is not timed.
                    (p, s)
                },
                criterion::BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, reg_dereg, write_4k, odp_first_touch);
criterion_main!(benches);
