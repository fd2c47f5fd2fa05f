//! The key table's second level: the steps of slabs registered a step at a time
//! (`arena/step.rs`), and the count that bounds them (see `table/mod.rs`'s contract).

use super::{BUSY_BIT, STEPPED_BIT, STEPS, Table};
use std::sync::atomic::Ordering;

impl Table {
    /// Whether slab `i` is registered in steps.
    pub(crate) fn is_stepped(&self, i: usize) -> bool {
        self.slots
            .get(i)
            .is_some_and(|s| s.meta.load(Ordering::Acquire) & STEPPED_BIT != 0)
    }

    /// Mark slab `i`, which no region covers, stepped (its steps' slots are empty); false
    /// where `step_slabs` slabs already are.
    pub(crate) fn set_stepped(&self, i: usize) -> bool {
        debug_assert!((0..STEPS).all(|k| self.step_reg(i * STEPS + k).is_none()));
        let Some(slot) = self.slots.get(i) else {
            return false;
        };
        if slot.meta.load(Ordering::Acquire) & STEPPED_BIT != 0 {
            return true;
        }
        let room = self
            .stepped
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < self.step_slabs).then_some(n + 1)
            })
            .is_ok();
        if room {
            slot.meta.store(STEPPED_BIT, Ordering::Release);
        }
        room
    }

    /// Whether another slab may be registered in steps.
    pub(crate) fn step_room(&self) -> bool {
        self.stepped.load(Ordering::Relaxed) < self.step_slabs
    }

    /// Whether any slab may ever be registered in steps.
    pub(crate) fn steps_allowed(&self) -> bool {
        self.step_slabs > 0
    }

    /// The registration step `j` points at, if any (none while it is busy).
    pub(crate) fn step_reg(&self, j: usize) -> Option<u32> {
        let meta = self.steps.get(j)?.meta.load(Ordering::Acquire);
        (meta as u32).checked_sub(1)
    }

    /// Take step `j` for its registration if it has none: `Some(true)` once this thread
    /// holds it, `Some(false)` when it is registered (left as it is: its keys stay readable),
    /// `None` while another thread holds it.
    pub(crate) fn claim_unregistered(&self, j: usize) -> Option<bool> {
        let slot = self.steps.get(j)?;
        let meta = slot.meta.load(Ordering::Acquire);
        if meta & BUSY_BIT != 0 {
            return None;
        }
        if meta as u32 != 0 {
            return Some(false);
        }
        slot.meta
            .compare_exchange(meta, BUSY_BIT, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| true)
    }

    /// Take step `j` for a registration or deregistration: `Some(current registration)`
    /// once this thread holds it, `None` while another thread does.
    pub(crate) fn begin_step(&self, j: usize) -> Option<Option<u32>> {
        let slot = self.steps.get(j)?;
        let meta = slot.meta.load(Ordering::Acquire);
        if meta & BUSY_BIT != 0 {
            return None;
        }
        slot.meta
            .compare_exchange(meta, BUSY_BIT, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| (meta as u32).checked_sub(1))
    }

    /// Release step `j` taken by [`Table::begin_step`], pointing it at `id` (`None`:
    /// unregistered).
    pub(crate) fn end_step(&self, j: usize, id: Option<u32>) {
        if let Some(slot) = self.steps.get(j) {
            slot.meta
                .store(id.map_or(0, |id| id as u64 + 1), Ordering::Release);
        }
    }
}
