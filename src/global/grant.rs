//! Grants on the global pool: [`Pool::grant`](crate::Pool::grant) for any heap buffer
//! of the program. `GlobalAlloc::dealloc` of granted memory never blocks: it parks the block
//! until the grant's revocation completed (see [`crate::grant`]).

use super::GlobalPool;
use crate::grant::{Grant, GrantBuf, GrantError, GrantKind, OwnedGrant};
use crate::nic::{Access, Completion, Qp};

impl GlobalPool {
    /// Grant the peer at the other end of `qp` the right to READ exactly `buf`, a heap buffer
    /// the global pool handed out (see [`Pool::grant`](crate::Pool::grant)).
    ///
    /// # Errors
    /// [`GrantError::Unavailable`] when the pool could not initialise; as
    /// [`Pool::grant_with`](crate::Pool::grant_with) otherwise (a bootstrap or degraded
    /// block is [`GrantError::OutsidePool`]).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::grant::GrantError;
    /// use rdma_pool::nic::QpCaps;
    /// static POOL: rdma_pool::GlobalPool = rdma_pool::GlobalPool::new();
    /// let pool = POOL.init().unwrap();
    /// let cq = pool.nic().create_cq(8).unwrap();
    /// let qp = pool.pd().create_qp(&cq, &cq, QpCaps::default()).unwrap();
    /// let r = POOL.grant(&[0u8; 8], &qp); // not the pool's memory
    /// assert!(matches!(r, Err(GrantError::OutsidePool)));
    /// ```
    pub fn grant<'a>(&'a self, buf: &'a [u8], qp: &Qp) -> Result<Grant<'a>, GrantError> {
        let pool = self.init().map_err(|_| GrantError::Unavailable)?;
        pool.grant(buf, qp)
    }

    /// [`Pool::grant_with`](crate::Pool::grant_with) on the global pool: any rights on
    /// a shared borrow, of a given kind.
    ///
    /// # Safety
    /// As [`Pool::grant_with`](crate::Pool::grant_with): with a write or atomic right,
    /// the program does not touch `buf` but atomically until the revocation completed.
    ///
    /// # Errors
    /// As [`GlobalPool::grant`].
    pub unsafe fn grant_with<'a>(
        &'a self,
        buf: &'a [u8],
        qp: &Qp,
        access: Access,
        kind: GrantKind,
    ) -> Result<Grant<'a>, GrantError> {
        let pool = self.init().map_err(|_| GrantError::Unavailable)?;
        // SAFETY: forwarded from the caller.
        unsafe { pool.grant_with(buf, qp, access, kind) }
    }

    /// [`Pool::grant_owned`](crate::Pool::grant_owned) on the global pool: any rights
    /// to a whole heap buffer the grant owns until the key is dead.
    ///
    /// # Errors
    /// As [`GlobalPool::grant`], with the buffer given back.
    pub fn grant_owned<B: GrantBuf>(
        &self,
        buf: B,
        qp: &Qp,
        access: Access,
    ) -> Result<OwnedGrant<'_, B>, (B, GrantError)> {
        match self.init() {
            Ok(pool) => pool.grant_owned(buf, qp, access),
            Err(_) => Err((buf, GrantError::Unavailable)),
        }
    }

    /// [`Pool::on_completion`](crate::Pool::on_completion) of the global pool (false
    /// before it is ready): for completions polled outside the crate only.
    ///
    /// # Safety
    /// As [`Pool::on_completion`](crate::Pool::on_completion): `wc` is a completion
    /// the device reported, handed over once.
    pub unsafe fn on_completion(&self, wc: &Completion) -> bool {
        // SAFETY: forwarded from the caller.
        self.ready().is_some_and(|p| unsafe { p.on_completion(wc) })
    }
}
