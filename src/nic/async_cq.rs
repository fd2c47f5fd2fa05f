//! Async completions on tokio (feature `tokio`): a CQ whose completion channel is watched by
//! tokio's `AsyncFd`, so tasks await completions without polling in a loop.
//!
//! Contract: every wait is the same loop ([`AsyncCq::until`]): check the condition (which may
//! poll the CQ), arm the CQ, check again (a completion may have come before the arm), then
//! sleep until the channel's descriptor is readable or the CQ's state moved in a way the
//! channel does not report (`inflight::Wake`): any poll took completions from the device (they
//! may be this waiter's: routed to a grant or an owned request, or kept for the
//! application), a blocking wait took the channel's events, or a QP's or SRQ's destruction
//! flushed owned requests. Woken, take the channel's events until none is left, clear
//! tokio's readiness, and loop. Nothing spins, and every wait is cancel-safe: a condition
//! that took something (a completion, a buffer) returns it in the same poll, with no await
//! between.
//!
//! Invariant: while a wait is in progress, every change that could satisfy it either makes
//! the channel readable or wakes it through `Wake`.

use super::error::{Error, Result, Verb};
use super::{CompChannel, Completion, Cq, Nic};
use std::future::poll_fn;
use std::pin::pin;
use std::task::Poll;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A CQ whose completions can be awaited (feature `tokio`): for the application's own
/// completions ([`AsyncCq::next`]), owned requests ([`Posted::ready`](super::Posted::ready))
/// and grants ([`Grant::wait_async`](crate::grant::Grant::wait_async)).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use rdma_pool::nic::{AsyncCq, Nic, QpCaps, WcOpcode};
/// let (a, b) = (Nic::soft(), Nic::soft());
/// let (acq, bcq) = (AsyncCq::new(&a, 16)?, AsyncCq::new(&b, 16)?);
/// let qa = a.alloc_pd()?.create_qp(acq.cq(), acq.cq(), QpCaps::default())?;
/// let qb = b.alloc_pd()?.create_qp(bcq.cq(), bcq.cq(), QpCaps::default())?;
/// qa.connect(&qb.endpoint()?)?;
/// qb.connect(&qa.endpoint()?)?;
/// // SAFETY: no memory: the receive only takes the immediate.
/// unsafe { qb.post_recv(1, &[]) }?;
/// let receiver = tokio::spawn(async move { bcq.next().await });
/// unsafe { qa.post_send_with_imm(2, &[], 99) }?;
/// assert_eq!(acq.next().await?.wr_id, 2);
/// let wc = receiver.await??;
/// assert_eq!((wc.opcode, wc.imm_data), (WcOpcode::Recv, Some(99)));
/// # Ok(())
/// # }
/// ```
pub struct AsyncCq {
    cq: Cq,
    fd: AsyncFd<CompChannel>,
}

impl std::fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCq").field("cq", &self.cq).finish()
    }
}

fn io_error(verb: Verb) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Verb { verb, source }
}

impl AsyncCq {
    /// A CQ of `depth` entries on a completion channel of its own, registered with the
    /// current tokio runtime.
    ///
    /// # Errors
    /// As [`Nic::create_cq`] and [`Nic::create_comp_channel`]; outside a tokio runtime (or
    /// without its I/O driver), the registration's failure.
    pub fn new(nic: &Nic, depth: u32) -> Result<AsyncCq> {
        let channel = nic.create_comp_channel()?;
        let cq = nic.create_cq_on(depth, &channel)?;
        AsyncCq::from_cq(cq)
    }

    /// Watch `cq`, which must have a completion channel that no other `AsyncCq` watches
    /// (one channel per `AsyncCq`: a channel's events cannot be told apart here).
    ///
    /// # Errors
    /// `InvalidArgument` for a CQ without a channel; the registration's failure (a channel
    /// already watched is refused by the reactor).
    pub fn from_cq(cq: Cq) -> Result<AsyncCq> {
        let Some(channel) = cq.channel().cloned() else {
            return Err(Error::invalid(
                Verb::ReqNotifyCq,
                "the CQ was created without a completion channel (Nic::create_cq_on)",
            ));
        };
        let no_runtime = || {
            Error::invalid(
                Verb::ReqNotifyCq,
                "AsyncCq needs a tokio runtime with its I/O driver enabled",
            )
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(no_runtime());
        }
        // tokio panics (rather than failing) in a runtime without its I/O driver.
        let registered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the channel owns its descriptor, which stays open and the same until the
            // channel's last handle is dropped, after the `AsyncFd` (which holds one).
            unsafe { AsyncFd::register_with_interest(channel, Interest::READABLE) }
        }))
        .map_err(|_| no_runtime())?;
        let fd = registered.map_err(|e| Error::Verb {
            verb: Verb::ReqNotifyCq,
            source: e.into(),
        })?;
        Ok(AsyncCq { cq, fd })
    }

    /// The CQ (for creating QPs on it, and for synchronous polls).
    pub fn cq(&self) -> &Cq {
        &self.cq
    }

    /// The next completion of the application (owned requests' and grants' go to them).
    ///
    /// # Errors
    /// A poll, arm or channel failure.
    pub async fn next(&self) -> Result<Completion> {
        self.until(|cq| cq.poll_one()).await
    }

    /// Wait until at least one of the application's completions is there, then take up to
    /// `out.len()` of them; returns how many.
    ///
    /// # Errors
    /// As [`AsyncCq::next`].
    pub async fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        self.until(|cq| Ok(Some(cq.poll(out)?).filter(|&n| n > 0)))
            .await
    }

    /// Wait until `check` gives a value: `check` is called first, after each arm, and after
    /// each wake-up; it may poll the CQ (see the module contract).
    ///
    /// # Errors
    /// `check`'s error, or an arm or channel failure.
    pub async fn until<T>(&self, mut check: impl FnMut(&Cq) -> Result<Option<T>>) -> Result<T> {
        let wake = &self.cq.inner.inflight.wake;
        let _waiting = wake.enter();
        loop {
            let mut took = pin!(wake.notified());
            took.as_mut().enable();
            if let Some(t) = check(&self.cq)? {
                return Ok(t);
            }
            self.cq.req_notify(false)?;
            if let Some(t) = check(&self.cq)? {
                return Ok(t);
            }
            let mut readable = pin!(self.fd.readable());
            let woke = poll_fn(|cx| {
                if let Poll::Ready(r) = readable.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                if took.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            if let Some(guard) = woke {
                let mut guard = guard.map_err(io_error(Verb::GetCqEvent))?;
                if self.fd.get_ref().take_events()? > 0 {
                    // Another waiter may have been woken by these events too, or not yet.
                    wake.changed();
                }
                guard.clear_ready();
            }
        }
    }
}
