//! What a revocable per-peer key to one 4 KiB buffer costs, contenders side by side in one run
//! (read the ratios):
//!
//! - `grant_4k/pool_grant`: `pool.grant` (a type 2 window bound on the peer's QP, or whatever
//!   the device needs for exact bounds), waiting for the bind, then `revoke`, waiting for the
//!   invalidation — the full life of a key;
//! - `grant_4k/pool_grant_type2`, `pool_grant_type1`: the same with the kind asked for (a type
//!   1 window is bound with `ibv_bind_mw` and unbound by a zero-length bind);
//! - `grant_4k/pool_grant_region`: `pool.grant_with(.., GrantKind::Region)`: the pool's
//!   checks and bookkeeping around a region of its own over exactly the buffer, retired on
//!   revocation (`ibv_rereg_mr` onto a dummy page, or deregistered where there is no rereg);
//! - `grant_4k/reg_dereg`: a region of its own per grant (`ibv_reg_mr` with the remote right,
//!   `ibv_dereg_mr` to revoke);
//! - `grant_4k/mr_cache`: a cache of registered ranges (a map, as UCX-like libraries keep),
//!   hit after the first grant, that never revokes: the cost of no revocation at all.
//!
//! Soft NIC by default; `RDMA_POOL_TEST_NIC=verbs` runs on `rxe0`/`rxe1` (in the QEMU guest:
//! `RXE_BIN_ARGS=--bench bash tests/rxe/run.sh target/release/deps/grants-*`).

use allocator_api2::vec;
use criterion::{Criterion, criterion_group, criterion_main};
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages};
use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};
use rdma_pool::nic::{Access, Mr, Nic, Qp, QpCaps};
use std::collections::HashMap;
use std::hint::black_box;

fn nics() -> (Nic, Nic) {
    if std::env::var("RDMA_POOL_TEST_NIC").is_ok_and(|v| v == "verbs") {
        (
            Nic::open("rxe0").expect("rxe0"),
            Nic::open("rxe1").expect("rxe1"),
        )
    } else {
        // max_mr 2^20: the default device models mlx5's mkey cache, where revoked region
        // grants stay held (a quarter of max_mr per pool) and region grants are refused
        // beyond: the region row runs tens of thousands of grants.
        let soft = || {
            Nic::soft_with(SoftConfig {
                memlock: MemlockLimit::Unlimited,
                max_mr: 1 << 20,
                ..Default::default()
            })
        };
        (soft(), soft())
    }
}

fn grants(c: &mut Criterion) {
    let (server, client) = nics();
    let pd = server.alloc_pd().expect("a PD");
    let cq = server.create_cq(256).expect("a CQ");
    let qp = pd.create_qp(&cq, &cq, QpCaps::default()).expect("a QP");
    let cpd = client.alloc_pd().expect("a PD");
    let ccq = client.create_cq(16).expect("a CQ");
    let peer: Qp = cpd.create_qp(&ccq, &ccq, QpCaps::default()).expect("a QP");
    qp.connect(&peer.endpoint().expect("endpoint"))
        .expect("connect");
    peer.connect(&qp.endpoint().expect("endpoint"))
        .expect("connect");
    let cfg = ArenaConfig {
        reserve: 1 << 32,
        chunk: 1 << 26,
        hugepages: Hugepages::Off,
        ..Default::default()
    };
    let pool = Pool::with_config(&pd, cfg).expect("a pool");
    let buf = vec![in &pool; 0u8; 4096];
    let rw = Access::REMOTE_WRITE;
    let no_other = |wc| panic!("unexpected completion {wc:?}");

    let mut g = c.benchmark_group("grant_4k");
    g.bench_function("pool_grant", |b| {
        b.iter(|| {
            // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
            let mut grant =
                unsafe { pool.grant_with(&buf, &qp, rw, rdma_pool::grant::GrantKind::Auto) }
                    .expect("a grant");
            grant.wait(&cq, no_other).expect("bound");
            black_box(grant.rkey());
            grant.revoke(&cq, no_other).expect("revoked");
        })
    });
    for (name, kind) in [
        ("pool_grant_type2", rdma_pool::grant::GrantKind::Type2),
        ("pool_grant_type1", rdma_pool::grant::GrantKind::Type1),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                // SAFETY: as above.
                let mut grant = unsafe { pool.grant_with(&buf, &qp, rw, kind) }.expect("a grant");
                grant.wait(&cq, no_other).expect("bound");
                black_box(grant.rkey());
                grant.revoke(&cq, no_other).expect("revoked");
            })
        });
    }
    g.bench_function("pool_grant_region", |b| {
        b.iter(|| {
            let kind = rdma_pool::grant::GrantKind::Region;
            // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
            let mut grant = unsafe { pool.grant_with(&buf, &qp, rw, kind) }.expect("a grant");
            black_box(grant.rkey());
            grant.revoke(&cq, no_other).expect("revoked");
        })
    });
    let ptr = buf.as_ptr() as *mut u8;
    g.bench_function("reg_dereg", |b| {
        b.iter(|| {
            // SAFETY: `buf` outlives the region, dropped (deregistered) at once.
            let mr = unsafe { pd.reg_mr(ptr, 4096, Access::LOCAL_WRITE | rw) }.expect("an MR");
            black_box(mr.rkey());
        })
    });
    let mut cache: HashMap<(usize, usize), Mr> = HashMap::new();
    g.bench_function("mr_cache", |b| {
        b.iter(|| {
            let mr = cache.entry((ptr as usize, 4096)).or_insert_with(|| {
                // SAFETY: as above; the cache is dropped before `buf`.
                unsafe { pd.reg_mr(ptr, 4096, Access::LOCAL_WRITE | rw) }.expect("an MR")
            });
            black_box(mr.rkey());
        })
    });
    g.finish();
    drop(cache);
    let s = pool.stats().grants;
    eprintln!(
        "grants: {} issued on {} ({} dedicated regions live, {} windows, {} retired)",
        s.issued,
        server.caps().name,
        s.dedicated_regions,
        s.windows,
        s.windows_retired
    );
}

criterion_group!(benches, grants);
criterion_main!(benches);
