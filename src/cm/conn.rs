//! Active and passive connection set-up: [`connect`]/[`connect_async`] and [`CmListener`],
//! each step waiting for its rdma_cm event (see the module contract in `mod.rs`).

#[cfg(feature = "tokio")]
use super::event::AsyncChannel;
use super::event::{Channel, Event, deadline, event_name};
use super::{
    CmError, CmOptions, MAX_ACCEPT_DATA, MAX_CONNECT_DATA, QpSpec, frame_data, from_sockaddr,
    to_sockaddr, unframe_data,
};
use crate::nic::{Nic, Qp};
use ffi::rdma_cm_event_type as ev;
use rdma_sys as ffi;
use std::net::SocketAddr;

/// An rdma_cm id, destroyed on drop (its QP, if any, is the [`Qp`]'s to destroy).
struct Id(*mut ffi::rdma_cm_id);

// SAFETY: librdmacm's id calls are thread-safe; the pointer is only passed to them.
unsafe impl Send for Id {}
// SAFETY: as above.
unsafe impl Sync for Id {}

impl Id {
    fn new(ch: &Channel) -> Result<Id, CmError> {
        let mut id = std::ptr::null_mut();
        // SAFETY: `ch` is live; `id` is ours.
        let rc = unsafe {
            ffi::rdma_create_id(
                ch.raw,
                &mut id,
                std::ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(CmError::os("rdma_create_id"));
        }
        Ok(Id(id))
    }

    /// The device context rdma_cm bound the id to (null before its address is known).
    fn verbs(&self) -> *mut std::ffi::c_void {
        // SAFETY: the id is live.
        unsafe { (*self.0).verbs.cast() }
    }

    fn check_device(&self, spec: &QpSpec<'_>) -> Result<(), CmError> {
        if spec.pd.nic().raw_context() != Some(self.verbs()) {
            return Err(CmError::WrongDevice);
        }
        Ok(())
    }

    /// `rdma_create_qp` in the spec's PD on its CQs, as an owned [`Qp`].
    fn create_qp(&self, spec: &QpSpec<'_>) -> Result<Qp, CmError> {
        self.check_device(spec)?;
        // The CQs and SRQ must be the PD's device's: a handle of another context would name
        // another object there.
        let nic = spec.pd.nic();
        if !nic.same_device(spec.send_cq.nic()) || !nic.same_device(spec.recv_cq.nic()) {
            return Err(CmError::Nic(crate::nic::Error::invalid_arg(
                "a CQ of another device than the PD's",
            )));
        }
        if let Some(srq) = spec.srq {
            if srq.pd() != spec.pd {
                return Err(CmError::Nic(crate::nic::Error::invalid_arg(
                    "an SRQ of another PD",
                )));
            }
            if srq.cq().as_raw() != spec.recv_cq.as_raw() {
                return Err(CmError::Nic(crate::nic::Error::invalid_arg(
                    "with an SRQ, recv_cq must be the SRQ's CQ",
                )));
            }
        }
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = spec.send_cq.as_raw() as usize as *mut ffi::ibv_cq;
        init.recv_cq = spec.recv_cq.as_raw() as usize as *mut ffi::ibv_cq;
        if let Some(srq) = spec.srq {
            init.srq = srq.as_raw() as usize as *mut ffi::ibv_srq;
        }
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        init.cap = ffi::ibv_qp_cap {
            max_send_wr: spec.caps.max_send_wr,
            max_recv_wr: if spec.srq.is_some() {
                0
            } else {
                spec.caps.max_recv_wr
            },
            max_send_sge: spec.caps.max_send_sge,
            max_recv_sge: if spec.srq.is_some() {
                0
            } else {
                spec.caps.max_recv_sge
            },
            max_inline_data: spec.caps.max_inline_data,
        };
        let pd = spec.pd.as_raw() as usize as *mut ffi::ibv_pd;
        // SAFETY: the id is bound to the PD's context (checked); the CQs and SRQ are live
        // objects of it; `init` outlives the call.
        if unsafe { ffi::rdma_create_qp(self.0, pd, &mut init) } != 0 {
            return Err(CmError::os("rdma_create_qp"));
        }
        // SAFETY: rdma_cm just created it in `pd` on these CQs; from now on only the `Qp`
        // destroys it (`Drop for Id` clears the id's pointer first).
        let qp = unsafe {
            Qp::adopt_owned(
                spec.pd,
                (*self.0).qp.cast(),
                spec.send_cq,
                spec.recv_cq,
                spec.srq,
            )
        };
        qp.map_err(CmError::Nic)
    }
}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once; its QP (if any) is destroyed by its `Qp`, not here.
        unsafe {
            (*self.0).qp = std::ptr::null_mut();
            ffi::rdma_destroy_id(self.0);
        }
    }
}

/// `data` as connection parameters (its pointer valid while `data` lives).
fn conn_param(data: &[u8], opts: &CmOptions) -> ffi::rdma_conn_param {
    ffi::rdma_conn_param {
        private_data: if data.is_empty() {
            std::ptr::null()
        } else {
            data.as_ptr().cast()
        },
        private_data_len: data.len() as u8,
        responder_resources: opts.responder_resources,
        initiator_depth: opts.initiator_depth,
        flow_control: 1,
        retry_count: opts.retry_count.min(7),
        rnr_retry_count: opts.rnr_retry_count.min(7),
        srq: 0,
        qp_num: 0,
    }
}

fn check_len(data: &[u8], max: usize) -> Result<(), CmError> {
    if data.len() > max {
        return Err(CmError::PrivateDataTooLong {
            len: data.len(),
            max,
        });
    }
    Ok(())
}

/// `e` if it is `want`, else the error it means.
fn expect(
    e: Event,
    want: ffi::rdma_cm_event_type::Type,
    name: &'static str,
) -> Result<Event, CmError> {
    if e.kind == want && e.status == 0 {
        return Ok(e);
    }
    if e.kind == ev::RDMA_CM_EVENT_REJECTED {
        return Err(CmError::Rejected {
            status: e.status,
            private_data: e.private_data,
        });
    }
    Err(CmError::Unexpected {
        want: name,
        got: event_name(e.kind),
        status: e.status,
    })
}

fn ms(d: std::time::Duration) -> i32 {
    d.as_millis().clamp(1, i32::MAX as u128) as i32
}

/// An established RC connection: its QP (an ordinary [`Qp`] for grants, owned and raw
/// posts) and what the peer sent with it. Dropping it disconnects.
///
/// A peer's disconnect reaches this side as an rdma_cm event: when
/// [`Connection::wait_disconnected`] (or `Connection::disconnected`, feature `tokio`) reads it,
/// the crate answers it and the QP moves to the error state, flushing every receive and send
/// still posted. Await it alongside the receives: until it is read, a receive posted for a peer
/// that left waits.
pub struct Connection {
    id: Id,
    qp: Qp,
    peer_data: Vec<u8>,
    disconnected: bool,
    channel: Channel,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("qp", &self.qp)
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if !self.disconnected {
            // SAFETY: the id is live.
            unsafe { ffi::rdma_disconnect(self.id.0) };
        }
    }
}

impl Connection {
    /// An established connection of `id` (reporting to `channel`) with its QP.
    fn new(id: Id, qp: Qp, peer_data: Vec<u8>, channel: Channel) -> Connection {
        Connection {
            id,
            qp,
            peer_data,
            disconnected: false,
            channel,
        }
    }

    /// The connection's QP.
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The private data the peer sent with its connect (passive side) or accept (active),
    /// exactly; empty when the peer did not frame it (see [`Connection::peer_data_raw`]).
    pub fn peer_data(&self) -> &[u8] {
        unframe_data(&self.peer_data).unwrap_or(&[])
    }

    /// The private data as it arrived: padded by the CM to its fixed size, framed with a
    /// length byte by an rdma-pool peer.
    pub fn peer_data_raw(&self) -> &[u8] {
        &self.peer_data
    }

    /// This side's address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live; its route holds a socket address of its family.
        unsafe { from_sockaddr(ffi::rdma_get_local_addr(&*self.id.0)) }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe { from_sockaddr(ffi::rdma_get_peer_addr(&*self.id.0)) }
    }

    /// Wait until the peer disconnects (or `timeout` passes).
    ///
    /// # Errors
    /// [`CmError::Timeout`]; a channel failure.
    pub fn wait_disconnected(&mut self, timeout: std::time::Duration) -> Result<(), CmError> {
        let end = deadline(timeout);
        while !self.disconnected {
            let e = self.channel.wait(end)?;
            self.on_event(&e);
        }
        Ok(())
    }

    /// The peer left: answer its disconnect, which also moves the QP to the error state, so
    /// every receive and send still posted comes back flushed.
    fn on_event(&mut self, e: &Event) {
        if e.kind == ev::RDMA_CM_EVENT_DISCONNECTED && !self.disconnected {
            self.disconnected = true;
            // SAFETY: the id is live.
            unsafe { ffi::rdma_disconnect(self.id.0) };
        }
    }

    /// Wait (feature `tokio`) until the peer disconnects.
    ///
    /// # Errors
    /// A channel failure.
    #[cfg(feature = "tokio")]
    pub async fn disconnected(&mut self) -> Result<(), CmError> {
        if self.disconnected {
            return Ok(());
        }
        // Registered for this call only: the next one may run on another runtime.
        let afd = AsyncChannel::new(&self.channel)?;
        while !self.disconnected {
            let e = self.channel.wait_async(&afd).await?;
            self.on_event(&e);
        }
        Ok(())
    }

    /// Disconnect now (`rdma_disconnect`; the QP moves to the error state and flushes).
    ///
    /// # Errors
    /// The `rdma_disconnect` failure.
    pub fn disconnect(mut self) -> Result<(), CmError> {
        self.disconnected = true;
        // SAFETY: the id is live.
        if unsafe { ffi::rdma_disconnect(self.id.0) } != 0 {
            return Err(CmError::os("rdma_disconnect"));
        }
        Ok(())
    }
}

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
/// [`open_default`](super::open_default), say).
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
