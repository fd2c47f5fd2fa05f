//! Which kind of region backs the arena, and what happens when a registration is refused.
//!
//! Contract:
//! - the mode ([`RegMode`]) is fixed when the arena is created: `Pinned` or `Odp` as asked, or,
//!   for [`Registration::Auto`], ODP exactly when the device has explicit ODP for every RC
//!   operation the pool needs (SEND, RECV, WRITE, READ, and ATOMIC when peers may use atomics)
//!   *and* no quirk makes ODP RDMA unsafe for arbitrary buffers
//!   ([`Quirk::OdpRdmaNeedsPageAlignment`]); the reason is kept ([`ModeReason`]);
//! - ODP mode registers one explicit ODP region per chunk when the chunk is first committed
//!   (keys fixed for the chunk's life; later slabs of the chunk need no NIC call), or one
//!   implicit region for the whole arena where asked for and offered;
//! - a refused pinned registration (`ENOMEM`/memlock, `max_mr`, rxe's `EINVAL` at its limits,
//!   any verb error) falls back to the chunk's ODP region where ODP is usable; failing that,
//!   [`RegistrationPolicy::Degrade`] serves the slabs unregistered (`keys_of` → `None`,
//!   counted, the cause recorded) and the next growth tries to register again, while
//!   [`RegistrationPolicy::Required`] fails the run;
//! - `RLIMIT_MEMLOCK`'s soft limit is raised to the hard one when the arena is created
//!   ([`preflight_memlock`]), and both are reported.

use super::stats::add;
use super::{Arena, Error, Registration, RegistrationPolicy, SLAB_SHIFT};
use crate::nic::quirks::{self, Quirk};
use crate::nic::{Access, Caps, OdpOps};
use std::sync::atomic::Ordering;

/// The kind of region the arena registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RegMode {
    /// Pinned regions.
    #[default]
    Pinned,
    /// On-demand-paging regions.
    Odp,
}

/// Why the arena registers in its [`RegMode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ModeReason {
    /// The configuration asked for this mode.
    #[default]
    Requested,
    /// `Auto`: the device has explicit ODP for every RC operation the pool needs.
    OdpSupported,
    /// `Auto`: the device has no explicit ODP.
    NoOdp,
    /// `Auto`: the device's RC ODP lacks an operation the pool needs.
    OdpOpsMissing,
    /// `Auto`: a known quirk makes ODP RDMA unsafe for arbitrary buffers (kernel rxe moves
    /// wrong bytes unless buffers are page-aligned).
    OdpRdmaUnsafe,
}

impl ModeReason {
    /// A short description for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ModeReason::Requested => "requested by the configuration",
            ModeReason::OdpSupported => "the device supports ODP for every RC operation needed",
            ModeReason::NoOdp => "the device has no explicit ODP",
            ModeReason::OdpOpsMissing => "the device's RC ODP lacks an operation the pool needs",
            ModeReason::OdpRdmaUnsafe => {
                "a device quirk makes ODP RDMA unsafe for arbitrary buffers"
            }
        }
    }
}

/// Why memory was served unregistered (or a strict arena failed a run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DegradeCause {
    /// The pinned-memory budget (`RLIMIT_MEMLOCK`): `ENOMEM` from the registration.
    Memlock,
    /// The device's region limit (`max_mr`).
    MaxMr,
    /// Another refusal by the NIC, with its errno (0 when it had none).
    Nic(i32),
    /// The device reported a fatal event (`events.rs`): nothing is registered on it any more.
    DeviceDead,
}

/// The last degradation: its cause and whether ODP could take over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Degradation {
    /// Why the pinned registration failed.
    pub cause: DegradeCause,
    /// The memory was registered as ODP instead (else it was served unregistered, or the run
    /// failed under [`RegistrationPolicy::Required`]).
    pub odp_fallback: bool,
}

impl Degradation {
    pub(crate) fn pack(self) -> u64 {
        let (code, errno) = match self.cause {
            DegradeCause::Memlock => (1u64, 0),
            DegradeCause::MaxMr => (2, 0),
            DegradeCause::Nic(e) => (3, e as u32 as u64),
            DegradeCause::DeviceDead => (4, 0),
        };
        code | (self.odp_fallback as u64) << 4 | errno << 32
    }

    pub(crate) fn unpack(v: u64) -> Option<Degradation> {
        let cause = match v & 0xf {
            1 => DegradeCause::Memlock,
            2 => DegradeCause::MaxMr,
            3 => DegradeCause::Nic((v >> 32) as u32 as i32),
            4 => DegradeCause::DeviceDead,
            _ => return None,
        };
        Some(Degradation {
            cause,
            odp_fallback: v >> 4 & 1 == 1,
        })
    }
}

/// `RLIMIT_MEMLOCK` as the arena found (and left) it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemlockInfo {
    /// Soft limit in bytes after the preflight (`u64::MAX`: unlimited).
    pub soft: u64,
    /// Hard limit in bytes.
    pub hard: u64,
    /// The preflight raised the soft limit to the hard one.
    pub raised: bool,
}

/// Read `RLIMIT_MEMLOCK` and raise the soft limit to the hard one where it is lower.
pub fn preflight_memlock() -> MemlockInfo {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return MemlockInfo::default();
    }
    let mut raised = false;
    if r.rlim_cur < r.rlim_max {
        let up = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: raising the soft limit up to the hard one is always permitted.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &up) } == 0 {
            r.rlim_cur = r.rlim_max;
            raised = true;
        }
    }
    let bytes = |v: libc::rlim_t| -> u64 {
        if v == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            v
        }
    };
    MemlockInfo {
        soft: bytes(r.rlim_cur),
        hard: bytes(r.rlim_max),
        raised,
    }
}

/// Whether ODP regions can carry every operation the pool needs on this device, and if not,
/// why.
pub(crate) fn odp_verdict(caps: &Caps, remote: Access) -> Result<(), ModeReason> {
    if !caps.odp.explicit {
        return Err(ModeReason::NoOdp);
    }
    let mut needed = OdpOps::SEND | OdpOps::RECV | OdpOps::WRITE | OdpOps::READ;
    if remote.contains(Access::REMOTE_ATOMIC) {
        needed |= OdpOps::ATOMIC;
    }
    if !caps.odp.rc.contains(needed) {
        return Err(ModeReason::OdpOpsMissing);
    }
    if quirks::applies(caps, Quirk::OdpRdmaNeedsPageAlignment) {
        return Err(ModeReason::OdpRdmaUnsafe);
    }
    Ok(())
}

/// The mode for `asked` on a device with `caps`: `(mode, reason, odp usable as a fallback)`.
///
/// # Errors
/// [`Error::Config`] for [`Registration::Odp`] on a device without explicit ODP for the
/// operations the pool needs.
pub(crate) fn choose_mode(
    asked: Registration,
    caps: &Caps,
    remote: Access,
) -> Result<(RegMode, ModeReason, bool), Error> {
    let verdict = odp_verdict(caps, remote);
    Ok(match (asked, verdict) {
        (Registration::Pinned, v) => (RegMode::Pinned, ModeReason::Requested, v.is_ok()),
        (Registration::Odp, Err(ModeReason::NoOdp | ModeReason::OdpOpsMissing)) => {
            return Err(Error::Config(
                "ODP registration asked for, but the device has no explicit ODP for SEND, RECV, WRITE and READ",
            ));
        }
        (Registration::Odp, _) => (RegMode::Odp, ModeReason::Requested, true),
        (Registration::Auto, Ok(())) => (RegMode::Odp, ModeReason::OdpSupported, true),
        (Registration::Auto, Err(why)) => (RegMode::Pinned, why, false),
    })
}

/// The cause recorded for a refused registration.
pub(super) fn cause_of(e: &Error) -> DegradeCause {
    match e {
        Error::Nic(crate::nic::Error::Limit { limit, .. }) if *limit == "max_mr" => {
            DegradeCause::MaxMr
        }
        Error::Nic(n) if n.errno() == Some(libc::ENOMEM) => DegradeCause::Memlock,
        Error::Nic(n) => DegradeCause::Nic(n.errno().unwrap_or(0)),
        _ => DegradeCause::Nic(0),
    }
}

impl Arena {
    /// The id of the ODP region covering chunk `c` (registering it on first use), or of the
    /// implicit region.
    pub(crate) fn odp_region(&self, c: usize) -> Result<u32, Error> {
        if self.implicit_odp {
            return self.implicit_region();
        }
        if let Some(id) = self
            .lock()
            .chunks
            .get(c)
            .and_then(|ch| ch.odp.checked_sub(1))
        {
            return Ok(id);
        }
        let id = self.register_odp(self.chunk_base(c), self.chunk_size())?;
        let mut st = self.lock();
        let Some(ch) = st.chunks.get_mut(c) else {
            return Ok(id);
        };
        match ch.odp.checked_sub(1) {
            // Another thread registered the chunk meanwhile: keep one region.
            Some(theirs) => {
                drop(st);
                self.release_region(id, false);
                Ok(theirs)
            }
            None => {
                ch.odp = id + 1;
                Ok(id)
            }
        }
    }

    /// The implicit ODP region, registered on first use.
    fn implicit_region(&self) -> Result<u32, Error> {
        let _guard = self.implicit_lock.lock();
        if let Some(id) = self.implicit.load(Ordering::Acquire).checked_sub(1) {
            return Ok(id);
        }
        // SAFETY: the implicit region makes the address space reachable with the arena's
        // rights, which the configuration asked for (`implicit_odp`).
        let mr = unsafe { self.pd.reg_mr_implicit_odp(self.access) }?;
        let id = self.install_region(mr, false)?;
        add(&self.counters.odp_mrs, 1);
        self.implicit.store(id + 1, Ordering::Release);
        Ok(id)
    }

    /// Register `[addr, addr + len)` as an explicit ODP region (not published).
    pub(crate) fn register_odp(&self, addr: usize, len: usize) -> Result<u32, Error> {
        // SAFETY: the range is the arena's own mapping, which outlives every region over it;
        // ODP needs no pages present.
        let mr = unsafe {
            self.pd
                .reg_mr(addr as *mut u8, len, self.access | Access::ON_DEMAND)
        }?;
        add(&self.counters.regs, 1);
        add(&self.counters.odp_mrs, 1);
        self.install_region(mr, false)
    }

    /// Register the committed run `[addr, addr + len)` of chunk `c` (a dedicated run when
    /// `dedicated`) in the arena's mode, falling back as the module contract says. `Ok(None)`:
    /// served unregistered.
    pub(crate) fn register_run(
        &self,
        c: usize,
        addr: usize,
        len: usize,
        dedicated: bool,
        pinned: impl FnOnce() -> Result<u32, Error>,
    ) -> Result<Option<u32>, Error> {
        let odp = |this: &Arena| {
            if dedicated && !this.implicit_odp {
                this.register_odp(addr, len)
            } else {
                this.odp_region(c)
            }
        };
        if self.device_dead() {
            return self.dead_device_run(len);
        }
        let first = if self.mode == RegMode::Odp || self.chunk_fell_back(c) {
            odp(self)
        } else {
            pinned()
        };
        let e = match first {
            Ok(id) => {
                self.published(addr, len, id);
                return Ok(Some(id));
            }
            Err(e) => e,
        };
        let mut d = Degradation {
            cause: cause_of(&e),
            odp_fallback: false,
        };
        if self.mode == RegMode::Pinned && self.odp_usable {
            if let Ok(id) = odp(self) {
                d.odp_fallback = true;
                self.record(d);
                if !dedicated {
                    self.mark_fallback(c);
                }
                add(&self.counters.odp_fallbacks, 1);
                self.published(addr, len, id);
                return Ok(Some(id));
            }
        }
        self.record(d);
        if self.policy == RegistrationPolicy::Required {
            return Err(e);
        }
        add(&self.counters.unregistered_bytes, len as u64);
        add(&self.counters.unregistered_runs, 1);
        tracing::warn!(
            target: "rdma_pool::arena",
            error = %e,
            bytes = len as u64,
            "registration refused: serving the memory unregistered (keys_of is None for it)"
        );
        Ok(None)
    }

    /// Memory to register after the device died: the degradation recorded, and an error
    /// where registration is required (the caller counts what it serves unregistered).
    pub(super) fn dead_device(&self) -> Result<(), Error> {
        self.record(Degradation {
            cause: DegradeCause::DeviceDead,
            odp_fallback: false,
        });
        if self.policy == RegistrationPolicy::Required {
            return Err(Error::Nic(crate::nic::Error::from_errno(
                crate::nic::Verb::RegMr,
                libc::EIO,
            )));
        }
        Ok(())
    }

    /// A run committed after the device died: served unregistered (or refused when
    /// registration is required), with no NIC call.
    pub(super) fn dead_device_run(&self, len: usize) -> Result<Option<u32>, Error> {
        self.dead_device()?;
        add(&self.counters.unregistered_bytes, len as u64);
        add(&self.counters.unregistered_runs, 1);
        Ok(None)
    }

    /// Record a refused re-registration that left memory unregistered.
    pub(crate) fn note_refusal(&self, e: &Error) {
        self.record(Degradation {
            cause: cause_of(e),
            odp_fallback: false,
        });
    }

    pub(super) fn record(&self, d: Degradation) {
        self.last_degradation.store(d.pack(), Ordering::Relaxed);
        add(&self.counters.degradations, 1);
    }

    /// Point the slabs of `[addr, addr + len)` at region `id` (an ODP region or the implicit
    /// one; pinned regions publish themselves) and count them registered.
    fn published(&self, addr: usize, len: usize, id: u32) {
        let first = self.slab_index(addr);
        if self.table.covers(first, len >> SLAB_SHIFT, id) {
            return;
        }
        self.table.publish(first, len >> SLAB_SHIFT, Some(id));
        add(&self.counters.registered_bytes, len as u64);
    }

    fn chunk_fell_back(&self, c: usize) -> bool {
        self.lock().chunks.get(c).is_some_and(|ch| ch.fallback)
    }

    fn mark_fallback(&self, c: usize) {
        if let Some(ch) = self.lock().chunks.get_mut(c) {
            ch.fallback = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::Nic;

    #[test]
    fn auto_needs_every_rc_operation_and_no_unsafe_quirk() {
        let soft = Nic::soft().caps().clone();
        let pick = |caps: &Caps, remote| choose_mode(Registration::Auto, caps, remote).unwrap();
        assert_eq!(
            pick(&soft, Access::empty()),
            (RegMode::Odp, ModeReason::OdpSupported, true)
        );
        let mut no_read = soft.clone();
        no_read.odp.rc.remove(OdpOps::READ);
        assert_eq!(
            pick(&no_read, Access::empty()),
            (RegMode::Pinned, ModeReason::OdpOpsMissing, false)
        );
        // Atomics are needed only when peers may use them.
        let mut no_atomic = soft.clone();
        no_atomic.odp.rc.remove(OdpOps::ATOMIC);
        assert_eq!(pick(&no_atomic, Access::REMOTE_READ).0, RegMode::Odp);
        assert_eq!(
            pick(&no_atomic, Access::REMOTE_ATOMIC | Access::REMOTE_WRITE).1,
            ModeReason::OdpOpsMissing
        );
        let mut rxe = soft.clone();
        rxe.driver = "rxe".into();
        assert_eq!(
            pick(&rxe, Access::empty()),
            (RegMode::Pinned, ModeReason::OdpRdmaUnsafe, false)
        );
        // Forced ODP on rxe is honoured (the caller keeps RDMA page-aligned); without ODP it
        // is a configuration error.
        assert_eq!(
            choose_mode(Registration::Odp, &rxe, Access::empty())
                .unwrap()
                .0,
            RegMode::Odp
        );
        let mut none = soft.clone();
        none.odp.explicit = false;
        assert!(matches!(
            choose_mode(Registration::Odp, &none, Access::empty()),
            Err(Error::Config(_))
        ));
        assert_eq!(
            choose_mode(Registration::Pinned, &none, Access::empty()).unwrap(),
            (RegMode::Pinned, ModeReason::Requested, false)
        );
    }

    #[test]
    fn degradations_pack_and_unpack() {
        for cause in [
            DegradeCause::Memlock,
            DegradeCause::MaxMr,
            DegradeCause::Nic(libc::EINVAL),
            DegradeCause::Nic(0),
        ] {
            for odp_fallback in [false, true] {
                let d = Degradation {
                    cause,
                    odp_fallback,
                };
                assert_eq!(Degradation::unpack(d.pack()), Some(d));
            }
        }
        assert_eq!(Degradation::unpack(0), None);
    }
}
