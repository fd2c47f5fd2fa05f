//! The completion queue, [`Cq`]: its handle and the polls and waits of the application's
//! completions. The routing of owned requests' completions lives in `inflight.rs`, the
//! completion channel in `channel.rs`.
//!
//! Contract: a `Cq` holds its [`Nic`] and the owned requests that complete on it; each QP
//! holds its CQs, so a CQ is destroyed after its last QP. If its destruction fails, the
//! buffers still parked in it are leaked (the device may still write them).

use super::error::{Error, Result};
use super::inflight::Inflight;
use super::{CompChannel, Completion, Nic, leak_on_error};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A completion queue.
#[derive(Clone)]
pub struct Cq {
    pub(super) inner: Arc<CqInner>,
}

pub(super) struct CqInner {
    pub(super) nic: Nic,
    pub(super) handle: u64,
    /// The owned requests completing here (`inflight.rs`).
    pub(super) inflight: Inflight,
    /// The channel it signals when armed (kept alive until the CQ is destroyed).
    pub(super) channel: Option<CompChannel>,
    /// False for a CQ adopted with [`Cq::from_raw`]: its owner destroys it.
    pub(super) owned: bool,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let destroyed = self.nic.backend.destroy_cq(self.handle);
        if destroyed.is_err() {
            // A QP whose destruction failed may still write the buffers of its requests.
            self.inflight.leak();
        }
        leak_on_error("CQ", self.handle, destroyed);
    }
}

debug_fields!(Cq, |s| { "handle": s.inner.handle });

impl Cq {
    /// The backend's handle (`struct ibv_cq *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.inner.handle
    }

    /// The device.
    pub fn nic(&self) -> &Nic {
        &self.inner.nic
    }

    /// Poll up to `out.len()` of the application's completions; returns how many were
    /// written. Completions of owned requests ([`Qp::post_recv_owned`] and siblings) go to
    /// their [`Posted`] handles instead; the application's completions read while a handle
    /// waited come first.
    ///
    /// # Errors
    /// The `ibv_poll_cq` failure.
    ///
    /// [`Qp::post_recv_owned`]: super::Qp::post_recv_owned
    /// [`Posted`]: super::Posted
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let (mut n, _order) = self.take_backlog(out);
        while n < out.len() {
            let room = out.len() - n;
            let (got, kept) = match self.poll_routed(&mut out[n..]) {
                Ok(r) => r,
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            };
            n += kept;
            // Fewer than asked: the queue is empty. Else poll again for the room the owned
            // requests' completions left.
            if got < room {
                break;
            }
        }
        Ok(n)
    }

    /// Poll one completion, if there is one.
    ///
    /// # Errors
    /// The `ibv_poll_cq` failure.
    pub fn poll_one(&self) -> Result<Option<Completion>> {
        let mut wc = [Completion::default()];
        Ok((self.poll(&mut wc)? == 1).then_some(wc[0]))
    }

    /// Wait for one completion for at most `timeout`: on a CQ with a completion channel by
    /// sleeping on it ([`Cq::req_notify`]), else spinning, then yielding.
    ///
    /// # Errors
    /// [`Error::Timeout`] when none arrives in time.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// let cq = rdma_pool::nic::Nic::soft().create_cq(4).unwrap();
    /// assert!(cq.wait_one(Duration::from_millis(1)).is_err());
    /// ```
    pub fn wait_one(&self, timeout: Duration) -> Result<Completion> {
        if self.inner.channel.is_some() {
            return self.wait_notified(timeout);
        }
        let start = Instant::now();
        loop {
            if let Some(wc) = self.poll_one()? {
                return Ok(wc);
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout(timeout));
            }
            std::thread::yield_now();
        }
    }
}
