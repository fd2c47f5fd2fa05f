//! Revocation and the completions of the pool's work requests.
//!
//! Contract: a grant's entry finishes (window back to the cache or deallocated, dedicated
//! region deregistered, ledger record closed, a parked block freed) exactly once, when
//! revocation was asked for and neither its bind nor its invalidation is in flight. A window
//! goes back to the cache only after an invalidation that completed successfully; in every
//! other case (QP cannot post, invalidation failed, peer invalidated, bind failed) it is
//! deallocated, which kills any key it had. Nothing here blocks but [`Grants::wait`]'s caller.

use super::{
    Active, GrantCtx, GrantError, GrantKind, Grants, OP_BIND, OP_INV, Wr, lock, parse, wr_id,
};
use crate::alloc::Core;
use crate::nic::{Access, Completion, QpState, WcStatus};
use slab::Slab;
use std::sync::atomic::Ordering::Relaxed;

/// A block leaving quarantine: `(first byte, bytes)`.
type Freed = Option<(usize, usize)>;

/// The completion sink of every pool's grants ([`crate::nic`] calls it from `Cq::poll`): a
/// bind's or invalidation's completion goes to the live pool whose tag it carries (none: its
/// pool is gone, and so is the grant); a receive reporting a peer's SEND_WITH_INV is noted by
/// every pool, with `nic`, the device of the CQ it came from (QP numbers are per device).
pub(crate) fn route(wc: &Completion, nic: &crate::nic::Nic) {
    crate::alloc::any_live_pool(|inner| {
        // SAFETY: the registry lock keeps the pool alive while the alias is used.
        let core = unsafe { Core::alias_of(inner) };
        // SAFETY: the one quarantine a pool installs is its grants' (`Grants::quarantine`),
        // taken out under the registry lock before they go.
        let Some(grants) = (unsafe { Grants::of(&core) }) else {
            return false;
        };
        let cx = GrantCtx {
            core: &core,
            grants,
        };
        cx.take_completion(wc, Some(nic)) && super::is_pool_wr_id(wc.wr_id)
    });
}

impl GrantCtx<'_> {
    /// [`Pool::on_completion`] of a completion the crate polled from a CQ of `nic` (`None`:
    /// the device is unknown, and a peer's invalidation is not noted).
    pub(crate) fn take_completion(&self, wc: &Completion, nic: Option<&crate::nic::Nic>) -> bool {
        let g = self.grants;
        let Some((op, tag, key, seq)) = parse(wc.wr_id) else {
            if let (Some(rkey), Some(nic)) = (wc.invalidated_rkey, nic) {
                g.peer_invalidated(nic, wc.qp_num, rkey);
            }
            return false;
        };
        if tag != g.tag {
            return false;
        }
        let freed = g.completed(self.core, op, key, seq, wc.status);
        unpark(self.core, freed);
        true
    }
}

/// Free a block of `core` that left quarantine.
pub(super) fn unpark(core: &Core, freed: Freed) {
    if let Some((block, _)) = freed {
        // SAFETY: the block was freed by its owner and parked; its last grant's key is dead
        // now, and the ledger hands it out once.
        unsafe { core.free_plain(block as *mut u8) };
    }
}

impl Grants {
    /// A completion of the pool's work request `op` for entry `key`.
    fn completed(&self, pool: &Core, op: u64, key: usize, seq: u16, status: WcStatus) -> Freed {
        // Every completion of the pool's frees its slot, whether its grant is still there.
        let _ = self
            .counters
            .in_flight
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
        let mut active = lock(&self.active);
        let a = active.get_mut(key).filter(|a| a.seq == seq)?;
        if let Some(l) = a.window.as_mut() {
            l.mw.settle(status);
        }
        match op {
            OP_BIND => {
                a.bind = Wr::Done(status);
                if status != WcStatus::Success {
                    self.counters.failed_binds.fetch_add(1, Relaxed);
                }
                if std::mem::take(&mut a.retry_inv) {
                    a.revoking = false;
                    self.start(pool, key, a);
                }
            }
            OP_INV => a.inv = Wr::Done(status),
            _ => {}
        }
        self.advance(pool, &mut active, key)
    }

    /// Finish entry `key` if its revocation can complete now; drop the entry once finished
    /// and orphaned.
    fn advance(&self, pool: &Core, active: &mut Slab<Active>, key: usize) -> Freed {
        let a = active.get_mut(key)?;
        let mut freed = None;
        if a.revoking && !a.done && a.bind != Wr::InFlight && a.inv != Wr::InFlight {
            freed = self.finish(pool, a);
        }
        if a.done && a.orphan {
            active.remove(key);
        }
        freed
    }

    /// Release what the grant holds (see the module contract) and close its record.
    fn finish(&self, pool: &Core, a: &mut Active) -> Freed {
        let (now, horizon) = self.clock();
        if let Some(l) = a.window.take() {
            // A window the peer invalidated (the device said so) is as free as one the pool
            // invalidated.
            if a.inv == Wr::Done(WcStatus::Success) || a.peer_invalidated {
                let expired = lock(&self.windows).give_back(l, a.keys, now, horizon);
                drop(expired);
            } else {
                // Deallocation invalidates the window whatever it was bound to. If it fails,
                // the key may still work: the grant stays open, its memory parked (fail closed),
                // and the next event on the grant tries again.
                let r = lock(&self.windows).dealloc_early(l, now, horizon);
                if let Err(b) = r {
                    let (l, e) = *b;
                    tracing::warn!(error = %e, "rdma_pool: a revoked grant's window could not be deallocated; kept open");
                    a.window = Some(l);
                    self.counters.stuck.fetch_add(1, Relaxed);
                    return None;
                }
                self.counters.by_dealloc.fetch_add(1, Relaxed);
            }
        }
        let len = a.region.as_ref().map_or(0, |m| m.len());
        let kept = match a.region.take() {
            // A region grant's key was the peer's: retire it, never give its index back early.
            Some(mr) if a.kind == GrantKind::Region => {
                // On an mkey-cache device the grant took its slot when issued.
                let slot = mr.pd().nic().caps().mkey_cache;
                self.retire_region(mr, slot).err().or_else(|| {
                    self.region_gone(len);
                    None
                })
            }
            region => self.drop_region(region, len),
        };
        if let Some(kept) = kept {
            // The key may still work: the grant stays open, its memory parked; the next event
            // on the grant tries again.
            a.region = Some(kept);
            self.counters.stuck.fetch_add(1, Relaxed);
            return None;
        }
        a.qp = None;
        a.done = true;
        // A region grant's key is dead: the key book starts its horizon (a window's keys go
        // to the book with the window).
        if let (Some(pd), GrantKind::Region) = (a.pd.as_ref(), a.kind) {
            super::keybook::release(pd.nic(), a.rkey, horizon);
        }
        self.counters.revoked.fetch_add(1, Relaxed);
        self.ledger.close(a.record, pool.granted_flag(a.block))
    }

    /// Start revoking `a` (entry `key`): post its invalidation, or deallocate its window when
    /// that cannot be posted, or deregister its region.
    fn start(&self, pool: &Core, key: usize, a: &mut Active) {
        a.revoking = true;
        let needs_inv = a.window.is_some()
            && !a.peer_invalidated
            && !matches!(a.bind, Wr::Done(s) if s != WcStatus::Success);
        if !needs_inv {
            return;
        }
        let (Some(qp), Some(l)) = (a.qp.clone(), a.window.as_mut()) else {
            return;
        };
        let wr = wr_id(OP_INV, self.tag, key, a.seq);
        let posted = match a.kind {
            GrantKind::Type2 => qp.invalidate(wr, &mut l.mw),
            _ => {
                // Type 1: a zero-length bind, with the region it is bound to (never NULL).
                let region = match a.region.as_ref() {
                    Some(r) => Some(r),
                    None => pool.arena().exposed_region(a.block),
                };
                match region {
                    Some(mr) => qp
                        .bind_type1(wr, &mut l.mw, mr, 0, 0, Access::empty())
                        .map(|_| a.keys += 1),
                    None => Err(crate::nic::Error::invalid(
                        crate::nic::Verb::BindMw,
                        "the grant's region is gone",
                    )),
                }
            }
        };
        match posted {
            Ok(()) => {
                self.counters.in_flight.fetch_add(1, Relaxed);
                a.inv = Wr::InFlight;
            }
            Err(e) if a.bind == Wr::InFlight && matches!(qp.state(), Ok(QpState::Ready)) => {
                // A full send queue behind a bind the device will still run: deallocating the
                // window now would fail that bind (and the QP). Try again when it completes.
                tracing::debug!(error = %e, "rdma_pool: invalidation not posted; retried after the bind");
                a.retry_inv = true;
            }
            Err(e) => {
                tracing::debug!(error = %e, "rdma_pool: invalidation not posted; deallocating the window");
                // The window goes in `finish`, by deallocation. A bind still in flight sits on a
                // failed QP: it completes flushed and is ignored.
                a.bind = match a.bind {
                    Wr::InFlight => Wr::Done(WcStatus::WrFlushErr),
                    b => b,
                };
                a.inv = Wr::Done(WcStatus::WrFlushErr);
            }
        }
    }

    /// Start revoking entry `key` for its handle.
    ///
    /// # Errors
    /// [`GrantError::Revoked`] when revocation was already asked for.
    pub(super) fn revoke(&self, pool: &Core, key: usize, seq: u16) -> Result<(), GrantError> {
        let mut active = lock(&self.active);
        let Some(a) = active.get_mut(key).filter(|a| a.seq == seq) else {
            return Err(GrantError::Revoked);
        };
        if a.revoking {
            return Err(GrantError::Revoked);
        }
        self.start(pool, key, a);
        let freed = self.advance(pool, &mut active, key);
        drop(active);
        unpark(pool, freed);
        Ok(())
    }

    /// The handle of entry `key` is dropped: revoke it if needed, and let the entry go once
    /// finished. Never blocks.
    pub(super) fn release(&self, pool: &Core, key: usize, seq: u16) {
        let mut active = lock(&self.active);
        let Some(a) = active.get_mut(key).filter(|a| a.seq == seq) else {
            return;
        };
        a.orphan = true;
        if !a.revoking {
            self.start(pool, key, a);
        }
        let freed = self.advance(pool, &mut active, key);
        drop(active);
        unpark(pool, freed);
    }

    /// Try again to finish entry `key` (a revocation whose region refused deregistration has
    /// no work request whose completion would retry it): whether it is finished now.
    pub(super) fn retry(&self, pool: &Core, key: usize, seq: u16) -> bool {
        let mut active = lock(&self.active);
        let Some(a) = active.get(key).filter(|a| a.seq == seq) else {
            return true;
        };
        if a.done {
            return true;
        }
        let freed = self.advance(pool, &mut active, key);
        let done = active.get(key).is_none_or(|a| a.seq != seq || a.done);
        drop(active);
        unpark(pool, freed);
        done
    }

    /// `(bind state, finished)` of entry `key`.
    pub(super) fn state(&self, key: usize, seq: u16) -> Option<(Option<WcStatus>, bool)> {
        let active = lock(&self.active);
        let a = active.get(key).filter(|a| a.seq == seq)?;
        let bind = match a.bind {
            Wr::Done(s) => Some(s),
            Wr::None => Some(WcStatus::Success),
            Wr::InFlight => None,
        };
        Some((bind, a.done))
    }

    /// A receive reported that a peer's SEND_WITH_INV invalidated `rkey` on QP `qpn`.
    fn peer_invalidated(&self, nic: &crate::nic::Nic, qpn: u32, rkey: crate::nic::Rkey) {
        let mut active = lock(&self.active);
        if let Some((_, a)) = active.iter_mut().find(|(_, a)| {
            a.kind == GrantKind::Type2
                && !a.done
                && a.rkey == rkey
                && a.qp
                    .as_ref()
                    .is_some_and(|q| q.qpn() == qpn && q.pd().nic().same_device(nic))
        }) {
            a.peer_invalidated = true;
            self.counters.peer_inv.fetch_add(1, Relaxed);
        }
    }

    /// The pool is dropped: deallocate every window still bound, deregister every dedicated
    /// region, and free every parked block (no handle is alive: they borrow the pool).
    pub(crate) fn shutdown(&self, pool: &Core) {
        let mut active = lock(&self.active);
        for (_, a) in active.iter_mut().filter(|(_, a)| !a.done) {
            a.revoking = true;
            a.inv = Wr::Done(WcStatus::WrFlushErr);
            a.bind = Wr::Done(WcStatus::WrFlushErr);
            let freed = self.finish(pool, a);
            unpark(pool, freed);
        }
        active.clear();
    }
}
