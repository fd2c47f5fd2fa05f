//! Soft completion queues and completion channels.
//!
//! Contract: a CQ holds at most `depth` completions, in the order they were pushed; a push into
//! a full CQ is refused (the caller fails its QP, as a CQ overrun does on hardware) and logged.
//! A CQ that QPs still post to cannot be destroyed (`users`).
//!
//! Notification (`ibv_req_notify_cq`): an armed CQ of a channel signals the channel once, on
//! the first completion pushed after it was armed (solicited-only: the first solicited
//! receive or error completion), and is disarmed by it; completions already queued never
//! signal. A channel is an `eventfd` (non-blocking): a signal adds one event, reading takes
//! them all.
//!
//! Invariant: `users` equals the QPs whose send or receive CQ this is (counted once per role);
//! `armed ∈ {DISARMED, ANY, SOLICITED}`.

use crate::nic::types::{Completion, WcStatus};
use crossbeam::queue::ArrayQueue;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

const DISARMED: u8 = 0;
const ANY: u8 = 1;
const SOLICITED: u8 = 2;

/// A completion channel: an eventfd.
pub(super) struct ChannelObj {
    fd: OwnedFd,
    /// CQs that signal it (a channel in use cannot be destroyed).
    pub(super) users: AtomicU32,
}

impl ChannelObj {
    pub(super) fn new() -> io::Result<ChannelObj> {
        // SAFETY: eventfd has no memory-safety preconditions.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ChannelObj {
            // SAFETY: `fd` was just opened and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            users: AtomicU32::new(0),
        })
    }

    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn signal(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        let n = unsafe { libc::write(self.raw_fd(), (&raw const one).cast(), 8) };
        if n != 8 {
            tracing::warn!(
                error = %io::Error::last_os_error(),
                "soft NIC: a completion event was lost"
            );
        }
    }

    /// Take every pending event (0 when none: never blocks).
    pub(super) fn take(&self) -> io::Result<u64> {
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our eventfd.
        let r = unsafe { libc::read(self.raw_fd(), (&raw mut n).cast(), 8) };
        if r == 8 {
            return Ok(n);
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            Ok(0)
        } else {
            Err(e)
        }
    }
}

pub(super) struct CqObj {
    queue: ArrayQueue<Completion>,
    /// QPs that post to this CQ (a CQ in use cannot be destroyed).
    pub(super) users: AtomicU32,
    pub(super) channel: Option<Arc<ChannelObj>>,
    armed: AtomicU8,
}

impl CqObj {
    pub(super) fn new(depth: u32, channel: Option<Arc<ChannelObj>>) -> CqObj {
        if let Some(c) = &channel {
            c.users.fetch_add(1, Ordering::AcqRel);
        }
        CqObj {
            queue: ArrayQueue::new(depth.max(1) as usize),
            users: AtomicU32::new(0),
            channel,
            armed: AtomicU8::new(DISARMED),
        }
    }

    /// Push a completion; `solicited`: a receive of a solicited message.
    pub(super) fn push(&self, wc: Completion) -> bool {
        self.push_event(wc, false)
    }

    pub(super) fn push_event(&self, wc: Completion, solicited: bool) -> bool {
        if self.queue.push(wc).is_err() {
            tracing::warn!("soft NIC CQ overrun: a completion was dropped");
            return false;
        }
        let armed = self.armed.load(Ordering::Acquire);
        let fires = match armed {
            ANY => true,
            SOLICITED => solicited || wc.status != WcStatus::Success,
            _ => false,
        };
        if fires
            && self
                .armed
                .compare_exchange(armed, DISARMED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            && let Some(c) = &self.channel
        {
            c.signal();
        }
        true
    }

    /// `ibv_req_notify_cq`: false when the CQ has no channel.
    pub(super) fn arm(&self, solicited_only: bool) -> bool {
        if self.channel.is_none() {
            return false;
        }
        let how = if solicited_only { SOLICITED } else { ANY };
        // Arming for any completion wins over solicited-only, as on hardware.
        let _ = self
            .armed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                Some(if a == ANY { ANY } else { how })
            });
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

impl Drop for CqObj {
    fn drop(&mut self) {
        if let Some(c) = &self.channel {
            c.users.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
