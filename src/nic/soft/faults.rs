//! Fault injection: make the next calls of a verb fail with a chosen errno (and, for
//! `rereg_mr`, a chosen `ibv_rereg_mr(3)` outcome).
//!
//! Contract: an armed fault fails exactly `n` calls of its verb, then disarms; arming a verb
//! again replaces what was armed for it. Checking costs one atomic load when nothing is armed
//! (the data path pays nothing else).
//!
//! Invariant: `armed == |faults|`, and every armed fault has `remaining > 0`.

use super::sync::lock;
use crate::nic::error::{ReregErrorKind, Verb};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

struct InjectedFault {
    verb: Verb,
    remaining: u32,
    errno: i32,
    rereg_kind: ReregErrorKind,
}

/// The faults armed on one device.
#[derive(Default)]
pub(super) struct FaultPlan {
    faults: Mutex<Vec<InjectedFault>>,
    armed: AtomicUsize,
}

impl FaultPlan {
    /// Fail the next `n` calls of `verb` (0 disarms it).
    pub(super) fn arm(&self, verb: Verb, n: u32, errno: i32, rereg_kind: ReregErrorKind) {
        let mut f = lock(&self.faults);
        f.retain(|x| x.verb != verb);
        if n > 0 {
            f.push(InjectedFault {
                verb,
                remaining: n,
                errno,
                rereg_kind,
            });
        }
        self.armed.store(f.len(), Ordering::Release);
    }

    /// Consume one injected failure of `verb`, if one is armed: its errno and rereg outcome.
    pub(super) fn take(&self, verb: Verb) -> Option<(i32, ReregErrorKind)> {
        if self.armed.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut f = lock(&self.faults);
        let i = f.iter().position(|x| x.verb == verb)?;
        let hit = (f[i].errno, f[i].rereg_kind);
        f[i].remaining -= 1;
        if f[i].remaining == 0 {
            f.remove(i);
        }
        self.armed.store(f.len(), Ordering::Release);
        Some(hit)
    }
}
