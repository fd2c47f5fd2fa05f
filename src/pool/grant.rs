//! The grants of a [`Pool`]: a peer's key to exactly one buffer (see [`crate::grant`] for
//! the contract). The feature's code is in `grant/`; these are its calls on the facade.

use super::Pool;
use crate::grant::{Grant, GrantBuf, GrantCtx, GrantError, GrantKind, GrantLimits, OwnedGrant};
use crate::nic::{Access, Completion, Qp};

impl Pool {
    /// Grant the peer at the other end of `qp` the right to READ exactly `buf`, a buffer (or
    /// part of one) of this pool, with the safest kind the device offers (see the
    /// [grant module contract](crate::grant)). Read-only, as `buf` is only borrowed: a grant
    /// with a write or atomic right owns its buffer ([`Pool::grant_owned`]). A whole exchange
    /// with a peer is in [`Grant`]'s example.
    ///
    /// # Errors
    /// See [`Pool::grant_with`].
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::{GrantError, Nic, Pool, QpCaps};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd()?;
    /// let pool = Pool::new(&pd)?;
    /// let cq = nic.create_cq(8)?;
    /// let qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
    /// let stack = [0u8; 64]; // not the pool's memory: no key for it
    /// assert!(matches!(pool.grant(&stack, &qp), Err(GrantError::OutsidePool)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grant<'a>(&'a self, buf: &'a [u8], qp: &Qp) -> Result<Grant<'a>, GrantError> {
        self.grant_read_with(buf, qp, GrantKind::Auto)
    }

    /// [`Pool::grant`] of a given kind.
    ///
    /// # Errors
    /// See [`Pool::grant_with`].
    pub fn grant_read_with<'a>(
        &'a self,
        buf: &'a [u8],
        qp: &Qp,
        kind: GrantKind,
    ) -> Result<Grant<'a>, GrantError> {
        // SAFETY: a read right only: the peer reads what the borrow lets the program read.
        unsafe { self.grant_with(buf, qp, Access::REMOTE_READ, kind) }
    }

    /// A grant of any `access` on a shared borrow, of a given kind: the raw form of
    /// [`Pool::grant`] and [`Pool::grant_owned`].
    ///
    /// # Safety
    /// With a write or atomic right, the peer may write `buf` whenever the key works: the
    /// program must not access `buf` while a peer access may be in flight — only once its
    /// protocol says the peer's accesses completed, or after the revocation completed
    /// ([`Grant::is_revoked`]) — except by atomic or volatile accesses. (Freeing it is fine:
    /// the quarantine keeps it from reuse until the key is dead.) With only a read right there
    /// is nothing to promise.
    ///
    /// # Errors
    /// [`GrantError::Empty`], [`GrantError::OutsidePool`], [`GrantError::NotAllocated`],
    /// [`GrantError::AcrossBlocks`], [`GrantError::Unregistered`] for a bad range;
    /// [`GrantError::ForeignQp`], [`GrantError::QpNotReady`] for a bad QP;
    /// [`GrantError::Rights`] for rights a grant cannot carry; [`GrantError::Unsupported`]
    /// for a kind the device lacks; [`GrantError::Limit`]; the NIC's failure.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::grant::{GrantError, GrantKind};
    /// use rdma_pool::nic::{Access, Nic, QpCaps};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd()?;
    /// let pool = rdma_pool::Pool::new(&pd)?;
    /// let cq = nic.create_cq(8)?;
    /// let qp = pd.create_qp(&cq, &cq, QpCaps::default())?; // not connected
    /// let buf = allocator_api2::vec![in &pool; 0u8; 64];
    /// let r = pool.grant_read_with(&buf, &qp, GrantKind::Type1);
    /// assert!(matches!(r, Err(GrantError::QpNotReady(_))));
    /// assert!(matches!(pool.grant(&[0u8; 4], &qp), Err(GrantError::OutsidePool)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn grant_with<'a>(
        &'a self,
        buf: &'a [u8],
        qp: &Qp,
        access: Access,
        kind: GrantKind,
    ) -> Result<Grant<'a>, GrantError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.grants().grant_with(buf, qp, access, kind) }
    }

    /// Grant the peer at the other end of `qp` `access` (any remote rights) to exactly `buf`,
    /// a whole buffer of this pool that the grant then owns: the program gets it back once
    /// the key is dead ([`OwnedGrant::revoke`]) and reads it meanwhile through
    /// [`OwnedGrant::read_at`].
    ///
    /// # Errors
    /// As [`Pool::grant_with`], with the buffer given back.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::{Access, GrantError, Nic, Pool, QpCaps};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd()?;
    /// let pool = Pool::new(&pd)?;
    /// let cq = nic.create_cq(8)?;
    /// let qp = pd.create_qp(&cq, &cq, QpCaps::default())?; // not connected yet
    /// let buf = allocator_api2::vec![in &pool; 0u8; 4096];
    /// let (buf, e) = pool.grant_owned(buf, &qp, Access::REMOTE_WRITE).unwrap_err();
    /// assert!(matches!(e, GrantError::QpNotReady(_)));
    /// assert_eq!(buf.len(), 4096); // given back, untouched
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn grant_owned<B: GrantBuf>(
        &self,
        buf: B,
        qp: &Qp,
        access: Access,
    ) -> Result<OwnedGrant<'_, B>, (B, GrantError)> {
        self.grant_owned_with(buf, qp, access, GrantKind::Auto)
    }

    /// [`Pool::grant_owned`] of a given kind.
    ///
    /// # Errors
    /// As [`Pool::grant_with`], with the buffer given back.
    pub fn grant_owned_with<B: GrantBuf>(
        &self,
        buf: B,
        qp: &Qp,
        access: Access,
        kind: GrantKind,
    ) -> Result<OwnedGrant<'_, B>, (B, GrantError)> {
        self.grants().grant_owned_with(buf, qp, access, kind)
    }

    /// Hand the pool a completion the application polled itself from a CQ its grants post
    /// on, with `ibv_poll_cq` on the raw handle (completions read through
    /// [`Cq::poll`](crate::nic::Cq::poll) reach the pool on their own and never come out of
    /// it): returns `true` when it was the completion of a bind or invalidation the pool
    /// posted (consumed), `false` when it belongs to the application. A receive completion
    /// reporting a peer's SEND_WITH_INV is not taken for a grant's (it names a QP number, and
    /// QP numbers are per device: the pool cannot tell which device's); the revocation
    /// invalidates the window itself.
    ///
    /// # Safety
    /// `wc` is a completion the device reported, as `ibv_poll_cq` returned it, handed over
    /// once: a made-up or repeated completion could make the pool recycle a window, or free a
    /// quarantined block, whose key still works.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::Completion;
    /// # let pool = rdma_pool::Pool::new(&rdma_pool::nic::Nic::soft().alloc_pd()?)?;
    /// // SAFETY: not one of the pool's (no tagged wr_id): nothing is done with it.
    /// assert!(!unsafe { pool.on_completion(&Completion { wr_id: 7, ..Default::default() }) });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn on_completion(&self, wc: &Completion) -> bool {
        self.grants().take_completion(wc, None)
    }

    /// Bound the dedicated regions grants may create (see [`GrantLimits`]); grants beyond
    /// them fail with [`GrantError::Limit`].
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::grant::GrantLimits;
    /// # let pool = rdma_pool::Pool::new(&rdma_pool::nic::Nic::soft().alloc_pd()?)?;
    /// pool.set_grant_limits(GrantLimits { regions: 16, region_bytes: 1 << 20, ..Default::default() });
    /// assert_eq!(pool.grant_limits().regions, 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_grant_limits(&self, limits: GrantLimits) {
        self.features.grants.set_limits(limits);
    }

    /// The bounds in force (see [`Pool::set_grant_limits`]).
    pub fn grant_limits(&self) -> GrantLimits {
        self.features.grants.limits()
    }

    /// The grant feature of this pool: its core and its grants.
    fn grants(&self) -> GrantCtx<'_> {
        GrantCtx {
            core: &self.core,
            grants: &self.features.grants,
        }
    }
}
