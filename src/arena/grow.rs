//! Registering committed slabs: a region of their own, or the chunk's tail region grown by
//! `ibv_rereg_mr(CHANGE_TRANSLATION)` while its keys were never handed out.
//!
//! Contract (keys handed out never change):
//! - a region is re-registered only in state `REREG`, entered from `PRIVATE` by CAS, so never
//!   after `keys_of`/`sge_of` (or a grant) has read its keys; the keys are compared after every
//!   re-registration and the table is refreshed (new keys are counted, never harmful);
//! - `ibv_rereg_mr(3)` errors: `Input`/`DontForkNew` leave the old region valid → kept, the new
//!   slabs get a region of their own; `DoForkOld` puts the new translation in force → success;
//!   `Cmd`/`CmdAndDoForkNew` leave the region unusable → it is deregistered and the whole range
//!   registered anew (its keys were never handed out, so no peer can hold them);
//! - `IBV_ACCESS_HUGETLB` is asked for on hugetlb slabs and dropped for good after the first
//!   `EOPNOTSUPP` (kernel rxe);
//! - no lock is held here: the NIC calls may allocate (see `nic`'s contract, "Allocation").

use super::stats::{add, sub};
use super::table::Reg;
use super::{Arena, Error, SLAB_SHIFT};
use crate::nic::{Access, Mr, ReregErrorKind, ReregFlags};
use std::sync::atomic::Ordering;

/// What came of trying to grow a tail region.
pub(crate) enum Grown {
    /// The region now covers the new slabs.
    Extended,
    /// It could not be grown (keys handed out, or the old region kept): register anew.
    Refused,
}

impl Arena {
    /// Register `[addr, addr + len)` as a region of its own and point its slabs at it.
    pub(crate) fn register_new(&self, addr: usize, len: usize, huge: bool) -> Result<u32, Error> {
        let mr = self.reg_mr(addr, len, huge)?;
        let id = self.install_region(mr, huge)?;
        self.table
            .publish(self.slab_index(addr), len >> SLAB_SHIFT, Some(id));
        add(&self.counters.registered_bytes, len as u64);
        Ok(id)
    }

    /// Give `mr` a registration id (not published yet).
    pub(crate) fn install_region(&self, mr: Mr, huge: bool) -> Result<u32, Error> {
        let Some(id) = self.table.new_reg() else {
            // Unreachable while every registration covers a slab of its own; refuse cleanly.
            return Err(Error::Config("registration table full"));
        };
        let reg = self.table.reg(id);
        // SAFETY: an id not in use: not live, and only this thread knows it.
        unsafe { reg.install(mr, huge) };
        add(&self.counters.mrs, 1);
        Ok(id)
    }

    /// Deregister region `id`, which no slot points at, and release its id. On a refusal (a
    /// window still bound) the region is put back and the error returned.
    /// `held`: the caller holds `REREG` on it, given up here before the id is released.
    pub(crate) fn release_region(&self, id: u32, held: bool) -> Option<crate::nic::Error> {
        let reg = self.table.reg(id);
        let done = |r| {
            if held {
                reg.end_rereg();
            }
            r
        };
        if !reg.is_live() {
            return done(None);
        }
        let huge = reg.is_huge();
        let odp = reg.is_odp();
        // SAFETY: no slot points at the region and its owner (the caller) alone touches it.
        let mr = unsafe { reg.take() };
        match mr.dereg() {
            Ok(()) => {
                sub(&self.counters.mrs, 1);
                if odp {
                    sub(&self.counters.odp_mrs, 1);
                }
                let _ = done(None);
                self.table.release(id);
                None
            }
            Err(e) => {
                // SAFETY: taken out above; not live, and the caller still owns it.
                unsafe { reg.install(e.mr, huge) };
                done(Some(e.error))
            }
        }
    }

    /// `reg_mr` with the arena's rights, `HUGETLB` on hugetlb slabs while the device takes it.
    pub(crate) fn reg_mr(&self, addr: usize, len: usize, huge: bool) -> Result<Mr, Error> {
        let hint = huge && self.hugetlb_hint.load(Ordering::Relaxed);
        let access = if hint {
            self.access | Access::HUGETLB
        } else {
            self.access
        };
        // SAFETY: the range is committed arena memory that stays mapped until the arena (which
        // owns every region) is dropped; the NIC may access it as `access` allows.
        let r = unsafe { self.pd.reg_mr(addr as *mut u8, len, access) };
        let r = match r {
            Err(e) if hint && e.errno() == Some(libc::EOPNOTSUPP) => {
                self.hugetlb_hint.store(false, Ordering::Relaxed);
                // SAFETY: as above.
                unsafe { self.pd.reg_mr(addr as *mut u8, len, self.access) }
            }
            r => r,
        };
        let mr = r?;
        add(&self.counters.regs, 1);
        Ok(mr)
    }

    /// Grow registration `id` to end at `new_end` by re-registration.
    /// `from` is where the region must end now (the first new slab).
    pub(crate) fn extend(&self, id: u32, from: usize, new_end: usize) -> Result<Grown, Error> {
        let reg = self.table.reg(id);
        if !reg.begin_rereg() {
            return Ok(Grown::Refused);
        }
        let (start, len) = reg.range();
        if !reg.is_live() || reg.is_odp() || start + len != from {
            // Purged (deregistered, its id maybe reused) since it was read as the chunk's
            // tail: register anew.
            reg.end_rereg();
            return Ok(Grown::Refused);
        }
        let r = self.extend_locked(reg, id, new_end);
        reg.end_rereg();
        r
    }

    fn extend_locked(&self, reg: &Reg, id: u32, new_end: usize) -> Result<Grown, Error> {
        let (start, old_len) = reg.range();
        let new_len = new_end - start;
        // SAFETY: this thread holds REREG on a live registration.
        let mr = unsafe { reg.mr_mut() };
        let keys = (mr.lkey(), mr.rkey());
        // SAFETY: `[start, new_end)` is committed arena memory (see `reg_mr`).
        let r = unsafe {
            mr.rereg(
                ReregFlags::CHANGE_TRANSLATION,
                None,
                start as *mut u8,
                new_len,
                Access::empty(),
            )
        };
        let in_force = |mr: &Mr| !mr.is_poisoned() && mr.addr() == start && mr.len() == new_len;
        let grown = match r {
            Ok(()) => true,
            Err(e) => match e.kind {
                // The new translation is in force even though fork marking failed.
                ReregErrorKind::DoForkOld if in_force(mr) => true,
                kind if kind.mr_usable() => false,
                _ => {
                    add(&self.counters.rereg_cmd_errors, 1);
                    if e.errno() == Some(libc::EOPNOTSUPP) {
                        self.rereg.store(false, Ordering::Relaxed);
                    }
                    return self.register_again(reg, id, start, old_len, new_len);
                }
            },
        };
        if !grown {
            return Ok(Grown::Refused);
        }
        if (mr.lkey(), mr.rkey()) != keys {
            add(&self.counters.rereg_new_keys, 1);
        }
        reg.refresh(mr);
        add(&self.counters.reregs, 1);
        add(&self.counters.registered_bytes, (new_len - old_len) as u64);
        self.table.publish(
            self.slab_index(start + old_len),
            (new_len - old_len) >> SLAB_SHIFT,
            Some(id),
        );
        Ok(Grown::Extended)
    }

    /// After `ERR_CMD`: drop the unusable region and register `[start, start + new_len)`
    /// anew; failing that, the old range alone (the new slabs then fail their run).
    fn register_again(
        &self,
        reg: &Reg,
        id: u32,
        start: usize,
        old_len: usize,
        new_len: usize,
    ) -> Result<Grown, Error> {
        // SAFETY: this thread holds REREG on a live registration.
        drop(unsafe { reg.take() });
        sub(&self.counters.mrs, 1);
        sub(&self.counters.registered_bytes, old_len as u64);
        let huge = reg.is_huge();
        let (len, result) = match self.reg_mr(start, new_len, huge) {
            Ok(mr) => (new_len, Ok((mr, Grown::Extended))),
            Err(e) => match self.reg_mr(start, old_len, huge) {
                Ok(mr) => (old_len, Ok((mr, Grown::Refused))),
                Err(_) => (0, Err(e)),
            },
        };
        match result {
            Ok((mr, grown)) => {
                // SAFETY: not live since `take`, and this thread holds REREG.
                unsafe { reg.install(mr, huge) };
                add(&self.counters.mrs, 1);
                add(&self.counters.registered_bytes, len as u64);
                if len == new_len {
                    self.table.publish(
                        self.slab_index(start + old_len),
                        (new_len - old_len) >> SLAB_SHIFT,
                        Some(id),
                    );
                }
                Ok(grown)
            }
            Err(e) => {
                // The old slabs are committed but no longer registered: `keys_of` says so.
                self.table
                    .publish(self.slab_index(start), old_len >> SLAB_SHIFT, None);
                Err(e)
            }
        }
    }
}
