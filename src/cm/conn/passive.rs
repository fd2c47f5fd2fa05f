//! The passive side: [`CmListener`] binds and listens, and accepts connect requests one at a
//! time, blocking or async.
//!
//! Contract (see the module contract in `cm/mod.rs`):
//! - a request that came on another device than the PD's is rejected
//!   ([`CmError::WrongDevice`]); an accepted one gets its own event channel (`rdma_migrate_id`)
//!   before it is answered;
//! - the listener's other events are skipped while waiting for a request; a device removal
//!   ends the wait with an error;
//! - a [`Connection`] is returned only once ESTABLISHED has been read; dropping an async
//!   accept before a request came loses nothing, after, the request is rejected.

use super::Connection;
use super::id::Id;
use super::param::{check_len, conn_param, expect};
#[cfg(feature = "tokio")]
use crate::cm::event::AsyncChannel;
use crate::cm::event::{Channel, Event, deadline};
use crate::cm::{
    CmError, CmOptions, MAX_ACCEPT_DATA, QpSpec, frame_data, from_sockaddr, to_sockaddr,
};
use crate::nic::{Nic, Qp};
use ffi::rdma_cm_event_type as ev;
use rdma_sys as ffi;
use std::net::SocketAddr;

/// A listening rdma_cm id: [`CmListener::accept`] takes its connect requests one at a time.
///
/// # Examples
/// ```no_run
/// use rdma_pool::cm::{CmListener, CmOptions, QpSpec};
/// let listener = CmListener::bind("10.0.0.1:7471".parse()?)?;
/// let nic = listener.nic().expect("bound to an RDMA device's address");
/// let pd = nic.alloc_pd()?;
/// let cq = nic.create_cq(64)?;
/// let conn = listener.accept(&QpSpec::new(&pd, &cq), b"hello", &CmOptions::default())?;
/// println!("{:?} connected: {:?}", conn.peer_addr(), conn.peer_data());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CmListener {
    id: Id,
    channel: Channel,
}

impl std::fmt::Debug for CmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmListener")
            .field("local", &self.local_addr())
            .finish()
    }
}

/// A connect request taken from a listener, not answered yet.
struct Passive {
    id: Id,
    channel: Channel,
    data: Vec<u8>,
}

impl Passive {
    /// Take the request `e` (the new id reports to the listener's channel until migrated).
    fn take(e: Event, spec: &QpSpec<'_>) -> Result<Passive, CmError> {
        let id = Id(e.id);
        if let Err(err) = id.check_device(spec) {
            // SAFETY: the new id is live; a reject with no data.
            unsafe { ffi::rdma_reject(id.0, std::ptr::null(), 0) };
            return Err(err);
        }
        let channel = Channel::new()?;
        // SAFETY: both live; the id's events go to its own channel from now on.
        if unsafe { ffi::rdma_migrate_id(id.0, channel.raw) } != 0 {
            return Err(CmError::os("rdma_migrate_id"));
        }
        Ok(Passive {
            id,
            channel,
            data: e.private_data,
        })
    }

    fn accept(&self, spec: &QpSpec<'_>, data: &[u8], opts: &CmOptions) -> Result<Qp, CmError> {
        let qp = self.id.create_qp(spec)?;
        let data = frame_data(data);
        let mut param = conn_param(&data, opts);
        // SAFETY: the id is live with its QP; `param` and `data` outlive the call.
        if unsafe { ffi::rdma_accept(self.id.0, &mut param) } != 0 {
            return Err(CmError::os("rdma_accept"));
        }
        Ok(qp)
    }

    fn established(self, qp: Qp) -> Connection {
        Connection::new(self.id, qp, self.data, self.channel)
    }
}

impl CmListener {
    /// Listen on `addr` (port 0: any free port, see [`CmListener::local_addr`]).
    ///
    /// # Errors
    /// [`CmError::Os`] from `rdma_bind_addr` (no RDMA device has that address:
    /// `EADDRNOTAVAIL`/`ENODEV`) or `rdma_listen`.
    pub fn bind(addr: SocketAddr) -> Result<CmListener, CmError> {
        let channel = Channel::new()?;
        let id = Id::new(&channel)?;
        let mut sa = to_sockaddr(&addr);
        // SAFETY: the id is live; `sa` outlives the call.
        if unsafe { ffi::rdma_bind_addr(id.0, (&raw mut sa).cast()) } != 0 {
            return Err(CmError::os("rdma_bind_addr"));
        }
        // SAFETY: the id is live and bound.
        if unsafe { ffi::rdma_listen(id.0, 64) } != 0 {
            return Err(CmError::os("rdma_listen"));
        }
        Ok(CmListener { id, channel })
    }

    /// The address it listens on (with the port chosen for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live; its route holds a socket address of its family.
        unsafe { from_sockaddr(ffi::rdma_get_local_addr(&*self.id.0)) }
    }

    /// The device it listens on, on rdma_cm's context (build the pool on it); `None` for a
    /// wildcard address.
    pub fn nic(&self) -> Option<Nic> {
        let ctx = self.id.verbs();
        if ctx.is_null() {
            return None;
        }
        // SAFETY: rdma_cm keeps the context open for the process's life.
        unsafe { Nic::from_raw_context(ctx) }.ok()
    }

    /// Wait for the next connect request and accept it with a QP as `spec` says, answering
    /// `private_data` (at most [`MAX_ACCEPT_DATA`] bytes); the requester's data is in
    /// [`Connection::peer_data`].
    ///
    /// # Errors
    /// [`CmError::WrongDevice`] (the request is rejected) when it came on another device than
    /// the PD's; [`CmError::Timeout`] after `opts.timeout`; a failed accept.
    pub fn accept(
        &self,
        spec: &QpSpec<'_>,
        private_data: &[u8],
        opts: &CmOptions,
    ) -> Result<Connection, CmError> {
        check_len(private_data, MAX_ACCEPT_DATA)?;
        let end = deadline(opts.timeout);
        let e = self.next_request(|| self.channel.wait(end))?;
        let p = Passive::take(e, spec)?;
        let qp = p.accept(spec, private_data, opts)?;
        expect(
            p.channel.wait(end)?,
            ev::RDMA_CM_EVENT_ESTABLISHED,
            "ESTABLISHED",
        )?;
        Ok(p.established(qp))
    }

    /// The next connect request (other events of the listener are skipped, a device removal
    /// ends it).
    fn next_request(
        &self,
        mut wait: impl FnMut() -> Result<Event, CmError>,
    ) -> Result<Event, CmError> {
        loop {
            let e = wait()?;
            match e.kind {
                ev::RDMA_CM_EVENT_CONNECT_REQUEST => return Ok(e),
                ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    return Err(
                        expect(e, ev::RDMA_CM_EVENT_CONNECT_REQUEST, "CONNECT_REQUEST")
                            .unwrap_err(),
                    );
                }
                _ => continue,
            }
        }
    }

    /// [`CmListener::accept`], awaited (feature `tokio`); without `opts.timeout`. Dropping
    /// the future before a request came loses nothing; after, the request is rejected.
    ///
    /// # Errors
    /// As [`CmListener::accept`].
    #[cfg(feature = "tokio")]
    pub async fn accept_async(
        &self,
        spec: &QpSpec<'_>,
        private_data: &[u8],
        opts: &CmOptions,
    ) -> Result<Connection, CmError> {
        check_len(private_data, MAX_ACCEPT_DATA)?;
        // Registered for this call only: the next one may run on another runtime.
        let afd = AsyncChannel::new(&self.channel)?;
        let e = loop {
            let e = self.channel.wait_async(&afd).await?;
            match e.kind {
                ev::RDMA_CM_EVENT_CONNECT_REQUEST => break e,
                ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    return Err(
                        expect(e, ev::RDMA_CM_EVENT_CONNECT_REQUEST, "CONNECT_REQUEST")
                            .unwrap_err(),
                    );
                }
                _ => continue,
            }
        };
        let p = Passive::take(e, spec)?;
        let qp = p.accept(spec, private_data, opts)?;
        drop(afd);
        let pafd = AsyncChannel::new(&p.channel)?;
        let e = p.channel.wait_async(&pafd).await?;
        drop(pafd);
        expect(e, ev::RDMA_CM_EVENT_ESTABLISHED, "ESTABLISHED")?;
        Ok(p.established(qp))
    }
}
