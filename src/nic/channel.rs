//! Completion channels: waiting for completions without polling.
//!
//! Contract (`ibv_req_notify_cq(3)`): a CQ created on a channel ([`Nic::create_cq_on`]) and
//! armed ([`Cq::req_notify`]) makes the channel's file descriptor readable at its next
//! completion, once; completions already queued when it was armed do not. So a waiter arms,
//! polls once more (a completion may have slipped in before the arm), and only then sleeps on
//! the descriptor; woken, it takes the events ([`CompChannel::take_events`], which also
//! acknowledges them) and polls again. The descriptor is non-blocking: taking events never
//! blocks, and it can be registered with epoll or tokio's `AsyncFd` as it is.
//!
//! A channel outlives its CQs (each holds it); on the soft NIC it is an `eventfd`.
//!
//! Invariant: every event taken is acknowledged before `take_events` returns, so destroying a
//! CQ never waits for acknowledgements.

use super::error::{Error, Result, Verb};
use super::{Completion, Cq, Nic};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A completion channel (`struct ibv_comp_channel`): a file descriptor that becomes readable
/// when an armed CQ of it gets a completion.
///
/// # Examples
/// ```
/// use rdma_pool::nic::{Nic, QpCaps};
/// use std::os::fd::AsRawFd;
/// use std::time::Duration;
/// let nic = Nic::soft();
/// let channel = nic.create_comp_channel()?;
/// let cq = nic.create_cq_on(16, &channel)?;
/// assert!(channel.as_raw_fd() >= 0);
/// cq.req_notify(false)?;
/// assert_eq!(channel.take_events()?, 0); // nothing completed yet
/// // A blocking wait sleeps on the descriptor, it does not spin.
/// assert!(cq.wait_one(Duration::from_millis(10)).is_err());
/// # Ok::<(), rdma_pool::nic::Error>(())
/// ```
#[derive(Clone)]
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

struct ChannelInner {
    nic: Nic,
    handle: u64,
    fd: RawFd,
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        if let Err(e) = self.nic.backend.destroy_comp_channel(self.handle) {
            tracing::error!(error = %e, "destroying a completion channel failed; it is leaked");
        }
    }
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.inner.fd)
            .finish()
    }
}

impl CompChannel {
    pub(super) fn handle(&self) -> u64 {
        self.inner.handle
    }

    /// The device.
    pub fn nic(&self) -> &Nic {
        &self.inner.nic
    }

    /// Take and acknowledge every pending event, without blocking; returns how many there
    /// were (each is one armed CQ's notification).
    ///
    /// # Errors
    /// The `ibv_get_cq_event` failure other than "no event".
    pub fn take_events(&self) -> Result<u64> {
        self.inner.nic.backend.get_cq_events(self.inner.handle)
    }

    /// Sleep until the descriptor is readable (an event is pending) or `timeout` passed;
    /// true when readable. Takes nothing.
    ///
    /// # Errors
    /// The `poll(2)` failure.
    pub fn wait_readable(&self, timeout: Duration) -> Result<bool> {
        let mut fds = libc::pollfd {
            fd: self.inner.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one live pollfd.
        let n = unsafe { libc::poll(&mut fds, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(Error::Verb {
                verb: Verb::GetCqEvent,
                source: e,
            });
        }
        Ok(n > 0)
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd
    }
}

impl AsFd for CompChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while `self` (and its inner) lives.
        unsafe { BorrowedFd::borrow_raw(self.inner.fd) }
    }
}

impl Nic {
    /// Create a completion channel (`ibv_create_comp_channel`), its descriptor non-blocking.
    ///
    /// # Errors
    /// The device's failure (too many open files, a dead device).
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        let (handle, fd) = self.backend.create_comp_channel()?;
        Ok(CompChannel {
            inner: Arc::new(ChannelInner {
                nic: self.clone(),
                handle,
                fd,
            }),
        })
    }

    /// Create a CQ of `depth` entries that signals `channel` when armed.
    ///
    /// # Errors
    /// As [`Nic::create_cq`]; `InvalidArgument` for a channel of another device.
    pub fn create_cq_on(&self, depth: u32, channel: &CompChannel) -> Result<Cq> {
        self.create_cq_in(depth, Some(channel))
    }
}

/// How long one sleep on the descriptor lasts at most: another waiter on the same channel may
/// take the event this one was woken for.
const SLICE: Duration = Duration::from_millis(50);

impl Cq {
    /// The channel this CQ signals, if it was created on one.
    pub fn channel(&self) -> Option<&CompChannel> {
        self.inner.channel.as_ref()
    }

    /// Arm the CQ (`ibv_req_notify_cq`): its channel is signalled at the next completion
    /// (`solicited_only`: the next solicited receive or error completion), once.
    ///
    /// # Errors
    /// `InvalidArgument` for a CQ without a channel; the provider's failure.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.inner.channel.is_none() {
            return Err(Error::invalid(
                Verb::ReqNotifyCq,
                "the CQ was created without a completion channel",
            ));
        }
        self.inner
            .nic
            .backend
            .req_notify_cq(self.inner.handle, solicited_only)
    }

    /// Wait for one completion on a CQ with a channel: poll, arm, poll, sleep on the channel.
    pub(super) fn wait_notified(&self, timeout: Duration) -> Result<Completion> {
        let channel = self.channel().expect("a CQ with a channel");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(wc) = self.poll_one()? {
                return Ok(wc);
            }
            self.req_notify(false)?;
            if let Some(wc) = self.poll_one()? {
                return Ok(wc);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(timeout));
            }
            if channel.wait_readable(left.min(SLICE))? && channel.take_events()? > 0 {
                // The events may be an async waiter's too: it will not see them now.
                self.inner.inflight.wake.changed();
            }
        }
    }
}
