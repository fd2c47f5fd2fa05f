//! Fault-injection sweep: every NIC verb the pool calls, at each of its call sites, failing
//! with every errno the seed documents list for it (plus `ENOMEM`, `EAGAIN`), injected on the
//! soft NIC (`SoftNic::fail_next`, `fail_next_rereg`). After each fault: the call answered with
//! a typed error or degraded as documented (no panic), memory handed out before is intact,
//! the pool keeps serving (a fresh allocation is usable, and posted through the NIC where it
//! got keys), nothing leaked (`validate`, no grant left open), and the stats name what
//! happened. The same for `GlobalAlloc` (`GlobalPool`, which must never panic or return null
//! for what malloc can serve), and for the hugetlb pool running dry.
//!
//! verb × errno → outcome (what `fault_sweep` prints; each row is asserted):
//!
//! | verb (call site) | errnos | outcome |
//! |---|---|---|
//! | `reg_mr` (growth, pinned) | ENOMEM EAGAIN EINVAL EFAULT EPERM EOPNOTSUPP | the chunk's ODP region takes over (`odp_fallbacks`, `last_degradation` names memlock or the errno) |
//! | `reg_mr` (growth, pinned, no ODP) | same | the run is served unregistered (`unregistered_runs`, `keys_of` → None); the next growth registers again |
//! | `reg_mr` (growth, ODP chunk region) | same | served unregistered, counted; the next chunk registers |
//! | `reg_mr` (growth, `RegistrationPolicy::Required`) | same | the allocation fails (null, `failed_allocations`), nothing stays committed |
//! | `reg_mr` (region grant) | same | `GrantError::Nic(errno)`; no grant, region or window left |
//! | `reg_mr` (rail attach) | same | attach succeeds; the run has no keys on that rail (`RailStats::unregistered_bytes`) |
//! | `rereg_mr` (tail growth) | ERR_INPUT / DONT_FORK_NEW × 3 errnos | old region kept, the new slabs get a region of their own (`fallbacks_to_new_mr`) |
//! | `rereg_mr` (tail growth) | DO_FORK_OLD × 3 | the new translation is in force: grown (`reregs`) |
//! | `rereg_mr` (tail growth) | ERR_CMD / CMD_AND_DO_FORK_NEW × 3 | region registered anew over the whole range (`rereg_cmd_errors`); EOPNOTSUPP turns growth by rereg off |
//! | `dereg_mr` (purge of pinned memory) | EBUSY EINVAL | purge refused (`purges_refused`), the slabs stay committed and registered; reuse works |
//! | `dereg_mr` (region grant revocation) | EBUSY EINVAL | the grant stays open, its memory parked (`stuck_revocations`); a later revoke completes |
//! | `dereg_mr` (rail detach) | EBUSY EINVAL | `Error::Nic(errno)` after the rail is freed; the primary's keys unchanged |
//! | `advise_mr` (`pool.prefetch`, ODP) | EOPNOTSUPP EFAULT EINVAL EPERM ENOENT | typed `PrefetchError` (EOPNOTSUPP: `Unsupported`, prefetch turned off); data intact |
//! | `advise_mr` (`pool.prefetch`, ODP) | EAGAIN ENOMEM | retried with a growing pause: succeeds (`retries`) |
//! | `advise_mr` (automatic, on growth) | all of the above | the run is handed out all the same (`automatic_failures`, or retried) |
//! | `alloc_mw` (grant) | ENOMEM EINVAL EOPNOTSUPP EAGAIN | `GrantError::Nic(errno)`; nothing left open |
//! | `bind_mw` (type 1 grant) | EINVAL EPERM ENOMEM EAGAIN | `GrantError::Nic(errno)`; the window back in the cache |
//! | `post_send` (type 2 bind) | ENOMEM EINVAL EAGAIN | `GrantError::Nic(errno)`; the window back in the cache |
//! | `post_send` (LOCAL_INV on revoke) | ENOMEM EINVAL EAGAIN | the window is deallocated instead (`revoked_by_dealloc`): the key is dead |
//! | `dealloc_mw` (after a failed LOCAL_INV) | EBUSY EINVAL | logged as leaked; the grant still ends, no key left working |
//! | `query_qp` (window grant) | EINVAL ENOMEM | `GrantError::Nic(errno)` |
//! | `poll_cq` (waiting for a bind) | EINVAL EAGAIN | `GrantError::Nic(errno)`; the grant revokes cleanly afterwards |
//! | `umem_reg` (queue memory) | EINVAL ENOMEM EOPNOTSUPP EAGAIN | `QueueMemError` (typed), nothing kept |
//! | `umem_dereg` (an emptied extra UMEM) | EBUSY EINVAL | the UMEM is kept and reused; carving goes on |
//! | hugetlb pool dry (`Hugepages::Require`) | — | `HugepagesUnavailable`: null, `failed_allocations`; smaller blocks from committed slabs still served |
//! | `GlobalAlloc` growth: `reg_mr` / `rereg_mr` / `advise_mr` | as above | never null, never a panic: ODP fallback, a region of its own, or unregistered memory counted |

use super::*;
use rdma_pool::arena::{Error, Registration, RegistrationPolicy};
use rdma_pool::grant::{GrantError, GrantKind};
use rdma_pool::nic::soft::{SoftConfig, SoftNic};
use std::alloc::Layout;

const MIB: usize = 1 << 20;

/// A fresh server pool with memory already handed out, a client, and a connected QP pair.
struct Fx {
    server: Side,
    client: Side,
    qs: Qp,
    _qc: Qp,
    pool: Pool,
    keep: Vec<(*mut u8, usize, u8)>,
}

fn cfg(mode: Registration) -> ArenaConfig {
    ArenaConfig {
        registration: mode,
        ..small_arena()
    }
}

impl Fx {
    fn with(soft: SoftConfig, cfg: ArenaConfig) -> Fx {
        let server = Side::new(Nic::soft_with(soft));
        let client = Side::new(Nic::soft());
        let (qs, qc) = connect(&server, &client);
        let pool = Pool::with_config(&server.pd, cfg).unwrap();
        let mut fx = Fx {
            server,
            client,
            qs,
            _qc: qc,
            pool,
            keep: Vec::new(),
        };
        for (i, n) in [100, 70_000, 3 * MIB].into_iter().enumerate() {
            let p = fx.pool.alloc(Layout::from_size_align(n, 8).unwrap());
            assert!(!p.is_null());
            // SAFETY: a fresh block of `n` bytes.
            unsafe { std::ptr::write_bytes(p, 0x10 + i as u8, n) };
            fx.keep.push((p, n, 0x10 + i as u8));
        }
        fx
    }

    fn new(mode: Registration) -> Fx {
        Fx::with(SoftConfig::default(), cfg(mode))
    }

    fn soft(&self) -> &SoftNic {
        self.server.nic.as_soft().unwrap()
    }

    fn alloc(&self, n: usize) -> *mut u8 {
        self.pool.alloc(Layout::from_size_align(n, 8).unwrap())
    }

    /// Free `p` (a block of this pool, or null) now.
    fn free(&self, p: *mut u8) {
        if !p.is_null() {
            // SAFETY: a live block of this pool, not used any more.
            unsafe { self.pool.free(p) };
        }
    }

    /// Everything handed out before the fault is as it was, the pool still serves (a block
    /// that is posted through the NIC where it has keys), and the invariants hold.
    fn after(&self) {
        for &(p, n, b) in &self.keep {
            // SAFETY: a live block of `n` bytes.
            let s = unsafe { std::slice::from_raw_parts(p, n) };
            assert!(s.iter().all(|&x| x == b), "a block changed under a fault");
        }
        let p = self.alloc(MIB + 64);
        assert!(!p.is_null(), "the pool stopped serving");
        // SAFETY: a fresh block of MIB + 64 bytes.
        let s = unsafe { std::slice::from_raw_parts_mut(p, MIB + 64) };
        s.fill(0x5A);
        if let Ok(sge) = self.pool.sge_of(&s[..4096]) {
            let (mem, mr) = self.client.reg_buf(4096, 0, RW);
            let (qa, qb) = connect(&self.server, &self.client);
            // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
            unsafe { qa.post_write(3, &[sge], mr.addr() as u64, mr.rkey()) }.unwrap();
            assert_eq!(self.server.wait().status, WcStatus::Success);
            assert!(mem.as_slice().iter().all(|&x| x == 0x5A));
            drop((qa, qb));
        }
        // SAFETY: a live block of this pool.
        unsafe { self.pool.free(p) };
        let g = self.pool.stats().grants;
        assert_eq!((g.open, g.quarantined_blocks), (0, 0), "{g:?}");
        assert!(self.pool.validate());
    }
}

impl Drop for Fx {
    /// Free what the fixture handed out: a pool dropped with live blocks keeps its memory
    /// mapped (by design), and a sweep of a hundred fixtures would hold gigabytes.
    fn drop(&mut self) {
        for &(p, _, _) in &self.keep {
            // SAFETY: live blocks of this pool, not used any more.
            unsafe { self.pool.free(p) };
        }
        self.keep.clear();
    }
}

/// One row of the sweep: what was injected where, and what came of it.
struct Row {
    verb: &'static str,
    site: &'static str,
    errno: i32,
    outcome: String,
}

fn errno_name(e: i32) -> &'static str {
    match e {
        libc::ENOMEM => "ENOMEM",
        libc::EAGAIN => "EAGAIN",
        libc::EINVAL => "EINVAL",
        libc::EFAULT => "EFAULT",
        libc::EPERM => "EPERM",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EBUSY => "EBUSY",
        libc::ENOENT => "ENOENT",
        _ => "?",
    }
}

const REG: [i32; 6] = [
    libc::ENOMEM,
    libc::EAGAIN,
    libc::EINVAL,
    libc::EFAULT,
    libc::EPERM,
    libc::EOPNOTSUPP,
];
const DEREG: [i32; 2] = [libc::EBUSY, libc::EINVAL];
// ENOTSUP is EOPNOTSUPP on Linux.
const ADVISE: [i32; 7] = [
    libc::EOPNOTSUPP,
    libc::EFAULT,
    libc::EINVAL,
    libc::EPERM,
    libc::ENOENT,
    libc::ENOMEM,
    libc::EAGAIN,
];
const MW: [i32; 4] = [libc::ENOMEM, libc::EINVAL, libc::EOPNOTSUPP, libc::EAGAIN];
const BIND: [i32; 4] = [libc::EINVAL, libc::EPERM, libc::ENOMEM, libc::EAGAIN];
const POST: [i32; 3] = [libc::ENOMEM, libc::EINVAL, libc::EAGAIN];

fn no_odp() -> SoftConfig {
    SoftConfig {
        odp: false,
        implicit_odp: false,
        ..Default::default()
    }
}

/// A grant's error must carry the injected errno.
fn nic_errno(r: Result<impl Sized, GrantError>, errno: i32) -> String {
    match r {
        Err(GrantError::Nic(e)) => {
            assert_eq!(e.errno(), Some(errno), "{e}");
            format!("GrantError::Nic({})", errno_name(errno))
        }
        Err(GrantError::Limit { what, .. }) if errno == libc::ENOMEM => format!("Limit({what})"),
        Err(e) => panic!("unexpected grant error {e:?}"),
        Ok(_) => panic!(
            "a grant call succeeded through an injected {}",
            errno_name(errno)
        ),
    }
}

fn reg_mr_rows(rows: &mut Vec<Row>) {
    for errno in REG {
        // Pinned growth, ODP on the device: the chunk's ODP region takes over.
        let fx = Fx::new(Registration::Pinned);
        let before = fx.pool.stats().alloc.arena;
        fx.soft().fail_next(Verb::RegMr, 1, errno);
        let p = fx.alloc(20 * MIB);
        assert!(!p.is_null());
        let s = fx.pool.stats().alloc.arena;
        let keys = fx.pool.keys_of(p);
        let outcome = if s.odp_fallbacks > before.odp_fallbacks {
            assert!(keys.is_some());
            "ODP fallback"
        } else {
            assert!(keys.is_none() && s.unregistered_runs > before.unregistered_runs);
            "unregistered"
        };
        assert!(s.last_degradation.is_some());
        fx.free(p);
        fx.after();
        rows.push(Row {
            verb: "reg_mr",
            site: "growth, pinned",
            errno,
            outcome: outcome.into(),
        });

        // Pinned growth without ODP: served unregistered, counted; the next run registers.
        let fx = Fx::with(no_odp(), cfg(Registration::Pinned));
        fx.soft().fail_next(Verb::RegMr, 1, errno);
        let p = fx.alloc(20 * MIB);
        assert!(!p.is_null());
        assert_eq!(fx.pool.keys_of(p), None);
        assert_eq!(fx.pool.stats().alloc.arena.unregistered_runs, 1);
        let q = fx.alloc(20 * MIB);
        assert!(
            fx.pool.keys_of(q).is_some(),
            "the next growth registers again"
        );
        fx.free(p);
        fx.free(q);
        fx.after();
        rows.push(Row {
            verb: "reg_mr",
            site: "growth, pinned, no ODP",
            errno,
            outcome: "unregistered, counted; next run registered".into(),
        });

        // ODP growth: the chunk's (or the run's) ODP region refused.
        let fx = Fx::new(Registration::Odp);
        fx.soft().fail_next(Verb::RegMr, 1, errno);
        let p = fx.alloc(20 * MIB);
        assert!(!p.is_null());
        assert_eq!(fx.pool.keys_of(p), None);
        assert!(fx.pool.stats().alloc.arena.unregistered_bytes >= 20 * MIB as u64);
        fx.free(p);
        fx.after();
        rows.push(Row {
            verb: "reg_mr",
            site: "growth, ODP region",
            errno,
            outcome: "unregistered, counted".into(),
        });

        // Strict policy: the allocation fails, nothing stays committed.
        let strict = ArenaConfig {
            policy: RegistrationPolicy::Required,
            ..cfg(Registration::Pinned)
        };
        let fx = Fx::with(no_odp(), strict);
        let committed = fx.pool.stats().alloc.arena.committed_bytes;
        fx.soft().fail_next(Verb::RegMr, 1, errno);
        assert!(fx.alloc(20 * MIB).is_null());
        let s = fx.pool.stats();
        assert_eq!(s.alloc.arena.committed_bytes, committed);
        assert!(s.alloc.failed_allocations >= 1);
        fx.after();
        rows.push(Row {
            verb: "reg_mr",
            site: "growth, Required",
            errno,
            outcome: "null, failed_allocations, nothing committed".into(),
        });

        // A region grant.
        let fx = Fx::new(Registration::Pinned);
        let (p, n, _) = fx.keep[1];
        // SAFETY: a live block.
        let buf = unsafe { std::slice::from_raw_parts(p, n) };
        fx.soft().fail_next(Verb::RegMr, 1, errno);
        let r = fx.pool.grant_read_with(buf, &fx.qs, GrantKind::Region);
        let outcome = nic_errno(r, errno);
        assert_eq!(fx.pool.stats().grants.dedicated_regions, 0);
        fx.after();
        rows.push(Row {
            verb: "reg_mr",
            site: "region grant",
            errno,
            outcome,
        });

        // A rail attached while its device refuses.
        let fx = Fx::new(Registration::Pinned);
        let rail = Nic::soft_with(no_odp());
        rail.as_soft().unwrap().fail_next(Verb::RegMr, 1, errno);
        fx.pool.attach(&rail.alloc_pd().unwrap()).unwrap();
        let st = fx.pool.stats().rails[0].clone();
        assert!(st.unregistered_bytes > 0 && st.degradations == 1, "{st:?}");
        fx.after();
        rows.push(Row {
            verb: "reg_mr",
            site: "rail attach",
            errno,
            outcome: "attached; the refused run has no keys on that rail".into(),
        });
    }
}

fn rereg_rows(rows: &mut Vec<Row>) {
    use rdma_pool::nic::ReregErrorKind as K;
    for kind in [
        K::Input,
        K::DontForkNew,
        K::DoForkOld,
        K::Cmd,
        K::CmdAndDoForkNew,
    ] {
        for errno in [libc::ENOMEM, libc::EINVAL, libc::EOPNOTSUPP] {
            let fx = Fx::new(Registration::Pinned);
            let arena = fx.pool.arena();
            let a = arena.alloc_run(2 * MIB, 2 * MIB).unwrap();
            let before = fx.pool.stats().alloc.arena;
            fx.soft().fail_next_rereg(kind, 1, errno);
            let b = arena.alloc_run(2 * MIB, 2 * MIB).unwrap();
            let s = fx.pool.stats().alloc.arena;
            let ka = arena
                .keys_of(a.as_ptr())
                .expect("the old run keeps a region");
            let kb = arena
                .keys_of(b.as_ptr())
                .expect("the new run is registered");
            assert!(ka.contains(a.as_ptr() as usize, a.len()));
            assert!(kb.contains(b.as_ptr() as usize, b.len()));
            let outcome = if s.rereg_cmd_errors > before.rereg_cmd_errors {
                "registered anew (rereg_cmd_errors)"
            } else if s.reregs > before.reregs {
                "grown: the new translation is in force"
            } else {
                assert!(s.fallbacks_to_new_mr > before.fallbacks_to_new_mr, "{s:?}");
                "old region kept, a region of its own for the new slabs"
            };
            match kind {
                K::Cmd | K::CmdAndDoForkNew => {
                    assert!(s.rereg_cmd_errors > before.rereg_cmd_errors)
                }
                K::DoForkOld => assert!(s.reregs > before.reregs || ka == kb),
                _ => assert!(s.fallbacks_to_new_mr > before.fallbacks_to_new_mr),
            }
            fx.after();
            rows.push(Row {
                verb: match kind {
                    K::Input => "rereg_mr ERR_INPUT",
                    K::DontForkNew => "rereg_mr ERR_DONT_FORK_NEW",
                    K::DoForkOld => "rereg_mr ERR_DO_FORK_OLD",
                    K::Cmd => "rereg_mr ERR_CMD",
                    _ => "rereg_mr ERR_CMD_AND_DO_FORK_NEW",
                },
                site: "tail growth",
                errno,
                outcome: outcome.into(),
            });
        }
    }
}

fn dereg_rows(rows: &mut Vec<Row>) {
    for errno in DEREG {
        // Purge of pinned memory.
        let fx = Fx::new(Registration::Pinned);
        let l = Layout::from_size_align(8 * MIB, 4096).unwrap();
        let p = fx.pool.alloc(l);
        // SAFETY: a block of this pool with `l`.
        unsafe { fx.pool.free_sized(p, l) };
        fx.soft().fail_next(Verb::DeregMr, 1, errno);
        let purged = fx.pool.purge();
        let s = fx.pool.stats().alloc.arena;
        assert!(purged < 8 * MIB && s.purges_refused >= 1, "{purged} {s:?}");
        let q = fx.pool.alloc(l);
        assert!(fx.pool.keys_of(q).is_some());
        // SAFETY: as above.
        unsafe { fx.pool.free_sized(q, l) };
        fx.after();
        rows.push(Row {
            verb: "dereg_mr",
            site: "purge, pinned",
            errno,
            outcome: "purge refused (purges_refused), slabs kept registered".into(),
        });

        // Revocation of a region grant.
        let fx = Fx::new(Registration::Pinned);
        let (p, n, _) = fx.keep[1];
        // SAFETY: a live block.
        let buf = unsafe { std::slice::from_raw_parts(p, n) };
        let mut g = fx
            .pool
            .grant_read_with(buf, &fx.qs, GrantKind::Region)
            .unwrap();
        // Retirement first moves the region off the buffer; refused, it deregisters.
        fx.soft().fail_next(Verb::ReregMr, 1, errno);
        fx.soft().fail_next(Verb::DeregMr, 1, errno);
        g.start_revoke().unwrap();
        assert!(!g.is_revoked(), "the key may still work");
        assert!(fx.pool.stats().grants.stuck_revocations >= 1);
        assert_eq!(fx.pool.stats().grants.open, 1, "the grant stays open");
        // Waiting for the revocation tries the deregistration again.
        g.wait_revoked(&fx.server.cq, |_| {}).unwrap();
        assert!(g.is_revoked());
        assert_eq!(fx.pool.stats().grants.open, 0);
        drop(g);
        fx.after();
        rows.push(Row {
            verb: "dereg_mr",
            site: "region grant revoke (after rereg_mr refused)",
            errno,
            outcome: "grant stays open (stuck_revocations); a later revoke completes".into(),
        });

        // Detach.
        let fx = Fx::new(Registration::Pinned);
        let rail = Nic::soft();
        let pd = rail.alloc_pd().unwrap();
        fx.pool.attach(&pd).unwrap();
        let k0 = fx.pool.keys_of(fx.keep[2].0);
        rail.as_soft().unwrap().fail_next(Verb::DeregMr, 1, errno);
        match fx.pool.detach(&pd) {
            Err(Error::Nic(e)) => assert_eq!(e.errno(), Some(errno)),
            r => panic!("detach under a failing dereg: {r:?}"),
        }
        assert!(fx.pool.stats().rails.is_empty());
        assert_eq!(fx.pool.keys_of(fx.keep[2].0), k0);
        fx.after();
        rows.push(Row {
            verb: "dereg_mr",
            site: "rail detach",
            errno,
            outcome: "Error::Nic after the rail is freed; primary keys unchanged".into(),
        });
    }
}

fn advise_rows(rows: &mut Vec<Row>) {
    for errno in ADVISE {
        let fx = Fx::new(Registration::Odp);
        let (p, n, _) = fx.keep[2];
        // SAFETY: a live block.
        let buf = unsafe { std::slice::from_raw_parts(p, n) };
        fx.soft().fail_next(Verb::AdviseMr, 1, errno);
        let r = fx.pool.prefetch(buf, Advice::PrefetchWrite);
        let outcome = match (errno, &r) {
            (libc::EAGAIN | libc::ENOMEM, Ok(_)) => {
                assert!(fx.pool.stats().prefetch.retries >= 1);
                "retried: ok".to_string()
            }
            (_, Err(e)) => {
                if errno == libc::EOPNOTSUPP {
                    assert!(!fx.pool.stats().prefetch.enabled, "turned off");
                }
                format!("PrefetchError::{e:?}")
            }
            (_, Ok(_)) => panic!("prefetch succeeded through {}", errno_name(errno)),
        };
        fx.after();
        rows.push(Row {
            verb: "advise_mr",
            site: "pool.prefetch, ODP",
            errno,
            outcome,
        });

        // Automatic prefetch of a fresh run.
        let fx = Fx::new(Registration::Odp);
        fx.soft().fail_next(Verb::AdviseMr, 1, errno);
        let p = fx.alloc(20 * MIB);
        assert!(!p.is_null() && fx.pool.keys_of(p).is_some());
        let ps = fx.pool.stats().prefetch;
        assert!(ps.automatic_failures + ps.retries >= 1, "{ps:?}");
        fx.free(p);
        fx.after();
        rows.push(Row {
            verb: "advise_mr",
            site: "automatic, on growth",
            errno,
            outcome: "run handed out; counted".into(),
        });
    }
}

/// A type-`kind` WRITE grant on the fixture's medium block.
fn grant(fx: &Fx, kind: GrantKind) -> Result<rdma_pool::grant::Grant<'_>, GrantError> {
    let (p, n, _) = fx.keep[1];
    // SAFETY: a live block, kept while the fixture lives.
    let buf = unsafe { std::slice::from_raw_parts(p, n) };
    // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
    unsafe { fx.pool.grant_with(buf, &fx.qs, Access::REMOTE_WRITE, kind) }
}

/// Rows where `verb` failing with each of `errnos` makes a type-`kind` grant fail with that
/// errno, and leaves the pool serving.
fn grant_refused(
    rows: &mut Vec<Row>,
    verb: Verb,
    errnos: &[i32],
    kind: GrantKind,
    (name, site): (&'static str, &'static str),
) {
    for &errno in errnos {
        let fx = Fx::new(Registration::Pinned);
        fx.soft().fail_next(verb, 1, errno);
        let outcome = nic_errno(grant(&fx, kind), errno);
        fx.after();
        rows.push(Row {
            verb: name,
            site,
            errno,
            outcome,
        });
    }
}

fn window_rows(rows: &mut Vec<Row>) {
    grant_refused(
        rows,
        Verb::AllocMw,
        &MW,
        GrantKind::Type2,
        ("alloc_mw", "grant"),
    );
    grant_refused(
        rows,
        Verb::BindMw,
        &BIND,
        GrantKind::Type1,
        ("bind_mw", "type 1 grant"),
    );
    grant_refused(
        rows,
        Verb::PostSend,
        &POST,
        GrantKind::Type2,
        ("post_send", "type 2 bind"),
    );
    for errno in POST {
        // LOCAL_INV refused: the window is deallocated instead; its key is dead.
        let fx = Fx::new(Registration::Pinned);
        let mut g = grant(&fx, GrantKind::Type2).unwrap();
        g.wait(&fx.server.cq, |_| {}).unwrap();
        let w = g.wire();
        fx.soft().fail_next(Verb::PostSend, 1, errno);
        g.revoke(&fx.server.cq, |_| {}).unwrap();
        assert!(g.is_revoked());
        drop(g);
        assert!(fx.pool.stats().grants.revoked_by_dealloc >= 1);
        let (qc, qs2) = connect(&fx.client, &fx.server);
        let (_m, src) = fx.client.reg_buf(8, 0xEE, RW);
        // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
        unsafe { qc.post_write(4, &[src.sge(0, 8).unwrap()], w.addr, w.rkey) }.unwrap();
        assert_ne!(fx.client.wait().status, WcStatus::Success, "a dead key");
        drop((qc, qs2));
        fx.after();
        rows.push(Row {
            verb: "post_send",
            site: "LOCAL_INV on revoke",
            errno,
            outcome: "window deallocated instead (revoked_by_dealloc); key dead".into(),
        });
    }
    for errno in DEREG {
        // The window's deallocation fails after a failed LOCAL_INV: logged, grant ends.
        let fx = Fx::new(Registration::Pinned);
        let mut g = grant(&fx, GrantKind::Type2).unwrap();
        g.wait(&fx.server.cq, |_| {}).unwrap();
        fx.soft().fail_next(Verb::PostSend, 1, libc::EINVAL);
        fx.soft().fail_next(Verb::DeallocMw, 1, errno);
        let r = g.revoke(&fx.server.cq, |_| {});
        assert!(r.is_ok() || g.is_revoked(), "{r:?}");
        drop(g);
        fx.after();
        rows.push(Row {
            verb: "dealloc_mw",
            site: "after a failed LOCAL_INV",
            errno,
            outcome: "logged as leaked; the grant ends".into(),
        });
    }
    grant_refused(
        rows,
        Verb::QueryQp,
        &[libc::EINVAL, libc::ENOMEM],
        GrantKind::Type2,
        ("query_qp", "window grant"),
    );
    for errno in [libc::EINVAL, libc::EAGAIN] {
        let fx = Fx::new(Registration::Pinned);
        let mut g = grant(&fx, GrantKind::Type2).unwrap();
        fx.soft().fail_next(Verb::PollCq, 1, errno);
        let outcome = nic_errno(g.wait(&fx.server.cq, |_| {}), errno);
        g.revoke(&fx.server.cq, |_| {}).unwrap();
        drop(g);
        fx.after();
        rows.push(Row {
            verb: "poll_cq",
            site: "waiting for a bind",
            errno,
            outcome,
        });
    }
}

fn umem_rows(rows: &mut Vec<Row>) {
    for errno in MW {
        let fx = Fx::new(Registration::Pinned);
        fx.soft().fail_next(Verb::UmemReg, 1, errno);
        let r = fx.pool.queue_memory(4096, 64);
        let outcome = match r {
            Err(e) => format!("QueueMemError::{e:?}"),
            Ok(_) => panic!("queue memory through a failing umem_reg"),
        };
        assert_eq!(fx.pool.stats().queue.umems, 0);
        let q = fx
            .pool
            .queue_memory(4096, 64)
            .expect("the next one registers");
        drop(q);
        fx.after();
        rows.push(Row {
            verb: "umem_reg",
            site: "queue memory",
            errno,
            outcome,
        });
    }
    for errno in DEREG {
        let fx = Fx::new(Registration::Pinned);
        let a = fx.pool.queue_memory(6 * MIB, 64).unwrap();
        let b = fx.pool.queue_memory(6 * MIB, 64).unwrap();
        assert_eq!(fx.pool.stats().queue.umems, 2);
        fx.soft().fail_next(Verb::UmemDereg, 1, errno);
        drop(b);
        assert_eq!(fx.pool.stats().queue.umems, 2, "the refused UMEM is kept");
        let c = fx.pool.queue_memory(6 * MIB, 64).expect("carving goes on");
        drop((a, c));
        fx.after();
        rows.push(Row {
            verb: "umem_dereg",
            site: "an emptied extra UMEM",
            errno,
            outcome: "UMEM kept and reused".into(),
        });
    }
}

#[test]
fn fault_sweep() {
    let _g = serial();
    let mut rows = Vec::new();
    reg_mr_rows(&mut rows);
    rereg_rows(&mut rows);
    dereg_rows(&mut rows);
    advise_rows(&mut rows);
    window_rows(&mut rows);
    umem_rows(&mut rows);
    eprintln!("fault sweep: {} faults injected and survived", rows.len());
    for r in &rows {
        eprintln!(
            "| {} | {} | {} | {} |",
            r.verb,
            r.site,
            errno_name(r.errno),
            r.outcome
        );
    }
    // Every row above ran: 36 reg_mr, 15 rereg_mr, 6 dereg_mr, 14 advise_mr, 4 alloc_mw,
    // 4 bind_mw, 6 post_send, 2 dealloc_mw, 2 query_qp, 2 poll_cq, 4 umem_reg, 2 umem_dereg.
    assert_eq!(rows.len(), 97);
}

/// The soft NIC of the sweep's `GlobalPool` (one per process: the pool lives in a static).
fn global_nic() -> &'static Nic {
    static NIC: std::sync::OnceLock<Nic> = std::sync::OnceLock::new();
    NIC.get_or_init(|| {
        Nic::soft_with(SoftConfig {
            odp: false,
            implicit_odp: false,
            memlock: rdma_pool::nic::soft::MemlockLimit::Unlimited,
            ..Default::default()
        })
    })
}

fn open_global_nic() -> rdma_pool::nic::Result<Nic> {
    Ok(global_nic().clone())
}

static GLOBAL: rdma_pool::GlobalPool =
    rdma_pool::GlobalPool::with_config(rdma_pool::global::GlobalConfig {
        arena: rdma_pool::arena::ArenaConfig {
            registration: Registration::Pinned,
            hugepages: Hugepages::Off,
            reserve: 1 << 32,
            chunk: 1 << 24,
            ..rdma_pool::global::GlobalConfig::DEFAULT.arena
        },
        open: Some(open_global_nic),
        ..rdma_pool::global::GlobalConfig::DEFAULT
    });

/// `GlobalAlloc` under every growth fault (each injection is consumed by a growth it forces:
/// blocks are kept, so each allocation needs fresh memory): never null, never a panic, the
/// bytes handed out before intact, the degradation counted.
#[test]
fn global_alloc_survives_every_growth_fault() {
    use rdma_pool::nic::ReregErrorKind as K;
    use std::alloc::GlobalAlloc;
    let _g = serial();
    let soft = || global_nic().as_soft().unwrap();
    let l = |n| Layout::from_size_align(n, 64).unwrap();
    let mut live: Vec<(*mut u8, usize, u8)> = Vec::new();
    let alloc = |n: usize, live: &mut Vec<(*mut u8, usize, u8)>| {
        // SAFETY: a non-zero layout.
        let p = unsafe { GLOBAL.alloc(l(n)) };
        assert!(!p.is_null(), "GlobalAlloc returned null under a fault");
        let b = live.len() as u8;
        // SAFETY: a fresh block of `n` bytes.
        unsafe { std::ptr::write_bytes(p, b, n) };
        live.push((p, n, b));
    };
    alloc(100_000, &mut live);
    let injected = || soft().counters().injected_faults;
    let mut faults = 0;
    let before = GLOBAL.stats().pool.unwrap().arena;
    for errno in REG {
        let n0 = injected();
        soft().fail_next(Verb::RegMr, 1, errno);
        alloc(20 * MIB, &mut live); // a run of its own: one reg_mr
        assert_eq!(injected(), n0 + 1, "the growth met the fault");
        faults += 1;
    }
    let mid = GLOBAL.stats().pool.unwrap().arena;
    assert_eq!(
        mid.unregistered_runs - before.unregistered_runs,
        REG.len() as u64
    );
    for kind in [
        K::Input,
        K::DontForkNew,
        K::DoForkOld,
        K::Cmd,
        K::CmdAndDoForkNew,
    ] {
        let n0 = injected();
        soft().fail_next_rereg(kind, 1, libc::EINVAL);
        // Slabs added to a chunk's tail until one growth re-registers (meets the fault).
        for _ in 0..16 {
            alloc(3 * MIB, &mut live);
            if injected() > n0 {
                break;
            }
        }
        assert_eq!(injected(), n0 + 1, "a tail growth met the fault");
        faults += 1;
    }
    for &(p, n, b) in &live {
        // SAFETY: still live.
        let s = unsafe { std::slice::from_raw_parts(p, n) };
        assert!(s.iter().all(|&x| x == b), "a block changed under a fault");
    }
    let st = GLOBAL.stats();
    assert_eq!(st.failed_allocations, 0);
    let arena = st.pool.unwrap().arena;
    assert!(
        arena.rereg_cmd_errors > before.rereg_cmd_errors,
        "{arena:?}"
    );
    for (p, n, _) in live {
        // SAFETY: from GLOBAL with that layout.
        unsafe { GLOBAL.dealloc(p, l(n)) };
    }
    assert!(GLOBAL.validate());
    eprintln!("GlobalAlloc: {faults} growth faults injected, every allocation served");
}

#[test]
fn hugetlb_running_dry_is_typed_and_the_pool_keeps_serving() {
    let _g = serial();
    let free = free_hugepages();
    let server = Side::new(Nic::soft());
    let pool = Pool::with_config(
        &server.pd,
        ArenaConfig {
            hugepages: Hugepages::Require,
            ..cfg(Registration::Pinned)
        },
    )
    .unwrap();
    // What the hugetlb pool can still give is served, and kept intact.
    let small = (free > 0).then(|| allocator_api2::vec![in &pool; 7u8; 4096]);
    // Ask for more huge pages than the machine has left: refused, typed, counted.
    let p = pool.alloc(Layout::from_size_align((free + 4) * 2 * MIB, 4096).unwrap());
    assert!(p.is_null());
    let s = pool.stats();
    assert!(s.alloc.failed_allocations >= 1, "{s:?}");
    if let Some(v) = small {
        assert!(v.iter().all(|&b| b == 7));
        assert!(pool.keys_of(v.as_ptr()).is_some());
        // Blocks from slabs already committed are still served.
        let w = allocator_api2::vec![in &pool; 8u8; 64];
        assert!(w.iter().all(|&b| b == 8));
    }
    assert!(pool.validate());
}

/// Free 2 MiB hugetlb pages.
fn free_hugepages() -> usize {
    let s = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
    s.ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// A revocation that must deallocate its window (the QP failed, so no invalidation could be
/// posted) and whose `ibv_dealloc_mw` fails fails closed: the grant stays open and counted as
/// stuck, its memory parked, until a later try deallocates the window.
#[test]
fn a_window_that_cannot_be_deallocated_keeps_its_grant_open() {
    for kind in [GrantKind::Type1, GrantKind::Type2] {
        let fx = Fx::new(Registration::Pinned);
        let mut g = grant(&fx, kind).unwrap();
        g.wait(&fx.server.cq, |_| {}).unwrap();
        // The server's QP fails: a READ with a bad key moves it to the error state.
        let (_m, local) = fx.server.reg_buf(8, 0, Access::LOCAL_WRITE);
        // SAFETY: `local` outlives the request and is read after its completion.
        unsafe {
            fx.qs
                .post_read(9, &[local.sge(0, 8).unwrap()], 0x1000, Rkey(0xbad))
        }
        .unwrap();
        assert_ne!(fx.server.wait().status, WcStatus::Success);
        fx.soft().fail_next(Verb::DeallocMw, 2, libc::EBUSY);
        g.start_revoke().unwrap();
        let mut wc = [Completion::default(); 4];
        while fx.server.cq.poll(&mut wc).unwrap() > 0 {}
        assert!(
            !g.is_revoked(),
            "{kind:?}: reported revoked with its window alive"
        );
        let s = fx.pool.stats().grants;
        assert!(s.stuck_revocations >= 1 && s.open == 1, "{kind:?}: {s:?}");
        // Later tries deallocate it (the second fails too, the third succeeds).
        g.wait_revoked(&fx.server.cq, |_| {}).unwrap();
        assert!(g.is_revoked());
        drop(g);
        let s = fx.pool.stats().grants;
        assert_eq!((s.open, s.quarantined_blocks), (0, 0), "{kind:?}: {s:?}");
        fx.after();
    }
}
