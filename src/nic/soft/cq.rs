//! Soft completion queues.
//!
//! Contract: a CQ holds at most `depth` completions, in the order they were pushed; a push into
//! a full CQ is refused (the caller fails its QP, as a CQ overrun does on hardware) and logged.
//! A CQ that QPs still post to cannot be destroyed (`users`).
//!
//! Invariant: `users` equals the QPs whose send or receive CQ this is (counted once per role).

use crate::nic::types::Completion;
use crossbeam::queue::ArrayQueue;
use std::sync::atomic::AtomicU32;

pub(super) struct CqObj {
    queue: ArrayQueue<Completion>,
    /// QPs that post to this CQ (a CQ in use cannot be destroyed).
    pub(super) users: AtomicU32,
}

impl CqObj {
    pub(super) fn new(depth: u32) -> CqObj {
        CqObj {
            queue: ArrayQueue::new(depth.max(1) as usize),
            users: AtomicU32::new(0),
        }
    }

    pub(super) fn push(&self, wc: Completion) -> bool {
        if self.queue.push(wc).is_err() {
            tracing::warn!("soft NIC CQ overrun: a completion was dropped");
            return false;
        }
        true
    }

    pub(super) fn poll(&self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.queue.pop() {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }
}
