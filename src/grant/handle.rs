//! The grant handles: [`Grant`] borrows its buffer, [`OwnedGrant`] owns it and gives it back
//! after revocation. Both revoke on drop without blocking.
//!
//! Contract (Rust's borrow rules, kept by the NIC too): a grant on a shared borrow
//! ([`Pool::grant`]) is read-only — the peer reads what the program may read too; a grant with
//! a write or atomic right owns its buffer ([`Pool::grant_owned`]), and the program reads what
//! the peer wrote while it is live only through [`OwnedGrant::read_at`] (a copy by atomic
//! loads: no data race with the NIC, whatever the peer does) or gets the buffer back once the
//! key is dead. [`Pool::grant_with`], any rights on a shared borrow, is `unsafe`. Forgetting a
//! handle leaves the key live and the buffer borrowed or owned for good: nothing the program
//! can reach again.

use super::GrantCtx;
use super::issue::Issued;
use super::{GrantError, GrantKind, GrantWire};
use crate::nic::{Access, Completion, Cq, Qp, Rkey, WcStatus};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How long [`Grant::revoke`] and [`Grant::wait`] wait for their completion.
pub const WAIT: Duration = Duration::from_secs(10);

/// A peer's key to exactly one range of a pool buffer, borrowed for `'a`: while the grant
/// lives, safe code cannot free or move the buffer. Dropping it starts the revocation without
/// blocking (the memory stays quarantined until the invalidation completed); [`Grant::revoke`]
/// waits for it. After dropping an unrevoked grant, the peer may still write into the buffer
/// until the invalidation completed: revoke first when the contents matter.
///
/// # Examples
/// ```
/// use allocator_api2::vec;
/// use rdma_pool::Pool;
/// use rdma_pool::nic::{Access, Nic, QpCaps};
/// let nic = Nic::soft();
/// let pd = nic.alloc_pd()?;
/// let pool = Pool::new(&pd)?;
/// let cq = nic.create_cq(64)?;
/// let (server, client) = (pd.create_qp(&cq, &cq, QpCaps::default())?, nic.alloc_pd()?.create_qp(&cq, &cq, QpCaps::default())?);
/// server.connect(&client.endpoint()?)?;
/// client.connect(&server.endpoint()?)?;
///
/// let buf = vec![in &pool; 0u8; 4096];
/// let mut grant = pool.grant(&buf, &server)?; // read-only: `buf` stays readable here too
/// grant.wait(&cq, |_| {})?; // the bind completed: the key works, through `server` only
/// let wire = grant.wire();  // what the client needs
/// assert_eq!((wire.addr, wire.len), (buf.as_ptr() as u64, 4096));
/// grant.revoke(&cq, |_| {})?; // the key is dead
/// assert_eq!(pool.stats().grants.open, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a grant revokes it"]
pub struct Grant<'a> {
    pool: GrantCtx<'a>,
    g: Issued,
    pub(super) revoked: bool,
    _buf: PhantomData<&'a [u8]>,
}

impl std::fmt::Debug for Grant<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("kind", &self.g.kind)
            .field("dedicated", &self.g.dedicated)
            .field("wire", &self.wire())
            .field("revoked", &self.revoked)
            .finish()
    }
}

impl<'a> Grant<'a> {
    /// First byte granted.
    pub fn addr(&self) -> usize {
        self.g.addr
    }
    /// Bytes granted.
    pub fn len(&self) -> usize {
        self.g.len
    }
    /// Always false: a grant covers at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// The key (valid once the bind completed; see [`Grant::wait`]).
    pub fn rkey(&self) -> Rkey {
        self.g.rkey
    }
    /// Which kind of key it is (never [`GrantKind::Auto`]).
    pub fn kind(&self) -> GrantKind {
        self.g.kind
    }
    /// Whether the grant has a region of its own under it (see the module contract).
    pub fn is_dedicated(&self) -> bool {
        self.g.dedicated
    }
    /// What the peer needs: address, length, key.
    pub fn wire(&self) -> GrantWire {
        GrantWire {
            addr: self.g.addr as u64,
            len: self.g.len as u64,
            rkey: self.g.rkey,
        }
    }

    /// Where the bind stands, without waiting: `None` while its completion has not reached
    /// the pool, `Some(Ok(()))` once it succeeded (the key works), `Some(Err(_))` when it
    /// failed ([`GrantError::BindFailed`]; the grant is then revoked) or the grant was revoked
    /// ([`GrantError::Revoked`]). For code that polls the CQ itself and hands the pool its
    /// completions ([`Pool::on_completion`](crate::Pool::on_completion)), such as the C API.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::nic::{Nic, QpCaps};
    /// # let nic = Nic::soft();
    /// # let pd = nic.alloc_pd()?;
    /// # let pool = rdma_pool::Pool::new(&pd)?;
    /// # let cq = nic.create_cq(64)?;
    /// # let (a, b) = (pd.create_qp(&cq, &cq, QpCaps::default())?, nic.alloc_pd()?.create_qp(&cq, &cq, QpCaps::default())?);
    /// # a.connect(&b.endpoint()?)?;
    /// # b.connect(&a.endpoint()?)?;
    /// let buf = allocator_api2::vec![in &pool; 0u8; 64];
    /// let grant = pool.grant(&buf, &a)?;
    /// while grant.bind_state().is_none() {
    ///     cq.poll_one()?; // the pool takes its own completions
    /// }
    /// assert!(grant.bind_state().unwrap().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind_state(&self) -> Option<Result<(), GrantError>> {
        self.bound()
    }

    /// Whether the revocation completed (the key is dead).
    pub fn is_revoked(&self) -> bool {
        self.pool
            .grants
            .state(self.g.key, self.g.seq)
            .is_none_or(|(_, done)| done)
    }

    /// Wait until the bind completed, polling `cq` (the send CQ of the grant's QP): the pool's
    /// completions reach it inside the poll, every other one goes to `other`. A region grant
    /// is bound at once. A SEND of the key posted after the bind on the same QP is ordered
    /// behind it, so waiting is needed only to hand the key out another way.
    ///
    /// # Errors
    /// [`GrantError::BindFailed`] when the bind failed (the key never worked; the grant is
    /// then revoked at once), [`GrantError::Timeout`] after [`WAIT`], a polling error.
    pub fn wait(&mut self, cq: &Cq, mut other: impl FnMut(Completion)) -> Result<(), GrantError> {
        self.poll(cq, &mut other, |me| me.bound())
    }

    /// Where the bind stands: `None` while in flight. A failed bind revokes the grant.
    pub(super) fn bound(&self) -> Option<Result<(), GrantError>> {
        let grants = self.pool.grants;
        match grants.state(self.g.key, self.g.seq) {
            Some((Some(WcStatus::Success), _)) => Some(Ok(())),
            Some((Some(s), _)) => Some(Err(GrantError::BindFailed(s))),
            Some((None, _)) => None,
            None => Some(Err(GrantError::Revoked)),
        }
        .inspect(|r| {
            if r.is_err() {
                let _ = grants.revoke(self.pool.core, self.g.key, self.g.seq);
            }
        })
    }

    /// Revoke now and wait until the key is dead, polling `cq` as [`Grant::wait`] does.
    ///
    /// # Errors
    /// [`GrantError::Revoked`] when already revoked; [`GrantError::Timeout`] after [`WAIT`]
    /// (the revocation goes on: the memory stays quarantined until a poll of the CQ delivers
    /// its completion); a polling error.
    pub fn revoke(&mut self, cq: &Cq, mut other: impl FnMut(Completion)) -> Result<(), GrantError> {
        self.poll_first(cq, &mut other)?;
        self.start_revoke()?;
        self.wait_revoked(cq, other)
    }

    /// Before a revocation is started: what `cq` already holds, so that a peer's SEND_WITH_INV
    /// there is seen before an invalidation is posted (a LOCAL_INV of a window the peer
    /// invalidated fails the QP on some devices; found by the hostile review of #52).
    fn poll_first(&self, cq: &Cq, other: &mut dyn FnMut(Completion)) -> Result<(), GrantError> {
        if !self.revoked {
            while let Some(wc) = cq.poll_one()? {
                other(wc);
            }
        }
        Ok(())
    }

    /// Wait until the key is dead, polling `cq` as [`Grant::wait`] does; starts the revocation
    /// first if nothing did (so it also finishes a [`Grant::revoke`] that timed out).
    ///
    /// # Errors
    /// [`GrantError::Timeout`] after [`WAIT`]; a polling error.
    pub fn wait_revoked(
        &mut self,
        cq: &Cq,
        mut other: impl FnMut(Completion),
    ) -> Result<(), GrantError> {
        if !self.revoked {
            self.start_revoke()?;
        }
        self.poll(cq, &mut other, |me| me.dead())
    }

    /// `Some` once the key is dead. A region that refused deregistration is retried here: no
    /// completion would.
    pub(super) fn dead(&self) -> Option<Result<(), GrantError>> {
        let grants = self.pool.grants;
        let (key, seq) = (self.g.key, self.g.seq);
        let done = grants.state(key, seq).is_none_or(|(_, done)| done);
        (done || grants.retry(self.pool.core, key, seq)).then_some(Ok(()))
    }

    /// Start the revocation without waiting: the key dies when a poll of the QP's send CQ
    /// (the application's [`Cq::poll`]) delivers the invalidation's completion (see
    /// [`Grant::is_revoked`]); region grants die at once.
    ///
    /// # Errors
    /// [`GrantError::Revoked`] when already revoked.
    pub fn start_revoke(&mut self) -> Result<(), GrantError> {
        if self.revoked {
            return Err(GrantError::Revoked);
        }
        self.revoked = true;
        self.pool
            .grants
            .revoke(self.pool.core, self.g.key, self.g.seq)
    }

    fn poll(
        &self,
        cq: &Cq,
        other: &mut dyn FnMut(Completion),
        mut done: impl FnMut(&Self) -> Option<Result<(), GrantError>>,
    ) -> Result<(), GrantError> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(r) = done(self) {
                return r;
            }
            // The pool's completions reach it inside the poll; only the application's come out.
            match cq.poll_one()? {
                Some(wc) => other(wc),
                None if Instant::now() > deadline => return Err(GrantError::Timeout(WAIT)),
                None => std::thread::yield_now(),
            }
        }
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        self.pool
            .grants
            .release(self.pool.core, self.g.key, self.g.seq);
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A buffer an [`OwnedGrant`] can own: its bytes stay where they are when it moves (a heap
/// buffer, not an array).
pub trait GrantBuf: sealed::Sealed {
    /// The bytes.
    fn bytes(&self) -> &[u8];
}

macro_rules! grant_buf {
    ($($(#[$m:meta])* [$($g:tt)*] $t:ty),* $(,)?) => {$(
        impl<$($g)*> sealed::Sealed for $t {}
        impl<$($g)*> GrantBuf for $t {
            fn bytes(&self) -> &[u8] {
                self
            }
        }
    )*};
}

grant_buf!(
    [] Vec<u8>,
    [] Box<[u8]>,
    [A: allocator_api2::alloc::Allocator] allocator_api2::vec::Vec<u8, A>,
    [A: allocator_api2::alloc::Allocator] allocator_api2::boxed::Box<[u8], A>,
);

/// A grant that owns its buffer and gives it back once the key is dead. Dropping it starts
/// the revocation and frees the buffer into quarantine.
///
/// # Examples
/// ```
/// use allocator_api2::vec;
/// use rdma_pool::Pool;
/// use rdma_pool::nic::{Access, Nic, QpCaps};
/// let nic = Nic::soft();
/// let pd = nic.alloc_pd()?;
/// let pool = Pool::new(&pd)?;
/// let cq = nic.create_cq(64)?;
/// let (a, b) = (pd.create_qp(&cq, &cq, QpCaps::default())?, nic.alloc_pd()?.create_qp(&cq, &cq, QpCaps::default())?);
/// a.connect(&b.endpoint()?)?;
/// b.connect(&a.endpoint()?)?;
/// let grant = pool.grant_owned(vec![in &pool; 7u8; 100], &a, Access::REMOTE_WRITE).map_err(|(_, e)| e)?;
/// let buf = grant.revoke(&cq, |_| {}).map_err(|(_, e)| e)?;
/// assert_eq!(buf[99], 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a grant revokes it"]
pub struct OwnedGrant<'p, B: GrantBuf> {
    // Dropped first: the revocation starts before the buffer is freed into quarantine.
    pub(super) grant: Grant<'p>,
    buf: B,
}

impl<B: GrantBuf> std::fmt::Debug for OwnedGrant<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.grant.fmt(f)
    }
}

impl<'p, B: GrantBuf> std::ops::Deref for OwnedGrant<'p, B> {
    type Target = Grant<'p>;
    /// The grant, to read its key and range (never `&mut`: a grant swapped out of its owner
    /// would revoke one key and give back another buffer).
    fn deref(&self) -> &Grant<'p> {
        &self.grant
    }
}

impl<'p, B: GrantBuf> OwnedGrant<'p, B> {
    /// The grant.
    pub fn grant(&self) -> &Grant<'p> {
        &self.grant
    }

    /// Wait until the bind completed (see [`Grant::wait`]).
    ///
    /// # Errors
    /// As [`Grant::wait`].
    pub fn wait(&mut self, cq: &Cq, other: impl FnMut(Completion)) -> Result<(), GrantError> {
        self.grant.wait(cq, other)
    }

    /// Start the revocation without waiting (see [`Grant::start_revoke`]); [`OwnedGrant::revoke`]
    /// then gives the buffer back once the key is dead.
    ///
    /// # Errors
    /// As [`Grant::start_revoke`].
    pub fn start_revoke(&mut self) -> Result<(), GrantError> {
        self.grant.start_revoke()
    }

    /// Copy the granted bytes from `offset` into `out` (as many as fit; returns how many)
    /// while the peer may be writing them: each byte is read with an atomic load, so the copy
    /// races with the NIC without undefined behaviour. What it sees of a write in progress is
    /// the application's protocol to settle (read after the completion or message that says a
    /// range is done, e.g. a WRITE_WITH_IMM).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, Nic, QpCaps};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd()?;
    /// let pool = rdma_pool::Pool::new(&pd)?;
    /// let cq = nic.create_cq(8)?;
    /// let (a, b) = (pd.create_qp(&cq, &cq, QpCaps::default())?, pd.create_qp(&cq, &cq, QpCaps::default())?);
    /// a.connect(&b.endpoint()?)?;
    /// b.connect(&a.endpoint()?)?;
    /// let g = pool.grant_owned(allocator_api2::vec![in &pool; 5u8; 64], &a, Access::REMOTE_WRITE).map_err(|(_, e)| e)?;
    /// let mut out = [0u8; 16];
    /// assert_eq!(g.read_at(56, &mut out), 8);
    /// assert_eq!(out[..8], [5u8; 8]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> usize {
        let len = self.grant.g.len;
        let n = len.saturating_sub(offset).min(out.len());
        let base = self.grant.g.addr + offset.min(len);
        for (i, o) in out[..n].iter_mut().enumerate() {
            // SAFETY: `base + i` lies in the granted range of the buffer this grant owns (alive
            // and never moved while owned); bytes are read as atomics, as the NIC may write them.
            *o = unsafe { AtomicU8::from_ptr((base + i) as *mut u8) }.load(Relaxed);
        }
        n
    }

    /// Revoke, wait as [`Grant::wait_revoked`] does, and give the buffer back once the key is
    /// dead. On an error (a timeout) the key may still work: the grant comes back with the
    /// error, still owning the buffer — call `revoke` again, or drop it (the buffer then waits
    /// in quarantine).
    ///
    /// # Errors
    /// As [`Grant::wait_revoked`], with the grant.
    #[allow(clippy::result_large_err)]
    pub fn revoke(
        mut self,
        cq: &Cq,
        other: impl FnMut(Completion),
    ) -> Result<B, (Self, GrantError)> {
        let mut other = other;
        let r = self.grant.poll_first(cq, &mut other);
        if let Err(e) = r.and_then(|()| self.grant.wait_revoked(cq, other)) {
            return Err((self, e));
        }
        Ok(self.into_buf())
    }

    /// The buffer, once the key is dead (the grant is dropped).
    pub(super) fn into_buf(self) -> B {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; each field is moved out once.
        let (grant, buf) = unsafe { (std::ptr::read(&me.grant), std::ptr::read(&me.buf)) };
        drop(grant);
        buf
    }
}

impl<'p> GrantCtx<'p> {
    /// A grant of `access` on `buf` ([`Pool::grant_with`](crate::Pool::grant_with)).
    ///
    /// # Safety
    /// As `Pool::grant_with`.
    pub(crate) unsafe fn grant_with(
        self,
        buf: &'p [u8],
        qp: &Qp,
        access: Access,
        kind: GrantKind,
    ) -> Result<Grant<'p>, GrantError> {
        let g = self.issue(buf.as_ptr() as usize, buf.len(), qp, access, kind)?;
        Ok(Grant {
            pool: self,
            g,
            revoked: false,
            _buf: PhantomData,
        })
    }

    /// A grant of `access` owning `buf` ([`Pool::grant_owned_with`](crate::Pool::grant_owned_with)).
    pub(crate) fn grant_owned_with<B: GrantBuf>(
        self,
        buf: B,
        qp: &Qp,
        access: Access,
        kind: GrantKind,
    ) -> Result<OwnedGrant<'p, B>, (B, GrantError)> {
        let bytes = buf.bytes();
        match self.issue(bytes.as_ptr() as usize, bytes.len(), qp, access, kind) {
            Ok(g) => Ok(OwnedGrant {
                grant: Grant {
                    pool: self,
                    g,
                    revoked: false,
                    _buf: PhantomData,
                },
                buf,
            }),
            Err(e) => Err((buf, e)),
        }
    }
}
