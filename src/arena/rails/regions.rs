//! Keeping every rail's registrations in step with the arena's runs: registering a run just
//! committed or revived on every rail, taking slabs about to be purged out of every pinned rail
//! region (or refusing the purge), and registering them again when the arena refuses it.
//!
//! Contract (see the module contract in `mod.rs`):
//! - each rail registers in its own mode: ODP, one region per chunk (and per run larger than a
//!   chunk), or pinned, one region per run; a refused pinned registration falls back to the
//!   rail's ODP region where ODP is usable there, else the run is unregistered on that rail and
//!   counted; a rail never fails a run;
//! - a purge first looks at every rail and changes nothing if a pinned region whose keys were
//!   handed out also covers live slabs (refused, counted); otherwise it deregisters the regions
//!   inside the purged slabs and splits the others, registering their live parts anew;
//! - the `SeqCst` fences here pair with the one in [`Arena::attach`], so a run committed during
//!   an attach is registered on the new rail by exactly one of the two threads;
//! - everything runs under the rails' lock, never together with the arena's state lock.

use super::{Held, R};
use crate::arena::register::RegMode;
use crate::arena::table::Table;
use crate::arena::{Arena, Error, SLAB_SHIFT};
use crate::nic::{Access, Mr};
use std::sync::atomic::{Ordering, fence};

impl Arena {
    /// Register the run `[addr, addr + len)` just committed (clearing its `PENDING` mark) or
    /// revived on every rail.
    pub(crate) fn rails_register(&self, addr: usize, len: usize) {
        let (s, e) = (self.slab_index(addr), self.slab_index(addr + len));
        self.unpend(s, e - s);
        // Pairs with the fence in `attach`: either the attach sees the run in use (and
        // registers it), or this thread sees the rail (and registers it, after the walk).
        fence(Ordering::SeqCst);
        if !self.rails.any() {
            return;
        }
        let held = self.rails.hold();
        for r in held.attached() {
            self.rail_cover(&held, r, s, e);
        }
    }

    /// Take slabs `[s, e)`, about to be purged, out of every pinned rail region. `false`:
    /// refused (a region whose keys were handed out also covers live slabs, or a device
    /// refused a deregistration); whatever was taken out is registered again then.
    pub(crate) fn rails_unregister(&self, s: usize, e: usize) -> bool {
        // Pairs with the fence in `attach` (the slabs are BUSY by now).
        fence(Ordering::SeqCst);
        if !self.rails.any() {
            return true;
        }
        let held = self.rails.hold();
        // First look, change nothing: a shared, exposed pinned region refuses the purge.
        for r in held.attached() {
            let Some(t) = self.rails.table(r) else {
                continue;
            };
            let mut i = s;
            while i < e {
                let Some(id) = t.reg_at(i) else {
                    i += 1;
                    continue;
                };
                let reg = t.reg(id);
                let (rs, re) = self.reg_slabs(reg.range());
                if !reg.is_odp() && reg.is_exposed() && (rs < s || re > e) {
                    self.rails.slots[r].c.purges_refused.fetch_add(1, R);
                    return false;
                }
                i = re.max(i + 1);
            }
        }
        for r in held.attached() {
            if !self.rail_unregister(&held, r, s, e) {
                for r in held.attached() {
                    self.rail_cover(&held, r, s, e);
                }
                return false;
            }
        }
        true
    }

    /// Register slabs `[s, e)` on every rail again after the arena refused their purge.
    pub(crate) fn rails_recover(&self, s: usize, e: usize) {
        if !self.rails.any() {
            return;
        }
        let held = self.rails.hold();
        for r in held.attached() {
            self.rail_cover(&held, r, s, e);
        }
    }

    fn reg_slabs(&self, (start, len): (usize, usize)) -> (usize, usize) {
        let rs = self.slab_index(start);
        (rs, rs + (len >> SLAB_SHIFT))
    }

    /// Register every maximal group of slabs in `[s, e)` that rail `r` does not cover.
    fn rail_cover(&self, held: &Held<'_>, r: usize, s: usize, e: usize) {
        let Some(t) = self.rails.table(r) else {
            return;
        };
        let mut i = s;
        while i < e {
            if t.reg_at(i).is_some() {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < e && t.reg_at(j).is_none() {
                j += 1;
            }
            self.rail_register(held, r, i, j);
            i = j;
        }
    }

    /// Register slabs `[s, e)` (one run, or a part of one) on rail `r` as its mode says.
    pub(super) fn rail_register(&self, held: &Held<'_>, r: usize, s: usize, e: usize) {
        let Some(tables) = self.rails.slots[r].tables.get() else {
            return;
        };
        let conf = held.conf(r);
        let c = &self.rails.slots[r].c;
        let Some(pd) = conf.pd.as_ref() else { return };
        let addr = self.base + (s << SLAB_SHIFT);
        let len = (e - s) << SLAB_SHIFT;
        let chunk = self.chunk_of(addr as *const u8).unwrap_or(0);
        let dedicated = self.chunk_of((addr + len - 1) as *const u8) != Some(chunk);
        let odp = || -> Result<u32, Error> {
            if !dedicated {
                if let Some(id) = tables
                    .chunk_odp
                    .get(chunk)
                    .and_then(|v| v.load(R).checked_sub(1))
                {
                    return Ok(id);
                }
            }
            let (oa, ol) = if dedicated {
                (addr, len)
            } else {
                (self.chunk_base(chunk), self.chunk_size())
            };
            // SAFETY: the range is the arena's own mapping (opened chunks), which outlives
            // every region over it; ODP needs no pages present.
            let mr = unsafe { pd.reg_mr(oa as *mut u8, ol, conf.access | Access::ON_DEMAND) }?;
            let id = Self::rail_install(&tables.table, mr)?;
            c.mrs.fetch_add(1, R);
            if !dedicated {
                if let Some(v) = tables.chunk_odp.get(chunk) {
                    v.store(id + 1, R);
                }
            }
            Ok(id)
        };
        let pinned = || -> Result<u32, Error> {
            // SAFETY: committed arena memory, mapped until the arena (which owns every
            // region of every rail) is dropped.
            let mr = unsafe { pd.reg_mr(addr as *mut u8, len, conf.access) }?;
            let id = Self::rail_install(&tables.table, mr)?;
            c.mrs.fetch_add(1, R);
            Ok(id)
        };
        let got = match conf.mode {
            RegMode::Odp => odp(),
            RegMode::Pinned => pinned().or_else(|e| {
                c.degradations.fetch_add(1, R);
                if conf.odp_usable { odp() } else { Err(e) }
            }),
        };
        match got {
            Ok(id) => {
                tables.table.publish(s, e - s, Some(id));
                c.registered_bytes.fetch_add(len as u64, R);
            }
            Err(err) => {
                if conf.mode == RegMode::Odp {
                    c.degradations.fetch_add(1, R);
                }
                c.unregistered_bytes.fetch_add(len as u64, R);
                tracing::warn!(
                    target: "rdma_pool::arena",
                    rail = r as u64,
                    error = %err,
                    bytes = len as u64,
                    "a rail refused a registration: the memory has no keys on that device"
                );
            }
        }
    }

    fn rail_install(table: &Table, mr: Mr) -> Result<u32, Error> {
        let Some(id) = table.new_reg() else {
            return Err(Error::Config("rail registration table full"));
        };
        // SAFETY: an id not in use: not live, and only this thread (under the rails' lock)
        // knows it.
        unsafe { table.reg(id).install(mr, false) };
        Ok(id)
    }

    /// Take slabs `[s, e)` out of rail `r`'s pinned regions (checked beforehand: no exposed
    /// region is split). `false` when the device refused a deregistration.
    fn rail_unregister(&self, held: &Held<'_>, r: usize, s: usize, e: usize) -> bool {
        let Some(t) = self.rails.table(r) else {
            return true;
        };
        let c = &self.rails.slots[r].c;
        let mut i = s;
        while i < e {
            let Some(id) = t.reg_at(i) else {
                // Unregistered on this rail: no longer counted once purged.
                let mut j = i + 1;
                while j < e && t.reg_at(j).is_none() {
                    j += 1;
                }
                let bytes = ((j - i) << SLAB_SHIFT) as u64;
                let _ = c
                    .unregistered_bytes
                    .fetch_update(R, R, |v| Some(v.saturating_sub(bytes)));
                i = j;
                continue;
            };
            let reg = t.reg(id);
            let (rs, re) = self.reg_slabs(reg.range());
            if reg.is_odp() {
                i = re.min(e).max(i + 1);
                continue;
            }
            t.publish(rs, re - rs, None);
            // SAFETY: no slot points at the region any more and the rails' lock excludes
            // every other writer; no grant holds it (grants keep their memory live, and live
            // memory is never purged).
            let mr = unsafe { reg.take() };
            if let Err(refused) = mr.dereg() {
                // SAFETY: taken out above; not live.
                unsafe { reg.install(refused.mr, false) };
                t.publish(rs, re - rs, Some(id));
                return false;
            }
            t.release(id);
            c.mrs.fetch_sub(1, R);
            c.registered_bytes
                .fetch_sub(((re - rs) << SLAB_SHIFT) as u64, R);
            // The live parts of a split region: registered anew (checked: never exposed).
            for (a, b) in [(rs, s), (e, re)] {
                if a < b {
                    self.rail_register(held, r, a, b);
                }
            }
            i = re.max(i + 1);
        }
        true
    }
}
