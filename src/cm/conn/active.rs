//! The active side: resolving an address and route to a device ([`resolve`], [`Resolved`]),
//! then connecting ([`Resolved::connect`]), or both at once ([`connect`]), blocking or async.
//!
//! Contract (see the module contract in `cm/mod.rs`):
//! - the device is known once the route is resolved ([`Resolved::nic`]), before any QP is
//!   created, so the pool, PD and CQs can be built on it;
//! - blocking set-up waits for each event until one deadline from `opts.timeout` (one for the
//!   whole of [`connect`]); async set-up has no overall timeout, and dropping its future
//!   destroys what it created;
//! - a [`Connection`] is returned only once ESTABLISHED has been read.

use super::Connection;
use super::id::Id;
use super::param::{check_len, conn_param, expect, ms};
#[cfg(feature = "tokio")]
use crate::cm::event::AsyncChannel;
use crate::cm::event::{Channel, Event, deadline};
use crate::cm::{
    CmError, CmOptions, MAX_CONNECT_DATA, QpSpec, frame_data, from_sockaddr, to_sockaddr,
};
use crate::nic::{Nic, Qp};
use ffi::rdma_cm_event_type as ev;
use rdma_sys as ffi;
use std::net::SocketAddr;

/// An address and route resolved (`rdma_resolve_addr`, `rdma_resolve_route`): the device
/// the connection will use is known ([`Resolved::nic`]), so the pool, PD and CQs can be built
/// on it before [`Resolved::connect`].
pub struct Resolved {
    id: Id,
    channel: Channel,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved").finish_non_exhaustive()
    }
}

impl Resolved {
    fn start(addr: &SocketAddr, opts: &CmOptions) -> Result<Resolved, CmError> {
        let channel = Channel::new()?;
        let id = Id::new(&channel)?;
        let mut dst = to_sockaddr(addr);
        // SAFETY: the id is live; `dst` outlives the call.
        let rc = unsafe {
            ffi::rdma_resolve_addr(
                id.0,
                std::ptr::null_mut(),
                (&raw mut dst).cast(),
                ms(opts.resolve_timeout),
            )
        };
        if rc != 0 {
            return Err(CmError::os("rdma_resolve_addr"));
        }
        Ok(Resolved { id, channel })
    }

    fn resolve_route(&self, opts: &CmOptions) -> Result<(), CmError> {
        // SAFETY: the id is live and its address resolved.
        if unsafe { ffi::rdma_resolve_route(self.id.0, ms(opts.resolve_timeout)) } != 0 {
            return Err(CmError::os("rdma_resolve_route"));
        }
        Ok(())
    }

    /// The device the route leaves through, on rdma_cm's context: build the pool, PD and
    /// CQs of [`Resolved::connect`] on it.
    ///
    /// # Errors
    /// The device's failure to attach.
    pub fn nic(&self) -> Result<Nic, CmError> {
        // SAFETY: rdma_cm keeps the context open for the process's life.
        unsafe { Nic::from_raw_context(self.id.verbs()) }.map_err(CmError::Nic)
    }

    /// The local address the route uses.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live; its route holds a socket address of its family.
        unsafe { from_sockaddr(ffi::rdma_get_local_addr(&*self.id.0)) }
    }

    fn post_connect(
        &self,
        spec: &QpSpec<'_>,
        data: &[u8],
        opts: &CmOptions,
    ) -> Result<Qp, CmError> {
        check_len(data, MAX_CONNECT_DATA)?;
        let qp = self.id.create_qp(spec)?;
        let data = frame_data(data);
        let mut param = conn_param(&data, opts);
        // SAFETY: the id is live with its QP; `param` and `data` outlive the call.
        if unsafe { ffi::rdma_connect(self.id.0, &mut param) } != 0 {
            return Err(CmError::os("rdma_connect"));
        }
        Ok(qp)
    }

    fn established(self, qp: Qp, e: Event) -> Connection {
        Connection::new(self.id, qp, e.private_data, self.channel)
    }

    /// Connect with a QP as `spec` says (in a PD of [`Resolved::nic`]), sending
    /// `private_data` (at most [`MAX_CONNECT_DATA`] bytes).
    ///
    /// # Errors
    /// [`CmError::WrongDevice`] for a PD of another device; [`CmError::Rejected`] with the
    /// peer's data; [`CmError::Unexpected`] for a connection error; [`CmError::Timeout`]
    /// after `opts.timeout`.
    pub fn connect(
        self,
        spec: &QpSpec<'_>,
        private_data: &[u8],
        opts: &CmOptions,
    ) -> Result<Connection, CmError> {
        self.connect_until(spec, private_data, opts, deadline(opts.timeout))
    }

    fn connect_until(
        self,
        spec: &QpSpec<'_>,
        private_data: &[u8],
        opts: &CmOptions,
        end: std::time::Instant,
    ) -> Result<Connection, CmError> {
        let qp = self.post_connect(spec, private_data, opts)?;
        let e = self.channel.wait(end)?;
        let e = expect(e, ev::RDMA_CM_EVENT_ESTABLISHED, "ESTABLISHED")?;
        Ok(self.established(qp, e))
    }

    /// [`Resolved::connect`], awaited (feature `tokio`); without `opts.timeout`.
    ///
    /// # Errors
    /// As [`Resolved::connect`].
    #[cfg(feature = "tokio")]
    pub async fn connect_async(
        self,
        spec: &QpSpec<'_>,
        private_data: &[u8],
        opts: &CmOptions,
    ) -> Result<Connection, CmError> {
        let qp = self.post_connect(spec, private_data, opts)?;
        let afd = AsyncChannel::new(&self.channel)?;
        let e = self.channel.wait_async(&afd).await?;
        drop(afd);
        let e = expect(e, ev::RDMA_CM_EVENT_ESTABLISHED, "ESTABLISHED")?;
        Ok(self.established(qp, e))
    }
}

/// Resolve `addr` (an IP address and port a [`CmListener`] listens on) to a device and a
/// route; then [`Resolved::connect`].
///
/// # Errors
/// [`CmError::Unexpected`] for an address or route error (its errno in `status`: no route,
/// no RDMA device on it); [`CmError::Timeout`] after `opts.timeout`.
///
/// [`CmListener`]: super::CmListener
pub fn resolve(addr: SocketAddr, opts: &CmOptions) -> Result<Resolved, CmError> {
    resolve_until(addr, opts, deadline(opts.timeout))
}

fn resolve_until(
    addr: SocketAddr,
    opts: &CmOptions,
    end: std::time::Instant,
) -> Result<Resolved, CmError> {
    let r = Resolved::start(&addr, opts)?;
    expect(
        r.channel.wait(end)?,
        ev::RDMA_CM_EVENT_ADDR_RESOLVED,
        "ADDR_RESOLVED",
    )?;
    r.resolve_route(opts)?;
    expect(
        r.channel.wait(end)?,
        ev::RDMA_CM_EVENT_ROUTE_RESOLVED,
        "ROUTE_RESOLVED",
    )?;
    Ok(r)
}

/// [`resolve`], awaited (feature `tokio`); without `opts.timeout` (the resolutions have their
/// own, `opts.resolve_timeout`).
///
/// # Errors
/// As [`resolve`].
#[cfg(feature = "tokio")]
pub async fn resolve_async(addr: SocketAddr, opts: &CmOptions) -> Result<Resolved, CmError> {
    let r = Resolved::start(&addr, opts)?;
    let afd = AsyncChannel::new(&r.channel)?;
    let e = r.channel.wait_async(&afd).await?;
    expect(e, ev::RDMA_CM_EVENT_ADDR_RESOLVED, "ADDR_RESOLVED")?;
    r.resolve_route(opts)?;
    let e = r.channel.wait_async(&afd).await?;
    expect(e, ev::RDMA_CM_EVENT_ROUTE_RESOLVED, "ROUTE_RESOLVED")?;
    drop(afd);
    Ok(r)
}

/// Connect to `addr` with a QP as `spec` says: [`resolve`], then [`Resolved::connect`]; for
/// a PD already on the device the route takes (a `GlobalPool` opened with
/// [`open_default`](crate::cm::open_default), say).
///
/// # Errors
/// As [`resolve`] and [`Resolved::connect`].
pub fn connect(
    addr: SocketAddr,
    spec: &QpSpec<'_>,
    private_data: &[u8],
    opts: &CmOptions,
) -> Result<Connection, CmError> {
    check_len(private_data, MAX_CONNECT_DATA)?;
    // One deadline for the whole set-up.
    let end = deadline(opts.timeout);
    resolve_until(addr, opts, end)?.connect_until(spec, private_data, opts, end)
}

/// [`connect`], awaited (feature `tokio`). Dropping the future destroys what it created.
///
/// # Errors
/// As [`connect`].
#[cfg(feature = "tokio")]
pub async fn connect_async(
    addr: SocketAddr,
    spec: &QpSpec<'_>,
    private_data: &[u8],
    opts: &CmOptions,
) -> Result<Connection, CmError> {
    check_len(private_data, MAX_CONNECT_DATA)?;
    resolve_async(addr, opts)
        .await?
        .connect_async(spec, private_data, opts)
        .await
}
