//! Issuing a grant: check the range, the QP and the rights, choose the kind, take a window
//! and a ledger record, post the bind.
//!
//! Contract: every check runs before anything is taken; whatever was taken for a grant that
//! then fails (dedicated region, ledger record, window) is returned before the error is.

use super::windows::{Lent, Take};
use super::{Active, GrantCtx, GrantError, GrantKind, Grants, OP_BIND, Wr, keybook, lock, wr_id};
use crate::nic::quirks::{self, Quirk};
use crate::nic::{Access, Mr, MwType, Qp, QpState, Rkey};
use std::sync::atomic::Ordering::Relaxed;

/// Longest window (mlx5's KLM descriptors cover 2 GiB; the soft NIC enforces it too).
const MAX_WINDOW: usize = 1 << 31;

/// What a grant is, once issued.
#[derive(Debug, Clone, Copy)]
pub(super) struct Issued {
    pub(super) key: usize,
    pub(super) seq: u16,
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) rkey: Rkey,
    pub(super) kind: GrantKind,
    pub(super) dedicated: bool,
}

/// A checked request: the block the range lies in and the region under it.
struct Checked<'p> {
    /// The PD of the grant's QP, and the rail it is attached as (`None`: the pool's own).
    pd: &'p crate::nic::Pd,
    block: (usize, usize),
    region: Option<&'p Mr>,
    kind: GrantKind,
    dedicated: bool,
}

impl GrantCtx<'_> {
    /// Check `[addr, addr + len)`, `qp` and `access`, and choose the kind.
    fn check_grant<'p, 'a>(
        &'p self,
        addr: usize,
        len: usize,
        qp: &'a Qp,
        access: Access,
        kind: GrantKind,
    ) -> Result<Checked<'a>, GrantError>
    where
        'p: 'a,
    {
        if len == 0 {
            return Err(GrantError::Empty);
        }
        if !self.contains(addr as *const u8) {
            return Err(GrantError::OutsidePool);
        }
        let block = self
            .block_span(addr)
            .ok_or(GrantError::NotAllocated { addr })?;
        // A small block's span comes from its page's geometry: where this thread owns the
        // page, its free lists tell a freed block (a slice kept past its free) from a live one.
        if self.check_live(block.0 as *const u8) == Err(crate::alloc::FreeError::NotLive) {
            return Err(GrantError::NotAllocated { addr });
        }
        let end = addr.saturating_add(len);
        if end > block.0 + block.1 {
            return Err(GrantError::AcrossBlocks {
                excess: end - (block.0 + block.1),
            });
        }
        // The QP names the device: the pool's own PD, or one attached as a rail.
        let rail = if qp.pd() == self.pd() {
            None
        } else {
            Some(
                self.arena()
                    .rail_of_pd(qp.pd())
                    .ok_or(GrantError::ForeignQp)?,
            )
        };
        let keys = match rail {
            None => self.keys_of(addr as *const u8),
            Some(r) => self.arena().keys_of_rail(addr as *const u8, r),
        }
        .ok_or(GrantError::Unregistered)?;
        if !keys.contains(addr, len) {
            return Err(GrantError::Unregistered);
        }
        if access.is_empty() || !Access::REMOTE.contains(access) {
            return Err(GrantError::Rights(access));
        }
        if rail.is_none() && self.arena().device_dead() {
            return Err(GrantError::Unavailable);
        }
        let caps = qp.pd().nic().caps();
        let windows = caps.max_mw > 0;
        let fits = len <= MAX_WINDOW;
        let kind = match kind {
            // Auto isolates: only a type 2 window is bound to the peer's QP. The kinds usable
            // from any QP of the PD (whose keys another client of the PD may guess) are opt-in.
            GrantKind::Auto if !(windows && caps.mw_type2) => {
                return Err(GrantError::Unsupported(
                    "the device has no type 2 windows, the only kind bound to the peer's QP; \
                     GrantKind::Type1 or GrantKind::Region work from any QP of the PD: ask for \
                     one explicitly",
                ));
            }
            GrantKind::Auto if !fits => {
                return Err(GrantError::Unsupported(
                    "a window covers at most 2 GiB (mlx5); GrantKind::Region covers more, but \
                     works from any QP of the PD: ask for it explicitly",
                ));
            }
            GrantKind::Auto => GrantKind::Type2,
            GrantKind::Region => GrantKind::Region,
            GrantKind::Type2 if !(windows && caps.mw_type2) => {
                return Err(GrantError::Unsupported("the device has no type 2 windows"));
            }
            GrantKind::Type1 if !(windows && caps.mw_type1) => {
                return Err(GrantError::Unsupported("the device has no type 1 windows"));
            }
            _ if !fits => {
                return Err(GrantError::Unsupported(
                    "a window covers at most 2 GiB (mlx5); ask for a region grant",
                ));
            }
            k => k,
        };
        // A window is bound through the QP: it must be able to post (`ibv_query_qp`, a system
        // call on verbs). A region grant does not use the QP, but the QP names the peer it is
        // for: one that is not connected, or failed, has none (and the grant would be open to
        // whoever uses the key).
        match qp.state()? {
            QpState::Ready => {}
            s => return Err(GrantError::QpNotReady(s)),
        }
        let region = self.arena().exposed_region_on(addr, rail);
        // A window over the pool's region is bounded by the window alone: where the device
        // does not enforce window bounds, or the region is the implicit ODP one, the window
        // gets a region of its own over exactly the range. A type 1 window on a rail gets one
        // too: its unbind needs the region, and a rail's regions go when it is detached.
        let dedicated = kind == GrantKind::Region
            || quirks::applies(caps, Quirk::MwBoundsNotEnforced)
            || region.is_none_or(|r| r.addr() == 0)
            || (rail.is_some() && kind == GrantKind::Type1);
        Ok(Checked {
            pd: qp.pd(),
            block,
            region,
            kind,
            dedicated,
        })
    }

    /// Issue a grant on `[addr, addr + len)`, which the caller keeps allocated while the
    /// grant's handle lives.
    pub(super) fn issue(
        &self,
        addr: usize,
        len: usize,
        qp: &Qp,
        access: Access,
        kind: GrantKind,
    ) -> Result<Issued, GrantError> {
        let g = self.grants;
        let _gate = g.rails_gate.read();
        let c = self.check_grant(addr, len, qp, access, kind)?;
        let dedicated = if c.dedicated {
            Some(g.dedicated_region(addr, len, access, &c)?)
        } else {
            None
        };
        let (block, block_len) = c.block;
        let flag = self.granted_flag(block);
        // A region grant's key was noted in the key book: never handed out, it is released
        // there (and stays refused for the horizon: the device had it live).
        let give_up = |region: Option<Mr>| {
            if let (Some(mr), GrantKind::Region) = (region.as_ref(), c.kind) {
                keybook::release(c.pd.nic(), mr.rkey(), g.clock().1);
                super::retire::give_issue_slot(c.pd.nic());
            }
            // Never handed out: dropping a refused region only logs.
            drop(g.drop_region(region, len));
        };
        let Some(record) = g.ledger.open(block, block_len, flag) else {
            give_up(dedicated);
            return Err(g.refuse(GrantError::Limit {
                what: "open grants",
                max: super::ledger::CAP as u64,
                hint: "a fixed bound per pool: revoke grants (or drop their handles) first",
            }));
        };
        let undo = |region| {
            give_up(region);
            g.ledger.close(record, flag);
        };
        let mut active = lock(&g.active);
        if active.len() >= super::MAX_ACTIVE {
            drop(active);
            undo(dedicated);
            return Err(g.refuse(GrantError::Limit {
                what: "grant entries",
                max: super::MAX_ACTIVE as u64,
                hint: "a fixed bound per pool: drop revoked grants' handles first",
            }));
        }
        let seq = (g.seq.fetch_add(1, Relaxed) & super::SEQ_MASK) as u16;
        let key = active.vacant_key();
        let mut a = Active {
            pd: Some(qp.pd().clone()),
            seq,
            kind: c.kind,
            window: None,
            keys: 0,
            region: None,
            qp: None,
            record,
            block,
            rkey: Rkey(0),
            bind: Wr::None,
            inv: Wr::None,
            revoking: false,
            done: false,
            orphan: false,
            peer_invalidated: false,
            retry_inv: false,
        };
        let mw_type = match c.kind {
            GrantKind::Type2 => Some(MwType::Type2),
            GrantKind::Type1 => Some(MwType::Type1),
            _ => None,
        };
        match mw_type {
            None => {
                let mr = dedicated.as_ref().expect("region grants are dedicated");
                a.rkey = mr.rkey();
            }
            Some(ty) => {
                let mr = dedicated.as_ref().or(c.region).expect("checked: a region");
                let wr = wr_id(OP_BIND, g.tag, key, seq);
                match g.bind(qp, ty, mr, addr, len, access, wr) {
                    Ok((lent, rkey)) => {
                        a.window = Some(lent);
                        a.keys = 1;
                        a.rkey = rkey;
                        a.bind = Wr::InFlight;
                        a.qp = Some(qp.clone());
                    }
                    Err(e) => {
                        drop(active);
                        undo(dedicated);
                        return Err(e);
                    }
                }
            }
        }
        a.region = dedicated;
        let rkey = a.rkey;
        active.insert(a);
        drop(active);
        let n = &g.counters;
        n.issued.fetch_add(1, Relaxed);
        super::keybook::CLOCK.fetch_add(1, Relaxed);
        match c.kind {
            GrantKind::Type2 => n.type2.fetch_add(1, Relaxed),
            GrantKind::Type1 => n.type1.fetch_add(1, Relaxed),
            _ => n.regions.fetch_add(1, Relaxed),
        };
        Ok(Issued {
            key,
            seq,
            addr,
            len,
            rkey,
            kind: c.kind,
            dedicated: c.dedicated,
        })
    }
}

/// Registrations (windows) tried for a region (window) grant whose keys the device keeps
/// handing back stale.
const FRESH_KEY_TRIES: usize = 64;

/// The refusal of a full key book.
pub(super) fn book_full(max: usize) -> GrantError {
    GrantError::Limit {
        what: "key book",
        max: max as u64,
        hint: "every key given to a peer is remembered for the key horizon, counted in later \
               grants and refusals of the process: entries lapse as they pass it (retry); a \
               shorter GrantLimits::key_horizon makes keys revoked from now on lapse sooner",
    }
}

impl Grants {
    /// Count a grant refused by a limit.
    pub(super) fn refuse(&self, e: GrantError) -> GrantError {
        if matches!(e, GrantError::Limit { .. }) {
            self.counters.refused.fetch_add(1, Relaxed);
        }
        e
    }

    /// A region of its own over exactly `[addr, addr + len)`, within the limits: with the
    /// grant's rights for a region grant, with `MW_BIND` only for a window over it.
    fn dedicated_region(
        &self,
        addr: usize,
        len: usize,
        access: Access,
        c: &Checked<'_>,
    ) -> Result<Mr, GrantError> {
        let n = &self.counters;
        let limits = self.limits();
        if n.dedicated.fetch_add(1, Relaxed) >= limits.regions {
            n.dedicated.fetch_sub(1, Relaxed);
            return Err(self.refuse(GrantError::Limit {
                what: "region grants",
                max: limits.regions,
                hint: "revoke region grants first, or raise GrantLimits::regions",
            }));
        }
        if n.dedicated_bytes.fetch_add(len as u64, Relaxed) + len as u64 > limits.region_bytes {
            n.dedicated.fetch_sub(1, Relaxed);
            n.dedicated_bytes.fetch_sub(len as u64, Relaxed);
            return Err(self.refuse(GrantError::Limit {
                what: "region grant bytes",
                max: limits.region_bytes,
                hint: "revoke region grants first, or raise GrantLimits::region_bytes",
            }));
        }
        if c.kind == GrantKind::Region
            && let Err(e) = self.region_room(c.pd.nic())
        {
            n.dedicated.fetch_sub(1, Relaxed);
            n.dedicated_bytes.fetch_sub(len as u64, Relaxed);
            return Err(e);
        }
        let rights = if c.kind == GrantKind::Region {
            access
        } else {
            Access::MW_BIND
        };
        let odp = if c.region.is_some_and(Mr::is_odp) {
            Access::ON_DEMAND
        } else {
            Access::empty()
        };
        // A region grant's key goes to the peer: never one the key book says a peer may still
        // hold (the device gave its index back, with that variant). Such a region is spoiled at
        // once (its remote rights taken, `retire.rs`) and kept while another is registered, so
        // that the device hands out another index; every key given out is noted.
        let mut spoiled = Vec::new();
        let r = (|| {
            for _ in 0..FRESH_KEY_TRIES {
                // SAFETY: the range lies in a live block of the pool, which stays mapped while
                // the arena lives; the region is deregistered or retired (moved off the range)
                // before the grant's record closes, so before the block can be reused.
                let mr = unsafe {
                    c.pd.reg_mr(addr as *mut u8, len, Access::LOCAL_WRITE | rights | odp)
                }
                .map_err(GrantError::Nic)?;
                if c.kind != GrantKind::Region {
                    // A window's region: its key goes to no peer (the window's does).
                    return Ok(mr);
                }
                let key = mr.rkey();
                let v = key.variant() as usize;
                // Noted (under the book's lock) unless a peer may still hold it.
                let fresh = |stale: [u64; 4]| (stale[v / 64] & 1 << (v % 64) == 0).then_some(key);
                match keybook::claim(c.pd.nic(), key.index(), fresh) {
                    Ok(Some(_)) => return Ok(mr),
                    Ok(None) => spoiled.extend(super::retire::spoil(mr)?),
                    Err(keybook::Full(max)) => {
                        // Never handed out: dropping it only logs.
                        drop(mr);
                        return Err(self.refuse(book_full(max)));
                    }
                }
            }
            Err(self.refuse(GrantError::Limit {
                what: "fresh region keys",
                max: FRESH_KEY_TRIES as u64,
                hint: "the device handed back only keys a peer may still hold: it has too few \
                       regions for the key horizon; lower GrantLimits::key_horizon or use a \
                       device with a larger max_mr",
            }))
        })();
        for mr in spoiled {
            // Stale keys: held with the revoked ones where the device has an mkey cache (which
            // would hand the key straight back), else given back (the book keeps them refused).
            if mr.pd().nic().caps().mkey_cache {
                drop(self.retire_region(mr, false));
            } else {
                super::retire::release(mr);
            }
        }
        if r.is_err() {
            n.dedicated.fetch_sub(1, Relaxed);
            n.dedicated_bytes.fetch_sub(len as u64, Relaxed);
            if c.kind == GrantKind::Region {
                super::retire::give_issue_slot(c.pd.nic());
            }
        }
        r
    }

    /// Deregister a dedicated region (if any) of a grant of `len` bytes. A refusal gives the
    /// region back: its key may still work, so the caller must keep the grant's memory out of
    /// use. (A region whose key was never handed out may be dropped instead: dropping logs.)
    pub(super) fn drop_region(&self, mr: Option<Mr>, len: usize) -> Option<Mr> {
        let mr = mr?;
        if let Err(e) = mr.dereg() {
            tracing::warn!(error = %e.error, "rdma_pool: a grant's region refused dereg");
            return Some(e.mr);
        }
        self.region_gone(len);
        None
    }

    /// A dedicated region of `len` bytes no longer covers a grant's memory.
    pub(super) fn region_gone(&self, len: usize) {
        self.counters.dedicated.fetch_sub(1, Relaxed);
        self.counters.dedicated_bytes.fetch_sub(len as u64, Relaxed);
    }

    /// Take a window of type `ty` and bind it to `[addr, addr + len)` of `mr` through `qp`.
    #[allow(clippy::too_many_arguments)]
    fn bind(
        &self,
        qp: &Qp,
        ty: MwType,
        mr: &Mr,
        addr: usize,
        len: usize,
        access: Access,
        wr: u64,
    ) -> Result<(Lent, Rkey), GrantError> {
        let (now, horizon) = self.clock();
        // Windows with no fresh key are kept lent until the loop ends (so that the device
        // hands out other indices meanwhile), then retired.
        let mut spent = Vec::new();
        let r = (|| {
            for _ in 0..FRESH_KEY_TRIES {
                let mut lent = lock(&self.windows)
                    .take(qp.pd(), ty, now, horizon)
                    .map_err(|e| match e {
                        Take::Nic(crate::nic::Error::Limit { max, .. }) => {
                            self.refuse(GrantError::Limit {
                                what: "max_mw",
                                max,
                                hint: "windows are held until the key horizon passes: revoke \
                                       grants, lower GrantLimits::key_horizon, or use a device \
                                       with more max_mw",
                            })
                        }
                        Take::Nic(e) => GrantError::Nic(e),
                        Take::Full(max) => self.refuse(book_full(max)),
                    })?;
                // The next key no peer may still hold (the window holds its index's entry in
                // the key book: a full book refused the window above).
                match lent.next_key() {
                    Some(key) => return Ok((lent, key)),
                    // No such key left on this window: hold it, take another.
                    None => spent.push(lent),
                }
            }
            Err(self.refuse(GrantError::Limit {
                what: "fresh window keys",
                max: FRESH_KEY_TRIES as u64,
                hint: "the device handed back only windows whose next keys a peer may still \
                       hold: it has too few windows for the key horizon; lower \
                       GrantLimits::key_horizon or use a device with a larger max_mw",
            }))
        })();
        if !spent.is_empty() {
            let mut w = lock(&self.windows);
            spent.into_iter().for_each(|l| w.retire(l, now));
        }
        let (mut lent, key) = r?;
        let off = addr - mr.addr();
        let r = match ty {
            MwType::Type2 => qp.bind_type2(wr, &mut lent.mw, mr, off, len, access, key.variant()),
            MwType::Type1 => qp.bind_type1(wr, &mut lent.mw, mr, off, len, access),
        };
        match r {
            Ok(rkey) => {
                if rkey != key {
                    // A driver whose type 1 bind did not take the next variant: the book
                    // gets the key the device chose too.
                    tracing::warn!(%rkey, %key, "rdma_pool: a bind took another key than predicted");
                    lent.gave(rkey);
                }
                lent.gave(key);
                self.counters.in_flight.fetch_add(1, Relaxed);
                Ok((lent, rkey))
            }
            Err(e) => {
                // Nothing was posted: the window skips the key (the book gets it anyway).
                lent.gave(key);
                drop(lock(&self.windows).give_back(lent, 1, now, horizon));
                Err(GrantError::Nic(e))
            }
        }
    }
}
