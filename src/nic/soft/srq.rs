//! Soft shared receive queues.
//!
//! Contract: an SRQ holds at most `max_wr` receives, taken in the order they were posted by
//! whichever of its QPs a message arrives on. A message that finds the SRQ empty parks at its
//! QP (as with infinite RNR retry) and the QP is noted in `waiting`; the next receive posted
//! to the SRQ lands the oldest message of the first waiting QP. A QP's errors flush its own
//! parked messages, never the SRQ's receives (they stay for the other QPs). An SRQ that QPs
//! still use cannot be destroyed (`users`).
//!
//! Lock order: a QP's `rx` → `SrqObj::q` → the QP's `st` (as in `qp.rs`).
//!
//! Invariant: `|recvs| <= max_wr`; a QP with a parked message is in `waiting` at least once
//! (entries of QPs with none left, or gone, are skipped).

use super::qp::{QpObj, Recv};
use crate::nic::types::Sge;
use std::collections::VecDeque;
use std::sync::atomic::AtomicU32;
use std::sync::{Mutex, Weak};

pub(super) struct SrqQueue {
    pub(super) recvs: VecDeque<Recv>,
    pub(super) waiting: VecDeque<Weak<QpObj>>,
}

pub(super) struct SrqObj {
    pub(super) pd: u64,
    pub(super) max_wr: u32,
    pub(super) max_sge: u32,
    pub(super) q: Mutex<SrqQueue>,
    /// QPs that receive through it.
    pub(super) users: AtomicU32,
}

impl SrqObj {
    pub(super) fn new(pd: u64, max_wr: u32, max_sge: u32) -> SrqObj {
        SrqObj {
            pd,
            max_wr,
            max_sge,
            q: Mutex::new(SrqQueue {
                recvs: VecDeque::new(),
                waiting: VecDeque::new(),
            }),
            users: AtomicU32::new(0),
        }
    }

    pub(super) fn recv(wr_id: u64, sges: &[Sge]) -> Recv {
        Recv {
            wr_id,
            sges: sges.to_vec(),
        }
    }
}
