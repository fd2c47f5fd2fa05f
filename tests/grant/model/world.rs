//! The model's world: devices, PDs, QPs, pools and grants, the oracle of every key a peer
//! was given, and the stale accesses that check it (see `model.rs`).

use super::super::*;
use super::{Fault, LEN, Op, PVec, RECENT, STALE, config, env};
use rdma_pool::grant::{GrantError, OwnedGrant};
use rdma_pool::nic::{ReregErrorKind, Verb};
use std::collections::HashMap;

/// Where a key given to a peer stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum St {
    Live,
    /// Dropped or forgotten handle: revoking in the background, or until the pool goes.
    Pending,
    /// Dead: at `step`, after `grants` grants of the run.
    Revoked {
        step: usize,
        grants: u64,
    },
}

/// A key a peer was given (`n` and `pool` are for the failure messages).
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)]
struct KeyRec {
    n: u64,
    kind: GrantKind,
    pd: usize,
    link: usize,
    pool: usize,
    addr: usize,
    st: St,
}

enum H {
    B(Grant<'static>),
    O(OwnedGrant<'static, PVec>),
}

impl H {
    fn g(&self) -> &Grant<'static> {
        match self {
            H::B(g) => g,
            H::O(g) => g.grant(),
        }
    }
}

struct GrantM {
    h: H,
    key: Rkey,
    fill: u8,
}

struct PoolM {
    id: usize,
    // Drop order: the grants borrow the buffers and the pool.
    grants: Vec<GrantM>,
    /// Keys of handles dropped, not known dead yet.
    dropped: Vec<Rkey>,
    /// Keys of handles forgotten: live until the pool goes.
    forgotten: Vec<Rkey>,
    bufs: Vec<(PVec, u8)>,
    pool: Box<Pool>,
}

impl PoolM {
    fn pool(&self) -> &'static Pool {
        // SAFETY: the pool is boxed (its address never moves) and outlives every grant and
        // buffer made from this reference: they are fields dropped before it.
        unsafe { &*(&*self.pool as *const Pool) }
    }
}

struct Link {
    id: usize,
    s: Qp,
    p: Qp,
    dead: bool,
}

struct PdM {
    id: usize,
    pools: Vec<PoolM>,
    links: Vec<Link>,
    attacker: Option<Link>,
    recv: (Buffer, Mr),
    pd: Pd,
}

struct Dev {
    name: &'static str,
    pds: Vec<PdM>,
    keys: HashMap<u32, KeyRec>,
    src: (Buffer, Mr),
    dst: (Buffer, Mr),
    peer: Side,
    cq: Cq,
    nic: Nic,
}

#[derive(Default, Debug, Clone, Copy)]
pub(super) struct Figures {
    pub(super) steps: u64,
    pub(super) grants: u64,
    pub(super) refused_grants: u64,
    pub(super) stale_accesses: u64,
    /// Refusals: `Limit`, `Unsupported`, `QpNotReady`, `Nic`, `Unavailable`.
    pub(super) refusals: [u64; 5],
}

pub(super) struct Model {
    devs: Vec<Dev>,
    step: usize,
    ids: usize,
    /// Revoked keys in the order they died: (device, key, step).
    revoked: Vec<(usize, u32, usize)>,
    touched: Vec<(usize, u32)>,
    rng: u64,
    old: usize,
    f: Figures,
}

pub(super) type R = Result<(), String>;

fn make_pd(dev: &Dev, ids: &mut usize) -> PdM {
    let pd = dev.nic.alloc_pd().unwrap();
    let mut b = buf(64, 0);
    let mr = reg_in(&pd, &mut b, RW).unwrap();
    *ids += 1;
    let mut p = PdM {
        id: *ids,
        pools: Vec::new(),
        links: Vec::new(),
        attacker: None,
        recv: (b, mr),
        pd,
    };
    for _ in 0..2 {
        *ids += 1;
        let l = make_link(dev, &p.pd, *ids);
        p.links.push(l);
    }
    p
}

/// A server QP in `pd` connected to a QP of the device's peer.
fn make_link(dev: &Dev, pd: &Pd, id: usize) -> Link {
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        ..Default::default()
    };
    let s = pd.create_qp(&dev.cq, &dev.cq, caps).unwrap();
    let p = dev
        .peer
        .pd
        .create_qp(&dev.peer.cq, &dev.peer.cq, caps)
        .unwrap();
    common::link(&p, &s);
    Link {
        id,
        s,
        p,
        dead: false,
    }
}

fn fill_of(x: usize) -> u8 {
    (x % 230) as u8 + 1
}

impl Model {
    pub(super) fn new(devs: &[u8]) -> Model {
        let mut m = Model {
            devs: Vec::new(),
            step: 0,
            ids: 0,
            revoked: Vec::new(),
            touched: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
            old: env("RDMA_POOL_MODEL_OLD", 64).min(64),
            f: Figures::default(),
        };
        for &c in devs {
            let (name, cfg) = config(c);
            let nic = Nic::soft_with(cfg);
            let cq = nic.create_cq(4096).unwrap();
            let peer = Side::new(Nic::soft());
            let src = scratch(&peer, 64, STALE);
            let dst = scratch(&peer, 64, 0);
            let mut dev = Dev {
                name,
                pds: Vec::new(),
                keys: HashMap::new(),
                src,
                dst,
                peer,
                cq,
                nic,
            };
            for _ in 0..2 {
                let pd = make_pd(&dev, &mut m.ids);
                dev.pds.push(pd);
            }
            m.devs.push(dev);
        }
        m
    }

    fn id(&mut self) -> usize {
        self.ids += 1;
        self.ids
    }

    fn rand(&mut self) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng as usize
    }

    /// A live link of PD `p` of device `d` (link `i` made anew if it died).
    fn live_link(&mut self, d: usize, p: usize, i: usize) -> usize {
        let i = i % self.devs[d].pds[p].links.len();
        if self.devs[d].pds[p].links[i].dead {
            let pd = self.devs[d].pds[p].pd.clone();
            let id = self.id();
            let l = make_link(&self.devs[d], &pd, id);
            self.devs[d].pds[p].links[i] = l;
        }
        i
    }

    fn new_pool(&mut self, d: usize, p: usize) -> Option<usize> {
        if self.devs[d].pds[p].pools.len() >= 3 {
            return None;
        }
        let pool = Pool::with_config(&self.devs[d].pds[p].pd, small_arena()).ok()?;
        let mut pm = PoolM {
            id: self.id(),
            grants: Vec::new(),
            dropped: Vec::new(),
            forgotten: Vec::new(),
            bufs: Vec::new(),
            pool: Box::new(pool),
        };
        let pool = pm.pool();
        for i in 0..4 {
            let fill = fill_of(pm.id * 4 + i);
            pm.bufs
                .push((allocator_api2::vec![in pool; fill; LEN], fill));
        }
        self.devs[d].pds[p].pools.push(pm);
        Some(self.devs[d].pds[p].pools.len() - 1)
    }

    /// Every pool, as (device, pd, pool) indices.
    fn pools(&self) -> Vec<(usize, usize, usize)> {
        let mut v = Vec::new();
        for (d, dev) in self.devs.iter().enumerate() {
            for (p, pd) in dev.pds.iter().enumerate() {
                v.extend((0..pd.pools.len()).map(|q| (d, p, q)));
            }
        }
        v
    }

    fn grants(&self) -> Vec<(usize, usize, usize, usize)> {
        let mut v = Vec::new();
        for (d, p, q) in self.pools() {
            let n = self.devs[d].pds[p].pools[q].grants.len();
            v.extend((0..n).map(|g| (d, p, q, g)));
        }
        v
    }

    fn pick_grant(&self, pick: u16) -> Option<(usize, usize, usize, usize)> {
        let v = self.grants();
        (!v.is_empty()).then(|| v[pick as usize % v.len()])
    }

    fn arm(&self, d: usize, f: Option<Fault>) {
        if let Some(f) = f {
            let soft = self.devs[d].nic.as_soft().unwrap();
            match f.verb {
                0 => soft.fail_next(Verb::AllocMw, f.n, libc::ENOMEM),
                1 => soft.fail_next(Verb::DeallocMw, f.n, libc::EBUSY),
                2 => soft.fail_next(Verb::DeregMr, f.n, libc::EBUSY),
                3 => soft.fail_next(Verb::PostSend, f.n, libc::ENOMEM),
                _ => soft.fail_next_rereg(ReregErrorKind::Cmd, f.n, libc::EINVAL),
            }
        }
    }

    fn disarm(&self, d: usize) {
        let soft = self.devs[d].nic.as_soft().unwrap();
        for v in [
            Verb::AllocMw,
            Verb::DeallocMw,
            Verb::DeregMr,
            Verb::PostSend,
        ] {
            soft.fail_next(v, 0, 0);
        }
        soft.fail_next_rereg(ReregErrorKind::Cmd, 0, 0);
    }

    fn died(&mut self, d: usize, key: Rkey) {
        let rec = self.devs[d].keys.get_mut(&key.0).expect("a given key");
        if !matches!(rec.st, St::Revoked { .. }) {
            rec.st = St::Revoked {
                step: self.step,
                grants: self.f.grants,
            };
            self.revoked.push((d, key.0, self.step));
        }
        self.touched.push((d, key.0));
    }

    /// Issue a grant of `kind` on pool `q` through link `l`; `Ok(None)` when refused with a
    /// typed error. Errors when the key was given before on the device.
    fn issue(
        &mut self,
        (d, p, q): (usize, usize, usize),
        kind: GrantKind,
        owned: bool,
        write: bool,
        b: usize,
        l: usize,
    ) -> Result<Option<usize>, String> {
        let l = self.live_link(d, p, l);
        let access = if write {
            Access::REMOTE_READ | Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        let dev = &self.devs[d];
        let (pdm, link) = (&dev.pds[p], &dev.pds[p].links[l]);
        let pm = &pdm.pools[q];
        let pool = pm.pool();
        let (h, fill) = if owned {
            let fill = fill_of(self.ids + 7);
            let v = allocator_api2::vec![in pool; fill; LEN];
            match pool.grant_owned_with(v, &link.s, access, kind) {
                Ok(g) => (Ok(H::O(g)), fill),
                Err((_, e)) => (Err(e), fill),
            }
        } else {
            let (v, fill) = &pm.bufs[b % pm.bufs.len()];
            // SAFETY: the buffer is read only after the peer's accesses completed (its own
            // completion polled), and no legitimate peer writes in this model.
            let s: &'static [u8] = unsafe { std::slice::from_raw_parts(v.as_ptr(), v.len()) };
            (
                unsafe { pool.grant_with(s, &link.s, access, kind) }.map(H::B),
                *fill,
            )
        };
        let mut h = match h {
            Ok(h) => h,
            Err(
                e @ (GrantError::Limit { .. }
                | GrantError::Unsupported(_)
                | GrantError::QpNotReady(_)
                | GrantError::Nic(_)
                | GrantError::Unavailable),
            ) => {
                let i = match e {
                    GrantError::Limit { .. } => 0,
                    GrantError::Unsupported(_) => 1,
                    GrantError::QpNotReady(_) => 2,
                    GrantError::Nic(_) => 3,
                    _ => 4,
                };
                self.f.refused_grants += 1;
                self.f.refusals[i] += 1;
                return Ok(None);
            }
            Err(e) => {
                return Err(format!(
                    "step {}: {kind:?} grant on {}: {e}",
                    self.step, dev.name
                ));
            }
        };
        self.f.grants += 1;
        let (key, addr, actual) = (h.g().rkey(), h.g().addr(), h.g().kind());
        if let Some(rec) = dev.keys.get(&key.0) {
            return Err(format!(
                "step {}: {actual:?} grant #{} on {} (pd {}, link {}, pool {}) carries {key}, given before: {rec:?}",
                self.step, self.f.grants, dev.name, pdm.id, link.id, pm.id
            ));
        }
        let rec = KeyRec {
            n: self.f.grants,
            kind: actual,
            pd: pdm.id,
            link: link.id,
            pool: pm.id,
            addr,
            st: St::Live,
        };
        let bind = match &mut h {
            H::B(g) => g.wait(&dev.cq, |_| {}),
            H::O(g) => g.wait(&dev.cq, |_| {}),
        };
        self.devs[d].keys.insert(key.0, rec);
        self.touched.push((d, key.0));
        match bind {
            Ok(()) => {}
            Err(GrantError::BindFailed(_) | GrantError::Revoked) => {
                // Revoked at once: the key never worked.
                drop(h);
                self.died(d, key);
                return Ok(None);
            }
            Err(e) => panic!("step {}: bind of {key}: {e}", self.step),
        }
        let grants = &mut self.devs[d].pds[p].pools[q].grants;
        grants.push(GrantM { h, key, fill });
        Ok(Some(grants.len() - 1))
    }

    fn revoke(&mut self, (d, p, q, g): (usize, usize, usize, usize)) {
        let gm = self.devs[d].pds[p].pools[q].grants.swap_remove(g);
        let GrantM { h, key, fill } = gm;
        let cq = &self.devs[d].cq;
        let (r, back) = match h {
            H::B(mut h) => {
                let r = h.revoke(cq, |_| {});
                let timed_out = matches!(r, Err(GrantError::Timeout(_)));
                (r, timed_out.then_some(H::B(h)))
            }
            H::O(h) => match h.revoke(cq, |_| {}) {
                Ok(_buf) => (Ok(()), None),
                Err((h, e)) => (Err(e), Some(H::O(h))),
            },
        };
        match r {
            Ok(()) | Err(GrantError::Revoked) => self.died(d, key),
            Err(GrantError::Timeout(_)) => {
                let h = back.expect("a handle still revoking");
                self.devs[d].pds[p].pools[q]
                    .grants
                    .push(GrantM { h, key, fill });
            }
            Err(e) => panic!("step {}: revoke {key}: {e}", self.step),
        }
    }

    /// Drop (or forget) a grant's handle: its key is pending until known dead.
    fn release(&mut self, (d, p, q, g): (usize, usize, usize, usize), forget: bool) {
        let pm = &mut self.devs[d].pds[p].pools[q];
        let gm = pm.grants.swap_remove(g);
        if forget {
            pm.forgotten.push(gm.key);
            std::mem::forget(gm.h);
        } else {
            pm.dropped.push(gm.key);
            drop(gm.h);
        }
        self.devs[d].keys.get_mut(&gm.key.0).unwrap().st = St::Pending;
        self.touched.push((d, gm.key.0));
    }

    fn drop_pool(&mut self, (d, p, q): (usize, usize, usize), how: u8) {
        while let Some(g) = self.devs[d].pds[p].pools[q].grants.len().checked_sub(1) {
            match how {
                0 => self.revoke((d, p, q, g)),
                1 => self.release((d, p, q, g), false),
                _ => self.release((d, p, q, g), true),
            }
        }
        let pm = self.devs[d].pds[p].pools.swap_remove(q);
        let pending: Vec<Rkey> = pm.dropped.iter().chain(&pm.forgotten).copied().collect();
        drop(pm);
        // The pool's windows and regions went with it: every key it gave out is dead.
        for k in pending {
            self.died(d, k);
        }
    }

    fn drop_pd(&mut self, d: usize, p: usize) {
        while !self.devs[d].pds[p].pools.is_empty() {
            self.drop_pool((d, p, 0), 1);
        }
        let old = self.devs[d].pds.swap_remove(p);
        drop(old);
        let pd = make_pd(&self.devs[d], &mut self.ids);
        self.devs[d].pds.push(pd);
    }

    /// Poll every device's CQ; keys of dropped handles are dead once their pool has no grant
    /// open but the live and forgotten handles.
    fn settle(&mut self) {
        for d in 0..self.devs.len() {
            while self.devs[d].cq.poll_one().unwrap().is_some() {}
            let mut dead = Vec::new();
            for pd in &mut self.devs[d].pds {
                for pm in &mut pd.pools {
                    let open = pm.pool.stats().grants.open;
                    let held = (pm.grants.len() + pm.forgotten.len()) as u64;
                    if !pm.dropped.is_empty() && open == held {
                        dead.append(&mut pm.dropped);
                    }
                }
            }
            for k in dead {
                self.died(d, k);
            }
        }
    }

    fn fail_link(&mut self, d: usize, p: usize, l: usize) {
        let dev = &mut self.devs[d];
        let pdm = &mut dev.pds[p];
        let l = l % pdm.links.len();
        if pdm.links[l].dead {
            return;
        }
        let mr = &pdm.recv.1;
        // SAFETY: the read's memory stays allocated until its completion is polled.
        unsafe {
            pdm.links[l]
                .s
                .post_read(0xfa11, &[mr.sge(0, 8).unwrap()], 0x1000, Rkey(0x00ba_d0ff))
        }
        .unwrap();
        while dev
            .cq
            .wait_one(WAIT)
            .expect("the failed read's completion")
            .wr_id
            != 0xfa11
        {}
        pdm.links[l].dead = true;
    }

    fn peer_inv(&mut self, (d, p, q, g): (usize, usize, usize, usize)) {
        let dev = &mut self.devs[d];
        let pdm = &mut dev.pds[p];
        let key = pdm.pools[q].grants[g].key;
        let rec = dev.keys[&key.0];
        let Some(link) = pdm.links.iter().find(|l| l.id == rec.link && !l.dead) else {
            return;
        };
        if rec.kind != GrantKind::Type2 || link.s.state().ok() != Some(QpState::Ready) {
            return;
        }
        // SAFETY: the receive and the send's memory stay allocated until their completions.
        unsafe { link.s.post_recv(0x1e, &[pdm.recv.1.sge(0, 64).unwrap()]) }.unwrap();
        unsafe {
            link.p
                .post_send_with_inv(0x1f, &[dev.src.1.sge(0, 8).unwrap()], key)
        }
        .unwrap();
        let wc = dev
            .peer
            .cq
            .wait_one(WAIT)
            .expect("the SEND_WITH_INV's completion");
        assert_eq!(
            wc.status,
            WcStatus::Success,
            "step {}: SEND_WITH_INV {key}: {wc:?}",
            self.step
        );
        self.died(d, key);
    }

    /// The peer's stale READ or WRITE with `key` of device `d`: refused, nothing moved.
    fn stale(&mut self, d: usize, key: u32, write: bool) -> R {
        let rec = self.devs[d].keys[&key];
        let Some(p) = self.devs[d].pds.iter().position(|x| x.id == rec.pd) else {
            return Ok(()); // its PD is gone, and every QP that could use it
        };
        // Target: the live grant on the key's index, else one of the PD's, else the old bytes.
        let idx = key >> 8;
        let mut target = (rec.addr, None);
        let mut any = None;
        for pd in &self.devs[d].pds {
            for gm in pd.pools.iter().flat_map(|pm| &pm.grants) {
                if gm.key.0 >> 8 == idx {
                    target = (gm.h.g().addr(), Some(gm.fill));
                } else if pd.id == rec.pd && any.is_none() {
                    any = Some((gm.h.g().addr(), Some(gm.fill)));
                }
            }
        }
        if target.1.is_none()
            && let Some(t) = any
        {
            target = t;
        }
        let dev = &mut self.devs[d];
        let pdm = &mut dev.pds[p];
        let link = if matches!(rec.kind, GrantKind::Type2 | GrantKind::Auto) {
            match pdm.links.iter_mut().find(|l| l.id == rec.link && !l.dead) {
                Some(l) => l,
                None => return Ok(()), // its QP failed or went
            }
        } else {
            if pdm.attacker.as_ref().is_none_or(|l| l.dead) {
                let caps = QpCaps {
                    max_send_sge: 4,
                    max_recv_sge: 4,
                    ..Default::default()
                };
                let s = pdm.pd.create_qp(&dev.cq, &dev.cq, caps).unwrap();
                let q = dev
                    .peer
                    .pd
                    .create_qp(&dev.peer.cq, &dev.peer.cq, caps)
                    .unwrap();
                common::link(&q, &s);
                pdm.attacker = Some(Link {
                    id: 0,
                    s,
                    p: q,
                    dead: false,
                });
            }
            pdm.attacker.as_mut().unwrap()
        };
        if link.s.state().ok() != Some(QpState::Ready)
            || link.p.state().ok() != Some(QpState::Ready)
        {
            link.dead = true;
            return Ok(());
        }
        dev.dst.0.as_mut_slice().fill(0);
        // SAFETY: the peer's memory stays allocated and untouched until the completion.
        unsafe {
            if write {
                link.p.post_write(
                    0x5a1e,
                    &[dev.src.1.sge(0, 64).unwrap()],
                    target.0 as u64,
                    Rkey(key),
                )
            } else {
                link.p.post_read(
                    0x5a1f,
                    &[dev.dst.1.sge(0, 64).unwrap()],
                    target.0 as u64,
                    Rkey(key),
                )
            }
        }
        .unwrap();
        let wc = dev
            .peer
            .cq
            .wait_one(WAIT)
            .expect("the stale access's completion");
        link.dead = true;
        if matches!(wc.status, WcStatus::LocAccessErr) {
            // The attacker's own bytes failed (the soft NIC saw its scratch pages move: the
            // kernel migrated them), before the key was tried: inconclusive. Fresh scratch.
            dev.src = scratch(&dev.peer, 64, STALE);
            dev.dst = scratch(&dev.peer, 64, 0);
            return Ok(());
        }
        self.f.stale_accesses += 1;
        let what = || {
            format!(
                "step {}: {}: stale {} with {:#010x} ({rec:?}) at {:#x}",
                self.step,
                dev.name,
                if write { "WRITE" } else { "READ" },
                key,
                target.0
            )
        };
        if !refused(wc.status) {
            return Err(format!("{}: completed {:?}", what(), wc.status));
        }
        if let (true, Some(fill)) = (write, target.1) {
            // SAFETY: a live grant's buffer; the peer's access completed.
            let now = unsafe { std::slice::from_raw_parts(target.0 as *const u8, 64) };
            if now.iter().any(|&b| b != fill) {
                return Err(format!("{}: bytes landed: {:?}", what(), &now[..8]));
            }
        }
        if !write && dev.dst.0.as_slice().iter().any(|&b| b != 0) {
            return Err(format!("{}: bytes read", what()));
        }
        Ok(())
    }

    /// The oracle's checks after a step.
    fn check(&mut self) -> R {
        let mut keys: Vec<(usize, u32)> = std::mem::take(&mut self.touched);
        let recent = self.step.saturating_sub(RECENT);
        keys.extend(
            self.revoked
                .iter()
                .rev()
                .take_while(|r| r.2 >= recent)
                .map(|r| (r.0, r.1)),
        );
        let older = self.revoked.iter().take_while(|r| r.2 < recent).count();
        for _ in 0..self.old.min(older) {
            let i = self.rand() % older;
            let r = self.revoked[i];
            keys.push((r.0, r.1));
        }
        keys.sort_unstable();
        keys.dedup();
        for (d, k) in keys {
            if !matches!(self.devs[d].keys[&k].st, St::Revoked { .. }) {
                continue;
            }
            let w = self.rand() % 2 == 0;
            self.stale(d, k, w)?;
            self.stale(d, k, !w)?;
        }
        Ok(())
    }

    pub(super) fn run(&mut self, op: &Op) -> R {
        let nd = self.devs.len();
        match *op {
            Op::NewPool { dev, pd } => {
                let d = dev as usize % nd;
                self.new_pool(d, pd as usize % 2);
            }
            Op::DropPool { pick, how } => {
                let v = self.pools();
                if !v.is_empty() {
                    self.drop_pool(v[pick as usize % v.len()], how);
                }
            }
            Op::DropPd { dev, pd } => self.drop_pd(dev as usize % nd, pd as usize % 2),
            Op::Grant {
                pick,
                kind,
                owned,
                write,
                buf,
                link,
                fault,
            } => {
                let v = self.pools();
                if v.is_empty() {
                    return Ok(());
                }
                let at = v[pick as usize % v.len()];
                self.arm(at.0, fault);
                let r = self.issue(at, kind, owned, write, buf as usize, link as usize);
                self.disarm(at.0);
                r?;
            }
            Op::Churn {
                pick,
                kind,
                n,
                drop,
            } => {
                let v = self.pools();
                if v.is_empty() {
                    return Ok(());
                }
                let at = v[pick as usize % v.len()];
                for i in 0..n as usize {
                    if let Some(g) = self.issue(at, kind, false, i % 2 == 0, i, i)? {
                        if drop {
                            self.release((at.0, at.1, at.2, g), false);
                        } else {
                            self.revoke((at.0, at.1, at.2, g));
                        }
                    }
                }
            }
            Op::Cycle { dev, pd, kind, n } => {
                let (d, p) = (dev as usize % nd, pd as usize % 2);
                for i in 0..n as usize {
                    let Some(q) = self.new_pool(d, p) else { break };
                    let g = self.issue((d, p, q), kind, false, true, i, i)?;
                    if let Some(g) = g {
                        self.revoke((d, p, q, g));
                    }
                    self.drop_pool((d, p, q), 0);
                }
            }
            Op::Revoke { pick, fault } => {
                if let Some(at) = self.pick_grant(pick) {
                    self.arm(at.0, fault);
                    self.revoke(at);
                    self.disarm(at.0);
                }
            }
            Op::Drop { pick, fault } => {
                if let Some(at) = self.pick_grant(pick) {
                    self.arm(at.0, fault);
                    self.release(at, false);
                    self.settle();
                    self.disarm(at.0);
                }
            }
            Op::Forget { pick } => {
                if let Some(at) = self.pick_grant(pick) {
                    self.release(at, true);
                }
            }
            Op::PeerInv { pick } => {
                if let Some(at) = self.pick_grant(pick) {
                    self.peer_inv(at);
                }
            }
            Op::FailLink { dev, pd, link } => {
                self.fail_link(dev as usize % nd, pd as usize % 2, link as usize)
            }
            Op::Drain => {}
        }
        self.settle();
        self.f.steps += 1;
        self.check()?;
        self.step += 1;
        Ok(())
    }

    /// No buffer of a live pool changed.
    /// Every pool dropped with its grants revoked; the figures.
    pub(super) fn teardown(mut self) -> Figures {
        for d in 0..self.devs.len() {
            for p in 0..self.devs[d].pds.len() {
                while !self.devs[d].pds[p].pools.is_empty() {
                    self.drop_pool((d, p, 0), 0);
                }
            }
        }
        self.f
    }

    pub(super) fn bytes_intact(&self) -> R {
        for dev in &self.devs {
            for pm in dev.pds.iter().flat_map(|p| &p.pools) {
                for (v, fill) in &pm.bufs {
                    if v.iter().any(|b| b != fill) {
                        return Err(format!(
                            "step {}: a buffer of pool {} on {} changed",
                            self.step, pm.id, dev.name
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
