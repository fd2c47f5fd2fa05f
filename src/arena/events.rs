//! Device events: the arena reads its device's asynchronous events and, once the device is
//! dead, stops calling it while it keeps serving memory.
//!
//! Contract:
//! - [`Arena::poll_device_events`] reads every pending event (`ibv_get_async_event`, without
//!   blocking; injected on the soft NIC), counts it, and logs it with `tracing` (port changes
//!   at `info`, a fatal event at `error`); the arena also polls on its growth path, so an
//!   application that never asks still learns of a dead device at its next growth;
//! - after [`AsyncEvent::DeviceFatal`] the device is *dead* for the arena: no registration,
//!   re-registration or prefetch is attempted any more; new runs are served unregistered
//!   ([`DegradeCause::DeviceDead`](super::DegradeCause), counted like any degradation), or
//!   fail under `RegistrationPolicy::Required`; memory handed out before stays mapped (its
//!   keys are dead with the device); grants refuse to start (`GrantError::Unavailable`).
//!   A dead device does not come back: a new arena on a new device does.
//!
//! Invariant: `dead` only goes from false to true.

use super::Arena;
use super::stats::add;
use crate::nic::AsyncEvent;
use std::sync::atomic::Ordering;

impl Arena {
    /// Read and act on every pending asynchronous event of the arena's device; returns how
    /// many were read.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// use rdma_pool::nic::{AsyncEvent, Nic};
    /// let nic = Nic::soft();
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// let arena = Arena::new(&nic.alloc_pd()?, cfg)?;
    /// let before = arena.alloc_run(4096, 64)?;
    /// nic.as_soft().unwrap().inject_event(AsyncEvent::DeviceFatal);
    /// assert_eq!(arena.poll_device_events(), 1);
    /// assert!(arena.stats().device_dead);
    /// let after = arena.alloc_run(4096, 64)?; // still served, without keys
    /// assert_eq!(arena.keys_of(after.as_ptr()), None);
    /// # let _ = before;
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn poll_device_events(&self) -> usize {
        let mut n = 0;
        // Bounded: a device that floods events does not hold the caller forever.
        while n < 1024 {
            let ev = match self.pd.nic().poll_async_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(target: "rdma_pool::arena", error = %e, "reading device events failed");
                    break;
                }
            };
            n += 1;
            add(&self.counters.device_events, 1);
            let device = self.pd.nic().caps().name.as_str();
            match ev {
                AsyncEvent::DeviceFatal => {
                    if !self.dead.swap(true, Ordering::AcqRel) {
                        tracing::error!(
                            target: "rdma_pool::arena",
                            device,
                            "device fatal: the pool stops calling it and serves memory unregistered"
                        );
                    }
                }
                AsyncEvent::PortError { port } => {
                    add(&self.counters.port_errors, 1);
                    tracing::warn!(target: "rdma_pool::arena", device, port, "port down");
                }
                AsyncEvent::PortActive { port } => {
                    tracing::info!(target: "rdma_pool::arena", device, port, "port up");
                }
                ev => tracing::info!(target: "rdma_pool::arena", device, ?ev, "device event"),
            }
        }
        n
    }

    /// Whether the device is dead for the arena (see the module contract).
    pub fn device_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
}
