//! A model-based test of the whole pool: alloc, realloc, free (plain and while a grant is
//! revoking), CPU stores, grant, revoke, remote READ/WRITE through grants (inside, one byte
//! outside, without the right, with a revoked key, after the QP died), growth (blocks up to
//! 5 MiB), purge and prefetch, on a pinned or an ODP pool on the soft NIC, against a plain
//! reference model (a `Vec<u8>` per block, the grants' ranges and rights).
//!
//! After every step the bytes the step could touch are compared with the model, and every
//! remote access's outcome (success, or refused by the NIC) with the model's prediction;
//! every 64 steps, and after purges and refused accesses, every live block is compared whole.
//! No block a step hands out may overlap a live block, or a block freed while its grant was
//! revoking before the pool saw the invalidation complete. proptest shrinks a failure to a
//! minimal sequence. `cases() × 500` operations per run: 200 cases, 100k operations, on the
//! host; a few cases in the emulated rxe guest (`PROPTEST_CASES`).

use super::*;
use proptest::prelude::*;
use rdma_pool::arena::Registration;
use rdma_pool::grant::{Grant, GrantKind};
use std::alloc::Layout;

#[derive(Debug, Clone)]
pub enum Op {
    Alloc {
        size: usize,
        fill: u8,
    },
    Realloc {
        pick: usize,
        size: usize,
    },
    Free {
        pick: usize,
    },
    /// Drop a granted block's grant (revocation starts, without waiting) and free the block.
    FreeGranted {
        pick: usize,
    },
    Store {
        pick: usize,
        at: usize,
        byte: u8,
    },
    Grant {
        pick: usize,
        rights: u8,
        from: usize,
        len: usize,
    },
    Revoke {
        pick: usize,
    },
    Write {
        pick: usize,
        at: usize,
        len: usize,
        byte: u8,
        outside: bool,
    },
    Read {
        pick: usize,
        at: usize,
        len: usize,
        outside: bool,
    },
    Stale {
        pick: usize,
        write: bool,
    },
    Purge,
    Prefetch {
        pick: usize,
    },
    Drain,
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        30 => 1usize..=256,
        10 => 257usize..=8192,
        4 => 8193usize..=300_000,
        1 => (1usize << 20)..=(5 << 20),
    ]
}

pub fn op() -> impl Strategy<Value = Op> {
    let pick = any::<usize>;
    prop_oneof![
        12 => (size(), any::<u8>()).prop_map(|(size, fill)| Op::Alloc { size, fill }),
        3 => (pick(), size()).prop_map(|(pick, size)| Op::Realloc { pick, size }),
        7 => pick().prop_map(|pick| Op::Free { pick }),
        2 => pick().prop_map(|pick| Op::FreeGranted { pick }),
        5 => (pick(), pick(), any::<u8>()).prop_map(|(pick, at, byte)| Op::Store { pick, at, byte }),
        6 => (pick(), prop_oneof![1 => Just(1u8), 1 => Just(2u8), 6 => Just(3u8)], pick(), pick())
            .prop_map(|(pick, rights, from, len)| Op::Grant { pick, rights, from, len }),
        3 => pick().prop_map(|pick| Op::Revoke { pick }),
        8 => (pick(), pick(), pick(), any::<u8>(), prop::bool::weighted(0.03))
            .prop_map(|(pick, at, len, byte, outside)| Op::Write { pick, at, len, byte, outside }),
        8 => (pick(), pick(), pick(), prop::bool::weighted(0.03))
            .prop_map(|(pick, at, len, outside)| Op::Read { pick, at, len, outside }),
        1 => (pick(), any::<bool>()).prop_map(|(pick, write)| Op::Stale { pick, write }),
        1 => Just(Op::Purge),
        1 => pick().prop_map(|pick| Op::Prefetch { pick }),
        2 => Just(Op::Drain),
    ]
}

/// A grant as the model sees it.
struct GrantModel<'p> {
    g: Grant<'p>,
    /// Offset and length in the block.
    off: usize,
    len: usize,
    write: bool,
    read: bool,
    /// Bound on a QP that has since failed: its key works nowhere.
    dead: bool,
}

struct Block<'p> {
    ptr: *mut u8,
    data: Vec<u8>,
    grant: Option<GrantModel<'p>>,
}

/// What one run counted (for the closing figures).
#[derive(Debug, Default, Clone, Copy)]
pub struct Figures {
    pub ops: u64,
    pub remote_ok: u64,
    pub remote_refused: u64,
    pub grants: u64,
    /// Parked blocks seen handed out again (each checked: its grant's key was dead).
    pub reuse_checks: u64,
}

/// The server's pool, a client, and a QP pair that is rebuilt when an access kills it.
struct Bed {
    server: Side,
    client: Side,
    qs: Qp,
    qc: Qp,
    scratch: Mr,
    scratch_mem: Buffer,
}

const SCRATCH: usize = 64 << 10;

impl Bed {
    fn new() -> Bed {
        let (server, client) = (Side::new(Nic::soft()), Side::new(Nic::soft()));
        let (qs, qc) = connect(&server, &client);
        let (scratch_mem, scratch) = client.reg_buf(SCRATCH, 0, RW);
        Bed {
            server,
            client,
            qs,
            qc,
            scratch,
            scratch_mem,
        }
    }

    fn reconnect(&mut self) {
        (self.qs, self.qc) = connect(&self.server, &self.client);
    }

    /// A client WRITE (of `byte` × `len`) or READ of `[addr, addr + len)` with `rkey`: its
    /// status, and for a READ the bytes read.
    fn access(&mut self, write: bool, addr: u64, len: usize, rkey: Rkey, byte: u8) -> WcStatus {
        if write {
            self.scratch_mem.as_mut_slice()[..len].fill(byte);
            // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
            unsafe {
                self.qc
                    .post_write(1, &[self.scratch.sge(0, len).unwrap()], addr, rkey)
            }
            .unwrap();
        } else {
            self.scratch_mem.as_mut_slice()[..len].fill(0xCC);
            // SAFETY: the read's memory stays allocated and unread until its completion is polled.
            unsafe {
                self.qc
                    .post_read(2, &[self.scratch.sge(0, len).unwrap()], addr, rkey)
            }
            .unwrap();
        }
        self.client.wait().status
    }
}

fn check(b: &Block<'_>) {
    // SAFETY: a live block of at least `data.len()` bytes.
    let real = unsafe { std::slice::from_raw_parts(b.ptr, b.data.len()) };
    if real != b.data.as_slice() {
        let i = real.iter().zip(&b.data).position(|(x, y)| x != y).unwrap();
        panic!(
            "block {:?} ({} bytes) differs from the model at byte {i}: {} != {}",
            b.ptr,
            b.data.len(),
            real[i],
            b.data[i]
        );
    }
}

/// A block freed while its grant was revoking.
#[derive(Clone, Copy)]
struct Parked {
    span: (usize, usize),
    /// The grant's address and key.
    addr: u64,
    rkey: Rkey,
    /// The pool may have seen the invalidation complete: its QP had failed (the window is
    /// deallocated at once), or the server's CQ was polled since.
    seen: bool,
}

/// The server's CQ was polled: every invalidation posted so far may have been seen.
fn polled(parked: &mut [Parked]) {
    parked.iter_mut().for_each(|p| p.seen = true);
}

/// `span` was just handed out: any parked block it overlaps was released, so the key of the
/// grant that parked it must be dead (a WRITE with it is refused, and changes nothing).
fn reused(
    parked: &mut Vec<Parked>,
    span: (usize, usize),
    blocks: &mut [Block<'_>],
    bed: &mut Bed,
    f: &mut Figures,
) {
    let mut k = 0;
    while k < parked.len() {
        let Parked {
            span: q,
            addr,
            rkey,
            seen,
        } = parked[k];
        if !overlaps(span, q) {
            k += 1;
            continue;
        }
        assert!(
            seen,
            "a parked block was handed out again before the pool could see its invalidation"
        );
        let st = bed.access(true, addr, 1, rkey, 0xEE);
        assert_ne!(
            st,
            WcStatus::Success,
            "a parked block was handed out again while its grant's key still worked"
        );
        f.remote_refused += 1;
        f.reuse_checks += 1;
        parked.swap_remove(k);
        kill(blocks, bed, parked);
    }
}

/// A refused access killed both QPs: every window bound on them is dead; connect anew. The
/// application revokes the grants that were already dead before (their revocation meets a
/// failed QP: the pool deallocates the window); the others stay, dead, for later accesses.
fn kill(blocks: &mut [Block<'_>], bed: &mut Bed, parked: &mut [Parked]) {
    for b in blocks.iter_mut() {
        match b.grant.as_mut() {
            Some(g) if g.dead => {
                let mut g = b.grant.take().unwrap();
                g.g.revoke(&bed.server.cq, |_| {}).unwrap();
                polled(parked);
                assert!(g.g.is_revoked());
            }
            Some(g) => g.dead = true,
            None => {}
        }
    }
    bed.reconnect();
}

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// Run `ops` on a fresh pool registered as `mode`; returns what it counted.
pub fn run(ops: &[Op], mode: Registration) -> Figures {
    let mut bed = Bed::new();
    let pool = Pool::with_config(
        &bed.server.pd,
        ArenaConfig {
            registration: mode,
            ..small_arena()
        },
    )
    .unwrap();
    let mut f = Figures::default();
    let mut blocks: Vec<Block<'_>> = Vec::new();
    // Blocks freed while their grant was revoking, with that grant's key: handed out again
    // only once the pool saw the invalidation complete, so the key must be dead by then.
    let mut parked: Vec<Parked> = Vec::new();
    // Keys revoked, with the address they were for.
    let mut revoked: Vec<(u64, usize, Rkey)> = Vec::new();
    let ignore = |_wc: Completion| {};
    for (step, op) in ops.iter().enumerate() {
        f.ops += 1;
        let n = blocks.len();
        let mut full_check = step % 64 == 63;
        let mut touched: Option<usize> = None;
        let remote = match *op {
            Op::Write {
                pick,
                at,
                len,
                byte,
                outside,
            } => Some((true, pick, at, len, byte, outside)),
            Op::Read {
                pick,
                at,
                len,
                outside,
            } => Some((false, pick, at, len, 0, outside)),
            _ => None,
        };
        if let Some((write, pick, at, len, byte, outside)) = remote
            && n > 0
        {
            // Mostly a live grant; one access in ten may meet a dead one.
            let any_grant = pick % 10 == 0;
            let targets: Vec<usize> = (0..n)
                .filter(|&i| {
                    blocks[i]
                        .grant
                        .as_ref()
                        .is_some_and(|g| any_grant || !g.dead)
                })
                .collect();
            if targets.is_empty() {
                continue;
            }
            let i = targets[(pick / 10) % targets.len()];
            let gm = blocks[i].grant.as_ref().unwrap();
            let (off, len) = if outside {
                // The grant's last byte and the one after it.
                (gm.off + gm.len - 1, 2)
            } else {
                let at = at % gm.len;
                (gm.off + at, 1 + len % (gm.len - at).min(SCRATCH))
            };
            let expect = !gm.dead && !outside && if write { gm.write } else { gm.read };
            let addr = blocks[i].ptr as u64 + off as u64;
            let rkey = gm.g.rkey();
            let st = bed.access(write, addr, len, rkey, byte);
            let b = &mut blocks[i];
            if expect {
                assert_eq!(st, WcStatus::Success, "step {step}: {op:?}");
                f.remote_ok += 1;
                if write {
                    b.data[off..off + len].fill(byte);
                } else {
                    assert_eq!(
                        &bed.scratch_mem.as_slice()[..len],
                        &b.data[off..off + len],
                        "step {step}: a READ brought other bytes"
                    );
                }
                check(b);
            } else {
                assert_ne!(st, WcStatus::Success, "step {step}: {op:?} must be refused");
                f.remote_refused += 1;
                // The access killed both QPs: every window bound on them is dead.
                kill(&mut blocks, &mut bed, &mut parked);
                blocks.iter().for_each(check);
            }
            continue;
        }
        match *op {
            Op::Alloc { size, fill } => {
                let layout = Layout::from_size_align(size, 8).unwrap();
                let p = pool.alloc(layout);
                assert!(!p.is_null());
                let span = (p as usize, size);
                for b in &blocks {
                    assert!(!overlaps(span, (b.ptr as usize, b.data.len())), "overlap");
                }
                reused(&mut parked, span, &mut blocks, &mut bed, &mut f);
                let k = pool.keys_of(p).expect("registered");
                assert!(k.contains(p as usize, size));
                // SAFETY: a fresh block of `size` bytes.
                unsafe { std::ptr::write_bytes(p, fill, size) };
                blocks.push(Block {
                    ptr: p,
                    data: vec![fill; size],
                    grant: None,
                });
                touched = Some(blocks.len() - 1);
            }
            Op::Realloc { pick, size } if n > 0 => {
                let i = pick % n;
                if blocks[i].grant.is_some() {
                    continue;
                }
                let b = &mut blocks[i];
                let layout = Layout::from_size_align(b.data.len(), 8).unwrap();
                // SAFETY: a live block of this pool with that layout.
                let q = unsafe { pool.realloc(b.ptr, layout, size) };
                assert!(!q.is_null());
                b.ptr = q;
                let old = b.data.len();
                b.data.resize(size, 0);
                if size > old {
                    // SAFETY: the block has `size` bytes now.
                    unsafe { std::ptr::write_bytes(q.add(old), 0, size - old) };
                }
                let span = (q as usize, size);
                for (j, o) in blocks.iter().enumerate() {
                    assert!(j == i || !overlaps(span, (o.ptr as usize, o.data.len())));
                }
                reused(&mut parked, span, &mut blocks, &mut bed, &mut f);
                touched = Some(i);
            }
            Op::Free { pick } if n > 0 => {
                let i = pick % n;
                if blocks[i].grant.is_some() {
                    continue;
                }
                let b = blocks.swap_remove(i);
                check(&b);
                // SAFETY: a live block of this pool.
                unsafe { pool.free(b.ptr) };
            }
            Op::FreeGranted { pick } if n > 0 => {
                let i = pick % n;
                if blocks[i].grant.is_none() {
                    continue;
                }
                let mut b = blocks.swap_remove(i);
                check(&b);
                let span = (b.ptr as usize, b.data.len());
                let gm = b.grant.take().unwrap();
                let key = (gm.g.wire().addr, gm.g.rkey(), gm.dead);
                drop(gm);
                // SAFETY: a live block of this pool; its grant is revoking: the pool parks it.
                unsafe { pool.free(b.ptr) };
                parked.push(Parked {
                    span,
                    addr: key.0,
                    rkey: key.1,
                    seen: key.2,
                });
                assert!(pool.stats().grants.quarantined_blocks <= parked.len() as u64);
            }
            Op::Store { pick, at, byte } if n > 0 => {
                let i = pick % n;
                let b = &mut blocks[i];
                let at = at % b.data.len();
                // SAFETY: inside a live block.
                unsafe { *b.ptr.add(at) = byte };
                b.data[at] = byte;
                touched = Some(i);
            }
            Op::Grant {
                pick,
                rights,
                from,
                len,
            } if n > 0 => {
                let i = pick % n;
                let b = &mut blocks[i];
                if b.grant.is_some() {
                    continue;
                }
                let off = from % b.data.len();
                let len = 1 + len % (b.data.len() - off);
                let mut access = Access::empty();
                if rights & 1 != 0 {
                    access |= Access::REMOTE_WRITE;
                }
                if rights & 2 != 0 {
                    access |= Access::REMOTE_READ;
                }
                // SAFETY: the block outlives the grant: it is revoked (or dropped, then
                // parked) before the block is freed.
                let slice: &'static [u8] =
                    unsafe { std::slice::from_raw_parts(b.ptr.add(off), len) };
                // SAFETY: the test accesses the buffer only once the peer's accesses through the key completed, or after revocation.
                let mut g =
                    unsafe { pool.grant_with(slice, &bed.qs, access, GrantKind::Auto) }.unwrap();
                g.wait(&bed.server.cq, ignore).unwrap();
                polled(&mut parked);
                f.grants += 1;
                b.grant = Some(GrantModel {
                    g,
                    off,
                    len,
                    write: access.contains(Access::REMOTE_WRITE),
                    read: access.contains(Access::REMOTE_READ),
                    dead: false,
                });
            }
            Op::Revoke { pick } if n > 0 => {
                let i = pick % n;
                if let Some(mut gm) = blocks[i].grant.take() {
                    gm.g.revoke(&bed.server.cq, ignore).unwrap();
                    polled(&mut parked);
                    assert!(gm.g.is_revoked());
                    let w = gm.g.wire();
                    revoked.push((w.addr, w.len as usize, w.rkey));
                }
            }
            Op::Stale { pick, write } if !revoked.is_empty() => {
                let (addr, len, rkey) = revoked[pick % revoked.len()];
                let st = bed.access(write, addr, len.min(SCRATCH), rkey, 0xEE);
                assert_ne!(st, WcStatus::Success, "step {step}: a revoked key worked");
                f.remote_refused += 1;
                kill(&mut blocks, &mut bed, &mut parked);
                full_check = true;
            }
            Op::Purge => {
                pool.purge();
                full_check = true;
            }
            Op::Prefetch { pick } if n > 0 => {
                let b = &blocks[pick % n];
                // SAFETY: a live block.
                let s = unsafe { std::slice::from_raw_parts(b.ptr, b.data.len()) };
                pool.prefetch(s, Advice::PrefetchWrite).unwrap();
                touched = Some(pick % n);
            }
            Op::Drain => {
                while let Some(wc) = bed.server.cq.poll_one().unwrap() {
                    assert!(!rdma_pool::nic::is_reserved_wr_id(wc.wr_id), "{wc:?}");
                }
                // The soft NIC completes an invalidation as it is posted: once its completion
                // is seen, nothing stays parked.
                assert_eq!(pool.stats().grants.quarantined_blocks, 0);
                polled(&mut parked);
            }
            _ => {}
        }
        if let Some(i) = touched {
            check(&blocks[i]);
        }
        if full_check {
            blocks.iter().for_each(check);
        }
    }
    blocks.iter().for_each(check);
    for mut b in blocks {
        if let Some(mut gm) = b.grant.take() {
            gm.g.revoke(&bed.server.cq, ignore).unwrap();
        }
        // SAFETY: a live block, its grant revoked.
        unsafe { pool.free(b.ptr) };
    }
    while let Some(wc) = bed.server.cq.poll_one().unwrap() {
        assert!(!rdma_pool::nic::is_reserved_wr_id(wc.wr_id), "{wc:?}");
    }
    let s = pool.stats().grants;
    assert_eq!((s.open, s.quarantined_blocks), (0, 0), "{s:?}");
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
    f
}

/// Totals over the run, printed every 20k operations (`--nocapture` shows them).
fn tally(f: Figures) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static T: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
    let v = [
        f.ops,
        f.remote_ok,
        f.remote_refused,
        f.grants,
        f.reuse_checks,
    ];
    let before = T[0].fetch_add(f.ops, Relaxed);
    for (t, x) in T.iter().zip(v).skip(1) {
        t.fetch_add(x, Relaxed);
    }
    if (before + f.ops) / 20_000 != before / 20_000 {
        eprintln!(
            "model: {} ops, {} remote accesses as predicted ({} refused), {} grants, {} reuses of parked memory checked",
            T[0].load(Relaxed),
            T[1].load(Relaxed) + T[2].load(Relaxed),
            T[2].load(Relaxed),
            T[3].load(Relaxed),
            T[4].load(Relaxed)
        );
    }
}

/// 200 cases of 500 operations: 100k operations per run on the host; a few cases in the
/// emulated rxe guest (`PROPTEST_CASES`, set by `scripts/test.sh`).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
    #[test]
    fn the_whole_pool_matches_the_reference_model(
        ops in proptest::collection::vec(op(), 500),
        odp in any::<bool>(),
    ) {
        let _g = serial();
        let mode = if odp { Registration::Odp } else { Registration::Pinned };
        let f = run(&ops, mode);
        prop_assert_eq!(f.ops, 500);
        tally(f);
    }
}

/// A fixed sequence through every operation, so that each kind is known to run (and to
/// count) whatever proptest draws.
#[test]
fn every_operation_runs_and_counts() {
    let _g = serial();
    let ops = vec![
        Op::Alloc {
            size: 5000,
            fill: 1,
        },
        Op::Alloc {
            size: 3 << 20,
            fill: 2,
        },
        Op::Grant {
            pick: 0,
            rights: 3,
            from: 100,
            len: 1000,
        },
        Op::Write {
            pick: 0,
            at: 0,
            len: 10,
            byte: 9,
            outside: false,
        },
        Op::Read {
            pick: 0,
            at: 5,
            len: 20,
            outside: false,
        },
        Op::Write {
            pick: 0,
            at: 0,
            len: 0,
            byte: 7,
            outside: true,
        },
        Op::Grant {
            pick: 1,
            rights: 2,
            from: 0,
            len: 4096,
        },
        Op::Write {
            pick: 1,
            at: 0,
            len: 10,
            byte: 9,
            outside: false,
        },
        Op::Revoke { pick: 1 },
        Op::Stale {
            pick: 0,
            write: true,
        },
        Op::Store {
            pick: 1,
            at: 77,
            byte: 3,
        },
        Op::FreeGranted { pick: 0 },
        Op::Alloc {
            size: 5000,
            fill: 4,
        },
        Op::Drain,
        Op::Realloc {
            pick: 0,
            size: 9000,
        },
        Op::Purge,
        Op::Prefetch { pick: 0 },
        Op::Free { pick: 0 },
    ];
    for mode in [Registration::Pinned, Registration::Odp] {
        let f = run(&ops, mode);
        assert_eq!((f.ops, f.grants), (ops.len() as u64, 2), "{f:?}");
        // Inside, READ: ok; one byte outside; WRITE without the right; the revoked key.
        assert_eq!((f.remote_ok, f.remote_refused), (2, 3), "{f:?}");
    }
}
