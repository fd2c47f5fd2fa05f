//! Grants on the global pool: [`Pool::grant`](crate::alloc::Pool::grant) for any heap buffer
//! of the program. `GlobalAlloc::dealloc` of granted memory never blocks: it parks the block
//! until the grant's revocation completed (see [`crate::grant`]).

use super::GlobalPool;
use crate::grant::{Grant, GrantError, GrantKind};
use crate::nic::{Access, Completion, Qp};

impl GlobalPool {
    /// Grant the peer at the other end of `qp` `access` to exactly `buf`, a heap buffer the
    /// global pool handed out (see [`Pool::grant`](crate::alloc::Pool::grant)).
    ///
    /// # Errors
    /// [`GrantError::Unavailable`] when the pool could not initialise; as
    /// [`Pool::grant_with`](crate::alloc::Pool::grant_with) otherwise (a bootstrap or degraded
    /// block is [`GrantError::OutsidePool`]).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::grant::GrantError;
    /// use rdma_pool::nic::{Access, QpCaps};
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// let pool = POOL.init().unwrap();
    /// let cq = pool.nic().create_cq(8).unwrap();
    /// let qp = pool.pd().create_qp(&cq, &cq, QpCaps::default()).unwrap();
    /// let r = POOL.grant(&[0u8; 8], &qp, Access::REMOTE_READ); // not the pool's memory
    /// assert!(matches!(r, Err(GrantError::OutsidePool)));
    /// ```
    pub fn grant<'a>(
        &'a self,
        buf: &'a [u8],
        qp: &Qp,
        access: Access,
    ) -> Result<Grant<'a>, GrantError> {
        self.grant_with(buf, qp, access, GrantKind::Auto)
    }

    /// [`GlobalPool::grant`] of a given kind.
    ///
    /// # Errors
    /// As [`GlobalPool::grant`].
    pub fn grant_with<'a>(
        &'a self,
        buf: &'a [u8],
        qp: &Qp,
        access: Access,
        kind: GrantKind,
    ) -> Result<Grant<'a>, GrantError> {
        let pool = self.init().map_err(|_| GrantError::Unavailable)?;
        pool.grant_with(buf, qp, access, kind)
    }

    /// [`Pool::on_completion`](crate::alloc::Pool::on_completion) of the global pool (false
    /// before it is ready): for completions polled outside the crate only.
    ///
    /// # Safety
    /// As [`Pool::on_completion`](crate::alloc::Pool::on_completion): `wc` is a completion
    /// the device reported, handed over once.
    pub unsafe fn on_completion(&self, wc: &Completion) -> bool {
        // SAFETY: forwarded from the caller.
        self.ready().is_some_and(|p| unsafe { p.on_completion(wc) })
    }

    /// [`Pool::grant_stats`](crate::alloc::Pool::grant_stats) of the global pool, once ready.
    pub fn grant_stats(&self) -> Option<crate::grant::GrantStats> {
        self.ready().map(|p| p.grant_stats())
    }
}
