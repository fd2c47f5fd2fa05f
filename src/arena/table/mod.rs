//! The key table: which registration covers each slab, answered in O(1) without a lock.
//!
//! Contract: `slots[i].meta` holds `0` (slab `i` of the reservation is not registered),
//! `id + 1` where `regs[id]` is the live registration covering slab `i`, or `STEPPED_BIT`: the
//! slab is registered in steps of [`STEP`] bytes (`step.rs`), and `steps[j]` (slab `i`'s
//! `j - i·STEPS`-th step) says by what, with the same encoding and protocol as a slab's slot
//! (a step's slot also carries `BUSY_BIT` while one thread registers or deregisters it, and
//! `UNREG_BIT`, with no id, where its pages were served unregistered: counted in the
//! arena's `unregistered_bytes` until it is registered or given back). A
//! slot's id is published (`Release`) only after the registration's fields are written. Once the registration's keys
//! are handed out, the slot caches them (keys, start, len) and sets `EXPOSED_BIT` in `meta`, so
//! `keys_of` is one slot read: a load of `meta` and three loads from the same cache line. A
//! registration's `state` is
//! `PRIVATE` (keys never handed out), `EXPOSED` (handed out: its fields never change again)
//! or `REREG` (a grower is re-registering it; `keys_of` waits for that one call).
//!
//! Invariants:
//! - `slots[i].meta & ID == id + 1  ⇒  regs[id].start <= base + i·SLAB < regs[id].start +
//!   regs[id].len`, and with `EXPOSED_BIT` the slot's cached fields equal the registration's;
//! - a registration never shrinks, and its slots never point elsewhere while it lives;
//! - `state == EXPOSED ⇒ (lkey, rkey, start, len)` are final;
//! - `steps[j].meta & ID == id + 1 ⇒` the slab of step `j` is stepped and `regs[id]` covers
//!   step `j` (as above, at step granularity);
//! - ids come from a counter or from the stack of released ids (a registration the purge
//!   deregistered): an id is released only after no slot points at it, so
//!   `next_reg - |released| <= slabs + 1 + step_slabs · STEPS` (every live registration but
//!   the implicit ODP one and the steps' covers at least one slab of its own, and at most
//!   `stepped <= step_slabs` slabs have steps).

use super::{SLAB, SLAB_SHIFT};
use crate::nic::{Lkey, Mr, Rkey};
use crate::sys::os::MmapArray;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

mod budget;
mod steps;

pub(crate) use budget::Budget;
pub(crate) use steps::StepState;

pub(crate) const PRIVATE: u8 = 0;
pub(crate) const EXPOSED: u8 = 1;
pub(crate) const REREG: u8 = 2;

/// In `Slot::meta`: the slot caches the final keys and range of its registration.
const EXPOSED_BIT: u64 = 1 << 63;
/// In a slab's `Slot::meta`: the slab is registered in steps (its steps' slots say by what).
const STEPPED_BIT: u64 = 1 << 62;
/// In a step's `Slot::meta`: a thread is registering or deregistering the step.
const BUSY_BIT: u64 = 1 << 61;
/// In a step's `Slot::meta`: no region covers the step, whose pages were served unregistered
/// (a refused registration under `Degrade`: its bytes are counted unregistered).
const UNREG_BIT: u64 = 1 << 60;

/// log2 of a step: the smallest part of a slab registered as a region of its own.
pub(crate) const STEP_SHIFT: u32 = 18;
/// Bytes in a step (256 KiB: a GiB of steps is 4,096 regions).
pub(crate) const STEP: usize = 1 << STEP_SHIFT;
/// Steps in a slab.
pub(crate) const STEPS: usize = 1 << (SLAB_SHIFT - STEP_SHIFT);

/// One slab's entry: the registration covering it and, once exposed, a copy of its keys.
#[repr(C, align(32))]
pub(crate) struct Slot {
    meta: AtomicU64,
    keys: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
}

impl Slot {
    #[inline]
    fn cached(&self) -> Keys {
        let keys = self.keys.load(Ordering::Relaxed);
        Keys {
            lkey: Lkey(keys as u32),
            rkey: Rkey((keys >> 32) as u32),
            addr: self.start.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
        }
    }
}

/// The keys of the one registration that covers a byte, and that registration's range.
///
/// # Examples
/// ```
/// use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
/// use rdma_pool::nic::Nic;
/// let pd = Nic::soft().alloc_pd().unwrap();
/// let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
/// let arena = Arena::new(&pd, cfg).unwrap();
/// let run = arena.alloc_run(4096, 64).unwrap();
/// let keys = arena.keys_of(run.as_ptr()).unwrap();
/// assert!(keys.contains(run.as_ptr() as usize, run.len()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Keys {
    /// Local key: use it in the SGEs of local work requests.
    pub lkey: Lkey,
    /// Remote key of the pool's region. Without [`ArenaConfig::remote`](super::ArenaConfig)
    /// it gives a peer no access at all; peers get access through grants.
    pub rkey: Rkey,
    /// First byte of the registration.
    pub addr: usize,
    /// Bytes in the registration.
    pub len: usize,
}

impl Keys {
    /// Whether `[addr, addr + len)` lies inside this registration.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

/// One registration: its region and the keys the table hands out.
pub(crate) struct Reg {
    state: AtomicU8,
    live: AtomicBool,
    huge: AtomicBool,
    odp: AtomicBool,
    /// `id + 1` of the next released id (the free stack's link).
    next_free: AtomicU32,
    /// `lkey | rkey << 32`: one load for both keys.
    keys: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
    /// Written only by the thread that created the registration or holds `REREG`; dropped by
    /// the arena's `Drop`.
    mr: UnsafeCell<MaybeUninit<Mr>>,
}

// SAFETY: `mr` is touched only under the protocol above (creation, REREG, or `&mut` drop).
unsafe impl Sync for Reg {}

impl Reg {
    /// Whether the registration's slabs are hugetlb pages.
    pub(crate) fn is_huge(&self) -> bool {
        self.huge.load(Ordering::Relaxed)
    }

    /// Whether the region is an ODP region.
    pub(crate) fn is_odp(&self) -> bool {
        self.odp.load(Ordering::Relaxed)
    }

    /// Whether the region is registered (not taken out or released).
    pub(crate) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Whether its keys were handed out (they then never change).
    pub(crate) fn is_exposed(&self) -> bool {
        self.state.load(Ordering::Acquire) == EXPOSED
    }

    pub(crate) fn range(&self) -> (usize, usize) {
        (
            self.start.load(Ordering::Acquire),
            self.len.load(Ordering::Acquire),
        )
    }

    /// `PRIVATE → REREG`: true when this thread may now re-register the region.
    pub(crate) fn begin_rereg(&self) -> bool {
        self.state
            .compare_exchange(PRIVATE, REREG, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// `REREG → PRIVATE`, publishing the fields written meanwhile.
    pub(crate) fn end_rereg(&self) {
        self.state.store(PRIVATE, Ordering::Release);
    }

    /// The region.
    ///
    /// # Safety
    /// The caller holds `REREG` on a live registration.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn mr_mut(&self) -> &mut Mr {
        // SAFETY: live, and REREG makes this thread the only one touching `mr`.
        unsafe { (*self.mr.get()).assume_init_mut() }
    }

    /// Take the region out (the registration is not live until [`Reg::install`]).
    ///
    /// # Safety
    /// As [`Reg::mr_mut`].
    pub(crate) unsafe fn take(&self) -> Mr {
        self.live.store(false, Ordering::Relaxed);
        // SAFETY: live until now; `live == false` keeps `Drop` from reading it again.
        unsafe { (*self.mr.get()).assume_init_read() }
    }

    /// Store `mr` and copy its keys and range into the atomics.
    ///
    /// # Safety
    /// The registration is not live, and the caller is its creator or holds `REREG`.
    pub(crate) unsafe fn install(&self, mr: Mr, huge: bool) {
        self.refresh(&mr);
        self.huge.store(huge, Ordering::Relaxed);
        self.odp.store(mr.is_odp(), Ordering::Relaxed);
        // SAFETY: not live, so no one else reads `mr`.
        unsafe { (*self.mr.get()).write(mr) };
        self.live.store(true, Ordering::Release);
    }

    /// Copy the keys and range of `mr` into the atomics.
    pub(crate) fn refresh(&self, mr: &Mr) {
        let keys = mr.lkey().0 as u64 | (mr.rkey().0 as u64) << 32;
        self.keys.store(keys, Ordering::Relaxed);
        self.start.store(mr.addr(), Ordering::Release);
        self.len.store(mr.len(), Ordering::Release);
    }

    #[inline]
    pub(crate) fn keys(&self) -> Keys {
        let keys = self.keys.load(Ordering::Relaxed);
        Keys {
            lkey: Lkey(keys as u32),
            rkey: Rkey((keys >> 32) as u32),
            addr: self.start.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
        }
    }

    /// Mark exposed and read the keys; waits out a re-registration in flight.
    #[cold]
    fn expose(&self) -> Keys {
        loop {
            match self.state.compare_exchange_weak(
                PRIVATE,
                EXPOSED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return self.keys(),
                Err(EXPOSED) => return self.keys(),
                Err(_) => std::hint::spin_loop(),
            }
        }
    }
}

/// The slab → registration map and the registrations.
pub(crate) struct Table {
    base: usize,
    len: usize,
    slots: MmapArray<Slot>,
    /// The steps' slots, `STEPS` per slab, used where the slab's slot is `STEPPED_BIT`.
    steps: MmapArray<Slot>,
    regs: MmapArray<Reg>,
    next_reg: AtomicU32,
    /// Slabs whose slot is `STEPPED_BIT`, at most `step_slabs`: so step regions never
    /// outnumber `step_slabs · STEPS`, and `regs` has room for them by construction.
    stepped: AtomicUsize,
    step_slabs: usize,
    /// The device's share for steps, across its arenas (`budget.rs`).
    budget: Budget,
    /// `id + 1` of the top of the released-id stack, 0 when empty.
    released: crate::sys::atfork::ForkLock<u32>,
}

impl Table {
    /// A table for the `len` bytes at `base`, of which at most `step_slabs` slabs are
    /// registered in steps at once, while `budget` (the device's) has room.
    pub(crate) fn new(
        base: usize,
        len: usize,
        step_slabs: usize,
        budget: Budget,
    ) -> Result<Table, i32> {
        let slabs = len >> SLAB_SHIFT;
        let step_slabs = step_slabs.min(slabs);
        // SAFETY: zero is a valid (unregistered) Slot and a valid (not live, PRIVATE) Reg;
        // the arrays are reserved, and only what is touched is ever committed. Slots hold no
        // pointers: the leak checker need not scan the steps' (32 B per 256 KiB of window).
        let (slots, steps, regs) = unsafe {
            (
                MmapArray::zeroed(slabs)?,
                MmapArray::zeroed_unscanned(if step_slabs > 0 { slabs * STEPS } else { 0 })?,
                MmapArray::zeroed(slabs + 1 + step_slabs * STEPS)?,
            )
        };
        Ok(Table {
            base,
            len,
            slots,
            steps,
            regs,
            next_reg: AtomicU32::new(0),
            stepped: AtomicUsize::new(0),
            step_slabs,
            budget,
            released: crate::sys::atfork::ForkLock::new(0),
        })
    }

    /// The keys of the registration covering `addr`, marking it exposed.
    #[inline]
    pub(crate) fn keys_of(&self, addr: usize) -> Option<Keys> {
        let off = addr.wrapping_sub(self.base);
        if off >= self.len {
            return None;
        }
        // SAFETY: `off < len` and `slots.len() == len >> SLAB_SHIFT`.
        let slot = unsafe { self.slots.get_unchecked(off >> SLAB_SHIFT) };
        let meta = slot.meta.load(Ordering::Acquire);
        if meta & EXPOSED_BIT != 0 {
            return Some(slot.cached());
        }
        if meta & STEPPED_BIT != 0 {
            // SAFETY: `off < len`, and `steps.len() == (len >> SLAB_SHIFT) · STEPS`.
            let step = unsafe { self.steps.get_unchecked(off >> STEP_SHIFT) };
            let meta = step.meta.load(Ordering::Acquire);
            if meta & EXPOSED_BIT != 0 {
                return Some(step.cached());
            }
            return self.keys_of_slow(step, meta);
        }
        self.keys_of_slow(slot, meta)
    }

    /// The slot that says what covers `addr`: its slab's, or its step's in a stepped slab.
    fn slot_of(&self, addr: usize) -> Option<&Slot> {
        let off = addr.wrapping_sub(self.base);
        let slot = self.slots.get(off >> SLAB_SHIFT)?;
        if slot.meta.load(Ordering::Acquire) & STEPPED_BIT != 0 {
            return self.steps.get(off >> STEP_SHIFT);
        }
        Some(slot)
    }

    /// The live region covering `addr`, exposed first (for grants, which bind windows to
    /// it): an exposed region is never re-registered or split again, and taken out only by a
    /// purge of slabs with nothing live in them.
    pub(crate) fn exposed_region(&self, addr: usize) -> Option<&Mr> {
        self.keys_of(addr)?;
        let id = self.slot_of(addr)?.meta.load(Ordering::Acquire) as u32;
        let reg = self.regs.get((id as usize).checked_sub(1)?)?;
        if !reg.is_live() || !reg.is_exposed() {
            return None;
        }
        // SAFETY: live and exposed: `mr` is written no more (module contract), and the
        // caller's memory, which it covers, is live, so no purge takes it out meanwhile.
        Some(unsafe { (*reg.mr.get()).assume_init_ref() })
    }

    /// The registration covering `addr` and its keys, without exposing it (the keys of a
    /// private region may change under a grower: callers use this for ODP regions only).
    pub(crate) fn peek(&self, addr: usize) -> Option<(u32, Keys)> {
        let slot = self.slot_of(addr)?;
        let id = (slot.meta.load(Ordering::Acquire) as u32).checked_sub(1)?;
        let reg = self.regs.get(id as usize)?;
        reg.is_live().then(|| (id, reg.keys()))
    }

    /// First lookup through a slot: expose the registration and cache its keys in the slot.
    #[cold]
    fn keys_of_slow(&self, slot: &Slot, mut meta: u64) -> Option<Keys> {
        loop {
            if meta & EXPOSED_BIT != 0 {
                return Some(slot.cached());
            }
            let id = meta as u32;
            if id == 0 {
                return None;
            }
            let keys = self.regs.get(id as usize - 1)?.expose();
            // The slot may have been unpublished while a re-registration was waited out.
            let now = slot.meta.load(Ordering::Acquire);
            if now != meta {
                meta = now;
                continue;
            }
            slot.keys.store(
                keys.lkey.0 as u64 | (keys.rkey.0 as u64) << 32,
                Ordering::Relaxed,
            );
            slot.start.store(keys.addr, Ordering::Relaxed);
            slot.len.store(keys.len, Ordering::Relaxed);
            let _ = slot.meta.compare_exchange(
                meta,
                meta | EXPOSED_BIT,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            return Some(keys);
        }
    }

    /// Registration `id`.
    pub(crate) fn reg(&self, id: u32) -> &Reg {
        self.regs
            .get(id as usize)
            .expect("registration ids come from new_reg")
    }

    /// A registration id not in use (a released one first), or `None` when every slab
    /// already has one.
    pub(crate) fn new_reg(&self) -> Option<u32> {
        {
            let mut top = self.released.lock();
            if let Some(id) = top.checked_sub(1) {
                let reg = self.reg(id);
                *top = reg.next_free.load(Ordering::Relaxed);
                reg.state.store(PRIVATE, Ordering::Release);
                return Some(id);
            }
        }
        let id = self.next_reg.fetch_add(1, Ordering::Relaxed);
        ((id as usize) < self.regs.len()).then_some(id)
    }

    /// Give back id `id`, whose region was taken out and which no slot points at any more.
    pub(crate) fn release(&self, id: u32) {
        let mut top = self.released.lock();
        self.reg(id).next_free.store(*top, Ordering::Relaxed);
        *top = id + 1;
    }

    /// Whether slabs `[first, first + n)` all point at registration `id`.
    pub(crate) fn covers(&self, first: usize, n: usize, id: u32) -> bool {
        (first..first + n).all(|i| {
            self.slots
                .get(i)
                .is_some_and(|s| s.meta.load(Ordering::Acquire) as u32 == id + 1)
        })
    }

    /// The registration slab `i` points at, if any.
    pub(crate) fn reg_at(&self, i: usize) -> Option<u32> {
        let meta = self.slots.get(i)?.meta.load(Ordering::Acquire);
        (meta as u32).checked_sub(1)
    }

    /// Point slabs `[first, first + n)` at registration `id` (`None`: unregistered).
    pub(crate) fn publish(&self, first: usize, n: usize, id: Option<u32>) {
        let v = id.map_or(0, |id| id as u64 + 1);
        for i in first..first + n {
            if let Some(slot) = self.slots.get(i) {
                if slot.meta.swap(v, Ordering::AcqRel) & STEPPED_BIT != 0 {
                    self.stepped.fetch_sub(1, Ordering::Relaxed);
                    self.budget.give(1);
                }
            }
        }
    }

    /// Unpublish every slab and take out every live registration, handing each region to
    /// `f` and releasing its id: the table is empty and reusable afterwards.
    ///
    /// # Safety
    /// The caller excludes every other writer of the table and every holder of a reference
    /// from [`Table::exposed_region`] until it returns.
    pub(crate) unsafe fn clear(&self, mut f: impl FnMut(Mr)) {
        for i in 0..self.len >> SLAB_SHIFT {
            if self.is_stepped(i) {
                (i * STEPS..(i + 1) * STEPS).for_each(|j| self.end_step(j, StepState::Free));
            }
        }
        self.publish(0, self.len >> SLAB_SHIFT, None);
        let n = (self.next_reg.load(Ordering::Relaxed) as usize).min(self.regs.len());
        for id in 0..n {
            let reg = self.reg(id as u32);
            if reg.is_live() {
                // SAFETY: live; the caller excludes everyone else (see above).
                f(unsafe { reg.take() });
                self.release(id as u32);
            }
        }
    }

    /// Deregister every live registration (the arena is being dropped).
    pub(crate) fn drop_all(&mut self) {
        let n = (self.next_reg.load(Ordering::Relaxed) as usize).min(self.regs.len());
        for id in 0..n {
            if let Some(reg) = self.regs.get_mut(id) {
                if *reg.live.get_mut() {
                    *reg.live.get_mut() = false;
                    // SAFETY: live, and `&mut self` excludes every other user.
                    unsafe { reg.mr.get_mut().assume_init_drop() };
                }
            }
        }
    }

    /// Debug check of the invariants above.
    pub(crate) fn validate(&self) -> bool {
        let slabs = self.len >> SLAB_SHIFT;
        let stepped = (0..slabs).filter(|&i| self.is_stepped(i)).count();
        let own = self.stepped.load(Ordering::Relaxed);
        stepped <= self.step_slabs
            && own <= self.step_slabs
            && (!self.budget.any() || self.budget.used().0 >= own)
            && (0..slabs).all(|i| {
                let Some(slot) = self.slots.get(i) else {
                    return false;
                };
                let meta = slot.meta.load(Ordering::Acquire);
                if meta & STEPPED_BIT != 0 {
                    return meta == STEPPED_BIT
                        && (0..STEPS).all(|k| {
                            let j = i * STEPS + k;
                            self.steps.get(j).is_some_and(|step| {
                                let addr = self.base + (j << STEP_SHIFT);
                                self.covered(step, addr, STEP, true)
                            })
                        });
                }
                self.covered(slot, self.base + (i << SLAB_SHIFT), SLAB, false)
            })
    }

    /// Whether `slot` (of the `len` bytes at `addr`) is empty or points at a live
    /// registration covering them whose keys it caches once exposed.
    fn covered(&self, slot: &Slot, addr: usize, len: usize, step: bool) -> bool {
        let meta = slot.meta.load(Ordering::Acquire);
        let id = meta as u32;
        if id == 0 {
            // A step's slot may say it was served unregistered, a slab's never.
            let flags = if step { BUSY_BIT | UNREG_BIT } else { BUSY_BIT };
            return meta & !flags == 0;
        }
        let reg = self.reg(id - 1);
        let (start, rlen) = reg.range();
        let cached_ok = meta & EXPOSED_BIT == 0 || slot.cached() == reg.keys();
        reg.live.load(Ordering::Acquire) && start <= addr && addr + len <= start + rlen && cached_ok
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // The device's places this table's stepped slabs held (its regions are gone).
        self.budget.give(*self.stepped.get_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::{Access, Nic};

    #[test]
    fn a_slot_caches_the_keys_once_exposed() {
        let pd = Nic::soft().alloc_pd().unwrap();
        let mut mem = crate::nic::Buffer::new(4 << 20).unwrap();
        let base = (mem.as_mut_ptr() as usize).next_multiple_of(super::super::SLAB);
        let table = Table::new(base, super::super::SLAB, 0, Budget::none()).unwrap();
        // SAFETY: `mem` outlives the region (dropped by `drop_all` below).
        let mr =
            unsafe { pd.reg_mr(base as *mut u8, super::super::SLAB, Access::LOCAL_WRITE) }.unwrap();
        let id = table.new_reg().unwrap();
        // SAFETY: a fresh id.
        unsafe { table.reg(id).install(mr, false) };
        table.publish(0, 1, Some(id));
        let slot = table.slots.get(0).unwrap();
        assert_eq!(slot.meta.load(Ordering::Relaxed) & EXPOSED_BIT, 0);
        let keys = table.keys_of(base + 100).unwrap();
        assert_ne!(slot.meta.load(Ordering::Relaxed) & EXPOSED_BIT, 0);
        assert_eq!(slot.cached(), keys);
        assert_eq!(table.keys_of(base + 200), Some(keys));
        assert!(table.validate());
        let mut table = table;
        table.drop_all();
    }
}
