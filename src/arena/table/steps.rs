//! The key table's second level: the steps of slabs registered a step at a time
//! (`arena/step.rs`), and the count that bounds them (see `table/mod.rs`'s contract).

use super::{BUSY_BIT, STEPPED_BIT, STEPS, Table, UNREG_BIT};
use std::sync::atomic::Ordering;

impl Table {
    /// Whether slab `i` is registered in steps.
    pub(crate) fn is_stepped(&self, i: usize) -> bool {
        self.slots
            .get(i)
            .is_some_and(|s| s.meta.load(Ordering::Acquire) & STEPPED_BIT != 0)
    }

    /// Mark slab `i`, which no region covers, stepped (its steps' slots are empty); false
    /// where `step_slabs` slabs already are, or the device's budget is used up.
    pub(crate) fn set_stepped(&self, i: usize) -> bool {
        debug_assert!((0..STEPS).all(|k| self.step_reg(i * STEPS + k).is_none()));
        let Some(slot) = self.slots.get(i) else {
            return false;
        };
        if slot.meta.load(Ordering::Acquire) & STEPPED_BIT != 0 {
            return true;
        }
        // The device's place first, then the table's: the device's count is never below the
        // sum of its tables' (what `validate` checks), even between the two.
        if !self.budget.take() {
            return false;
        }
        let room = self
            .stepped
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < self.step_slabs).then_some(n + 1)
            })
            .is_ok();
        if !room {
            self.budget.give(1);
        }
        if room {
            slot.meta.store(STEPPED_BIT, Ordering::Release);
        }
        room
    }

    /// Whether another slab may be registered in steps.
    pub(crate) fn step_room(&self) -> bool {
        self.stepped.load(Ordering::Relaxed) < self.step_slabs && self.budget.room()
    }

    /// `(slabs stepped on the device by every arena, the device's limit)`.
    pub(crate) fn device_steps(&self) -> (usize, usize) {
        self.budget.used()
    }

    /// Whether any slab may ever be registered in steps.
    pub(crate) fn steps_allowed(&self) -> bool {
        self.step_slabs > 0 && self.budget.any()
    }

    /// The registration step `j` points at, if any (none while it is busy).
    pub(crate) fn step_reg(&self, j: usize) -> Option<u32> {
        let meta = self.steps.get(j)?.meta.load(Ordering::Acquire);
        (meta as u32).checked_sub(1)
    }

    /// Whether pages of step `j` were handed out: it is registered, or was served
    /// unregistered.
    pub(crate) fn step_used(&self, j: usize) -> bool {
        self.steps
            .get(j)
            .is_some_and(|s| s.meta.load(Ordering::Acquire) & (UNREG_BIT | u32::MAX as u64) != 0)
    }

    /// Take step `j` for its registration if it has none: `Some(Some(unregistered))` once
    /// this thread holds it (`unregistered`: its pages were served unregistered),
    /// `Some(None)` when it is registered (left as it is: its keys stay readable), `None`
    /// while another thread holds it.
    pub(crate) fn claim_unregistered(&self, j: usize) -> Option<Option<bool>> {
        let slot = self.steps.get(j)?;
        let meta = slot.meta.load(Ordering::Acquire);
        if meta & BUSY_BIT != 0 {
            return None;
        }
        if meta as u32 != 0 {
            return Some(None);
        }
        slot.meta
            .compare_exchange(meta, BUSY_BIT, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Some(meta & UNREG_BIT != 0))
    }

    /// Take step `j` for a registration or deregistration: `Some(current state)` once this
    /// thread holds it, `None` while another thread does.
    pub(crate) fn begin_step(&self, j: usize) -> Option<StepState> {
        let slot = self.steps.get(j)?;
        let meta = slot.meta.load(Ordering::Acquire);
        if meta & BUSY_BIT != 0 {
            return None;
        }
        slot.meta
            .compare_exchange(meta, BUSY_BIT, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| StepState::of(meta))
    }

    /// Release step `j` taken by [`Table::begin_step`], in state `to`.
    pub(crate) fn end_step(&self, j: usize, to: StepState) {
        if let Some(slot) = self.steps.get(j) {
            let meta = match to {
                StepState::Free => 0,
                StepState::Unregistered => UNREG_BIT,
                StepState::Registered(id) => id as u64 + 1,
            };
            slot.meta.store(meta, Ordering::Release);
        }
    }
}

/// What covers a step of a stepped slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepState {
    /// Nothing, and no page of it was served unregistered.
    Free,
    /// Nothing: a registration was refused and its pages were served unregistered (counted).
    Unregistered,
    /// The region with this id.
    Registered(u32),
}

impl StepState {
    fn of(meta: u64) -> StepState {
        match (meta as u32).checked_sub(1) {
            Some(id) => StepState::Registered(id),
            None if meta & UNREG_BIT != 0 => StepState::Unregistered,
            None => StepState::Free,
        }
    }

    /// `Registered(id)`, else `Unregistered` or `Free` as the pages were served.
    pub(crate) fn after(id: Option<u32>, unregistered: bool) -> StepState {
        match id {
            Some(id) => StepState::Registered(id),
            None if unregistered => StepState::Unregistered,
            None => StepState::Free,
        }
    }
}
