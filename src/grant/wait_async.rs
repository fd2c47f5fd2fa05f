//! Awaiting grants (feature `tokio`): the bind and the revocation as cancel-safe async fns on
//! an [`AsyncCq`], the grant QP's send CQ.
//!
//! Contract: as the blocking [`Grant::wait`] and [`Grant::wait_revoked`], without their
//! timeout (wrap them in `tokio::time::timeout`) and without polling in a loop: the task sleeps
//! on the CQ's channel. Dropping the future leaves the grant as it was: a revocation started
//! goes on, and awaiting again finishes it.

use super::{Grant, GrantBuf, GrantError, OwnedGrant};
use crate::nic::{AsyncCq, Completion};

impl Grant<'_> {
    /// [`Grant::wait`], awaited: until the bind completed. The application's completions
    /// polled meanwhile go to `other`.
    ///
    /// # Errors
    /// As [`Grant::wait`], without the timeout.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use allocator_api2::vec;
    /// use rdma_pool::Pool;
    /// use rdma_pool::nic::{AsyncCq, Nic, QpCaps};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd()?;
    /// let pool = Pool::new(&pd)?;
    /// let cq = AsyncCq::new(&nic, 64)?;
    /// let server = pd.create_qp(cq.cq(), cq.cq(), QpCaps::default())?;
    /// let client = nic.alloc_pd()?.create_qp(cq.cq(), cq.cq(), QpCaps::default())?;
    /// server.connect(&client.endpoint()?)?;
    /// client.connect(&server.endpoint()?)?;
    /// let buf = vec![in &pool; 0u8; 4096];
    /// let mut grant = pool.grant(&buf, &server)?;
    /// grant.wait_async(&cq, |_| {}).await?;
    /// grant.revoke_async(&cq, |_| {}).await?;
    /// assert!(grant.is_revoked());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn wait_async(
        &mut self,
        cq: &AsyncCq,
        mut other: impl FnMut(Completion),
    ) -> Result<(), GrantError> {
        self.until(cq, &mut other, Grant::bound).await
    }

    /// [`Grant::revoke`], awaited: start the revocation (unless started) and wait until the key
    /// is dead.
    ///
    /// # Errors
    /// As [`Grant::wait_revoked`], without the timeout.
    pub async fn revoke_async(
        &mut self,
        cq: &AsyncCq,
        mut other: impl FnMut(Completion),
    ) -> Result<(), GrantError> {
        if !self.revoked {
            self.start_revoke()?;
        }
        self.until(cq, &mut other, Grant::dead).await
    }

    /// Generic over `other` (no `dyn`): the future is `Send` when `other` is, so it can run
    /// in a spawned task.
    async fn until<F: FnMut(Completion)>(
        &self,
        cq: &AsyncCq,
        other: &mut F,
        done: impl Fn(&Self) -> Option<Result<(), GrantError>>,
    ) -> Result<(), GrantError> {
        cq.until(|c| {
            if let Some(r) = done(self) {
                return Ok(Some(r));
            }
            // The pool's completions reach it inside the poll; the application's come out.
            while let Some(wc) = c.poll_one()? {
                other(wc);
            }
            Ok(done(self))
        })
        .await?
    }
}

impl<B: GrantBuf> OwnedGrant<'_, B> {
    /// [`OwnedGrant::wait`], awaited.
    ///
    /// # Errors
    /// As [`Grant::wait_async`].
    pub async fn wait_async(
        &mut self,
        cq: &AsyncCq,
        other: impl FnMut(Completion),
    ) -> Result<(), GrantError> {
        self.grant.wait_async(cq, other).await
    }

    /// [`OwnedGrant::revoke`], awaited: the buffer comes back once the key is dead. Cancelling
    /// drops the grant (and with it the buffer, into quarantine until the key is dead); to keep
    /// it across a cancellation, await [`OwnedGrant::revoked_async`] first.
    ///
    /// # Errors
    /// As [`Grant::revoke_async`], with the grant.
    #[allow(clippy::result_large_err)]
    pub async fn revoke_async(
        mut self,
        cq: &AsyncCq,
        other: impl FnMut(Completion),
    ) -> Result<B, (Self, GrantError)> {
        if let Err(e) = self.revoked_async(cq, other).await {
            return Err((self, e));
        }
        Ok(self.into_buf())
    }

    /// Revoke and wait until the key is dead, keeping the grant (cancel-safe); then
    /// [`OwnedGrant::revoke_async`] (or the blocking `revoke`) gives the buffer back at once.
    ///
    /// # Errors
    /// As [`Grant::revoke_async`].
    pub async fn revoked_async(
        &mut self,
        cq: &AsyncCq,
        other: impl FnMut(Completion),
    ) -> Result<(), GrantError> {
        self.grant.revoke_async(cq, other).await
    }
}
