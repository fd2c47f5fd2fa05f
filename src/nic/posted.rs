//! The handles of owned requests (see the contract in `owned.rs`): [`Posted`], an owned
//! request in flight, and what it ends as: [`Done`] (the buffer and its completion),
//! [`PostError`] (a refused post, the buffer untouched) or [`WaitError`] (not complete yet).
//!
//! Contract: dropping a [`Posted`] whose request is still in flight parks its buffer in its
//! slot; it is dropped when the completion arrives or the QP is destroyed, never before.

use super::owned::NicBuf;
use super::{Completion, Cq, Error, WcOpcode, WcStatus};
#[cfg(feature = "tokio")]
use super::{Result, Verb};
use std::marker::PhantomData;
use std::time::{Duration, Instant};

/// A finished owned request: the buffer back, and its completion (with the `wr_id` the
/// application gave).
#[derive(Debug)]
pub struct Done<B> {
    /// The buffer.
    pub buf: B,
    /// The completion; `status` says whether the transfer happened.
    pub completion: Completion,
}

/// A refused owned post: why, and the buffer, untouched.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct PostError<B: std::fmt::Debug> {
    /// Why the post was refused.
    #[source]
    pub error: Error,
    /// The buffer, given back.
    pub buf: B,
}

/// An owned request that did not complete in time (or whose CQ could not be polled): why,
/// and its handle, to wait again or drop (which parks the buffer).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct WaitError<B> {
    /// [`Error::Timeout`], or the poll's failure.
    #[source]
    pub error: Error,
    /// The request, still in flight.
    pub posted: Posted<B>,
}

/// An owned request in flight; [`Posted::wait`] or [`Posted::take`] give the buffer back with
/// its completion. Dropping it while the request is in flight parks the buffer (see the
/// module contract): the NIC never touches freed memory.
#[must_use = "dropping the handle parks the buffer until the request completes"]
pub struct Posted<B> {
    pub(super) cq: Cq,
    pub(super) key: usize,
    pub(super) epoch: u32,
    pub(super) taken: bool,
    pub(super) _buf: PhantomData<fn() -> B>,
}

impl<B> std::fmt::Debug for Posted<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Posted").field("slot", &self.key).finish()
    }
}

impl<B: NicBuf> Posted<B> {
    /// Whether the request completed (its completion was routed here by a poll). Does not
    /// poll.
    pub fn is_complete(&self) -> bool {
        self.cq.inner.inflight.is_complete(self.key, self.epoch)
    }

    /// The buffer and completion if the request completed, else the handle back. Polls the
    /// CQ once.
    ///
    /// # Errors
    /// The handle itself while the request is in flight; a failed poll counts as in flight.
    pub fn take(mut self) -> std::result::Result<Done<B>, Posted<B>> {
        let inflight = &self.cq.inner.inflight;
        // Poll when the request is not done, or was flushed by its QP's destruction (a
        // completion made before it may still be in the device, and is the truth).
        if (!self.is_complete() || inflight.flushed(self.key, self.epoch))
            && self.cq.pump().is_err()
        {
            return Err(self);
        }
        match self.cq.inner.inflight.take(self.key, self.epoch) {
            Some((completion, read_len, mut parked)) => {
                self.taken = true;
                if completion.status == WcStatus::Success {
                    let n = match completion.opcode {
                        WcOpcode::Recv => Some(completion.byte_len),
                        _ => read_len,
                    };
                    if let Some(n) = n {
                        parked.wrote(n as usize);
                    }
                }
                let buf = *parked
                    .into_any()
                    .downcast::<B>()
                    .expect("a slot holds the buffer type of its handle");
                Ok(Done { buf, completion })
            }
            None => Err(self),
        }
    }

    /// Wait (polling the CQ, then yielding) for at most `timeout` for the request to
    /// complete. The application's completions read meanwhile wait for its next
    /// [`Cq::poll`].
    ///
    /// # Errors
    /// [`Error::Timeout`] with the handle when it did not complete in time, or the poll's
    /// failure with the handle ([`WaitError`]).
    pub fn wait(self, timeout: Duration) -> std::result::Result<Done<B>, WaitError<B>> {
        let start = Instant::now();
        let mut me = self;
        loop {
            if let Err(error) = me.cq.pump() {
                return Err(WaitError { error, posted: me });
            }
            me = match me.take() {
                Ok(done) => return Ok(done),
                Err(me) => me,
            };
            if start.elapsed() > timeout {
                return Err(WaitError {
                    error: Error::Timeout(timeout),
                    posted: me,
                });
            }
            std::thread::yield_now();
        }
    }
}

#[cfg(feature = "tokio")]
impl<B: NicBuf> Posted<B> {
    /// Wait (feature `tokio`) until the request completed, without polling in a loop: the
    /// CQ's channel wakes the task ([`AsyncCq`](super::AsyncCq)). Cancel-safe: the handle is
    /// only borrowed; [`Posted::take`] then gives the buffer back.
    ///
    /// # Errors
    /// `InvalidArgument` when `cq` is not the CQ the request completes on; a poll or channel
    /// failure.
    pub async fn ready(&mut self, cq: &super::AsyncCq) -> Result<()> {
        if !std::sync::Arc::ptr_eq(&self.cq.inner, &cq.cq().inner) {
            return Err(Error::invalid(
                Verb::PollCq,
                "the request completes on another CQ",
            ));
        }
        let (key, epoch) = (self.key, self.epoch);
        cq.until(|c| {
            c.pump()?;
            Ok(c.inner.inflight.is_complete(key, epoch).then_some(()))
        })
        .await
    }

    /// Wait (feature `tokio`) for the completion and take the buffer back with it. Dropping
    /// the future drops the handle, which parks the buffer until the request completes (see
    /// [`Posted`]); use [`Posted::ready`] to keep the handle across a cancellation.
    ///
    /// # Errors
    /// As [`Posted::ready`], with the handle back.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma_pool::nic::{AsyncCq, Nic, QpCaps, WcStatus};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd()?;
    /// let cq = AsyncCq::new(&nic, 16)?;
    /// let (a, b) = (pd.create_qp(cq.cq(), cq.cq(), QpCaps::default())?, pd.create_qp(cq.cq(), cq.cq(), QpCaps::default())?);
    /// a.connect(&b.endpoint()?)?;
    /// b.connect(&a.endpoint()?)?;
    /// let pool: &'static _ = Box::leak(Box::new(rdma_pool::Pool::new(&pd)?));
    /// let rx = b.post_recv_owned(1, allocator_api2::vec![in pool; 0u8; 64])?;
    /// let tx = a.post_send_owned(2, allocator_api2::vec![in pool; 7u8; 16])?;
    /// assert_eq!(tx.wait_async(&cq).await?.completion.status, WcStatus::Success);
    /// let got = rx.wait_async(&cq).await?;
    /// assert_eq!(&got.buf[..16], &[7u8; 16]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait_async(
        mut self,
        cq: &super::AsyncCq,
    ) -> std::result::Result<Done<B>, WaitError<B>> {
        loop {
            if let Err(error) = self.ready(cq).await {
                return Err(WaitError {
                    error,
                    posted: self,
                });
            }
            match self.take() {
                Ok(done) => return Ok(done),
                // Not complete after all (a failed poll in `take`): wait again.
                Err(me) => self = me,
            }
        }
    }
}

impl<B> Drop for Posted<B> {
    fn drop(&mut self) {
        if !self.taken {
            self.cq.inner.inflight.abandon(self.key, self.epoch);
        }
    }
}
