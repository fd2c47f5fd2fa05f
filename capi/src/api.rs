//! The C API (`rdma_pool.h`): the keys of any heap pointer, the pool's verbs objects for the
//! application's own QPs, statistics, and grants on the application's `struct ibv_qp *`.
//!
//! Contract: every function returns 0 or an `errno` value (or NULL with `errno` set), never
//! panics across the ABI (a panic becomes `EIO`), and leaves a message for the last failure
//! on this thread in [`rdma_pool_last_error`]. Grants follow the Rust crate's rules: the QP
//! is in the pool's PD ([`rdma_pool_pd`]), the application hands the pool every completion
//! it polls from that QP's send CQ ([`rdma_pool_on_completion`]), a freed granted buffer
//! stays quarantined until its key is dead, and a grant handle may be freed at any time (an
//! unrevoked grant is then revoked without waiting).

#![allow(non_camel_case_types)] // the C names of the header

use crate::POOL;
use libc::{c_char, c_int, c_void, size_t};
use pool::grant::{Grant, GrantError, GrantKind};
use pool::nic::{Access, Completion, Cq, Qp};
use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::null_mut;

/// `struct ibv_context` (libibverbs).
pub use rdma_sys::ibv_context;
/// `struct ibv_pd` (libibverbs).
pub use rdma_sys::ibv_pd;
/// `struct ibv_qp` (libibverbs).
pub use rdma_sys::ibv_qp;
/// `struct ibv_wc` (libibverbs).
pub use rdma_sys::ibv_wc;

const MSG: usize = 256;

thread_local! {
    /// The last failure's message on this thread, NUL-terminated (no destructor).
    static LAST: UnsafeCell<[u8; MSG]> = const { UnsafeCell::new([0; MSG]) };
}

/// Record `msg` as this thread's last error and return `errno`.
fn fail(errno: c_int, msg: &dyn std::fmt::Display) -> c_int {
    let text = msg.to_string();
    let _ = LAST.try_with(|b| {
        // SAFETY: this thread's buffer; no reference to it is live (the pointer handed out by
        // `rdma_pool_last_error` is documented to be overwritten by the next failure).
        let b = unsafe { &mut *b.get() };
        let n = text.len().min(MSG - 1);
        b[..n].copy_from_slice(&text.as_bytes()[..n]);
        b[n] = 0;
    });
    errno
}

/// Run `f`, turning a panic into `EIO`.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| fail(libc::EIO, &"rdma_pool: panic"))
}

fn set_errno(e: c_int) {
    // SAFETY: this thread's `errno`.
    unsafe { *libc::__errno_location() = e };
}

/// The message of the last failure of an `rdma_pool_*` call on this thread (empty when none
/// failed); valid until the next failure on this thread.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_last_error() -> *const c_char {
    LAST.try_with(|b| b.get() as *const c_char)
        .unwrap_or(c"rdma_pool: thread exiting".as_ptr())
}

/// Initialise the pool now (the first `malloc` does it otherwise): 0, or `ENODEV` when the
/// NIC the environment asked for could not be opened — the heap then lives on the soft NIC,
/// registered with no device (see the message) — or the pool could not be built at all (the
/// heap is then whole-page mappings).
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_init() -> c_int {
    guard(|| match POOL.init() {
        Ok(_) => match crate::OPEN_ERROR.get() {
            Some(why) => fail(libc::ENODEV, why),
            None => 0,
        },
        Err(e) => fail(libc::ENODEV, e),
    })
}

/// The local and remote keys for `len` bytes at `ptr`: 0 when the whole range lies in one
/// registration of the pool (any heap block, or part of one); `EINVAL` for a null pointer,
/// a zero length or null outputs; `ENOENT` when `ptr` is not pool memory (the stack, a
/// static, a degraded block); `ERANGE` when the range runs past its registration. The rkey
/// gives a peer no access by itself: peers get access through grants.
///
/// # Safety
/// `lkey` and `rkey` are valid for writes (or null, refused).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_keys_of(
    ptr: *const c_void,
    len: size_t,
    lkey: *mut u32,
    rkey: *mut u32,
) -> c_int {
    if ptr.is_null() || len == 0 || lkey.is_null() || rkey.is_null() {
        return fail(
            libc::EINVAL,
            &"rdma_pool_keys_of: null pointer or zero length",
        );
    }
    let Some(keys) = POOL.keys_of(ptr.cast()) else {
        return fail(libc::ENOENT, &"rdma_pool_keys_of: not memory of the pool");
    };
    if !keys.contains(ptr as usize, len) {
        return fail(
            libc::ERANGE,
            &"rdma_pool_keys_of: the range runs past its registration",
        );
    }
    // SAFETY: the caller's contract.
    unsafe {
        *lkey = keys.lkey.0;
        *rkey = keys.rkey.0;
    }
    0
}

/// The pool's `struct ibv_context *`: create the application's CQs on it. NULL with `errno`
/// `ENODEV` on the soft NIC (no verbs objects) or when the pool could not initialise.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_context() -> *mut ibv_context {
    match POOL.nic().ok().and_then(|n| n.raw_context()) {
        Some(ctx) => ctx.cast(),
        None => {
            fail(
                libc::ENODEV,
                &"rdma_pool_context: the pool is on no verbs device",
            );
            set_errno(libc::ENODEV);
            null_mut()
        }
    }
}

/// The pool's `struct ibv_pd *`: create the application's QPs in it, so that the keys of
/// [`rdma_pool_keys_of`] are valid for them and grants can be bound on them. NULL with
/// `errno` `ENODEV` as for [`rdma_pool_context`].
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_pd() -> *mut ibv_pd {
    let verbs = POOL.nic().ok().and_then(|n| n.raw_context()).is_some();
    match POOL.pd() {
        Ok(pd) if verbs => pd.as_raw() as usize as *mut ibv_pd,
        _ => {
            fail(
                libc::ENODEV,
                &"rdma_pool_pd: the pool is on no verbs device",
            );
            set_errno(libc::ENODEV);
            null_mut()
        }
    }
}

/// Statistics of the process's pool ([`rdma_pool_stats()`]).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct rdma_pool_stats {
    /// 0 uninitialised, 1 initialising, 2 ready, 3 failed (the heap is then unregistered).
    pub state: u32,
    /// 1 on a verbs device, 0 on the soft NIC.
    pub verbs: u32,
    /// Bytes handed out (blocks freed into a thread's cache, or by another thread and not yet
    /// collected, still count).
    pub allocated_bytes: u64,
    /// Bytes of address space reserved.
    pub reserved_bytes: u64,
    /// Bytes backed by memory.
    pub committed_bytes: u64,
    /// Bytes registered with the NIC.
    pub registered_bytes: u64,
    /// Memory regions registered.
    pub memory_regions: u64,
    /// Allocations the pool could not serve, served unregistered (whole-page mappings).
    pub degraded_allocations: u64,
    /// Allocations refused (NULL).
    pub failed_allocations: u64,
    /// Allocations served by the bootstrap region (made while the pool called the NIC).
    pub bootstrap_blocks: u64,
    /// `free` of pointers the library did not hand out (ignored).
    pub foreign_frees: u64,
    /// Grants issued.
    pub grants_issued: u64,
    /// Grants open (not yet revoked).
    pub grants_open: u64,
}

/// Fill `out` with the pool's statistics: 0, or `EINVAL` for a null `out`.
///
/// # Safety
/// `out` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_stats(out: *mut rdma_pool_stats) -> c_int {
    if out.is_null() {
        return fail(libc::EINVAL, &"rdma_pool_stats: null out");
    }
    guard(|| {
        let g = POOL.stats();
        let mut s = rdma_pool_stats {
            state: match g.state {
                pool::global::GlobalState::Uninitialised => 0,
                pool::global::GlobalState::Initialising => 1,
                pool::global::GlobalState::Ready => 2,
                pool::global::GlobalState::Failed => 3,
            },
            degraded_allocations: g.degraded_allocations,
            failed_allocations: g.failed_allocations,
            bootstrap_blocks: g.bootstrap_blocks,
            foreign_frees: g.foreign_frees,
            ..Default::default()
        };
        if let Some(p) = g.pool {
            s.allocated_bytes = crate::malloc::live_bytes(&p);
            s.reserved_bytes = p.arena.reserved_bytes;
            s.committed_bytes = p.arena.committed_bytes;
            s.registered_bytes = p.arena.registered_bytes;
            s.memory_regions = p.arena.mrs;
            s.verbs = u32::from(POOL.nic().ok().and_then(|n| n.raw_context()).is_some());
        }
        // Only a ready pool: the stats call never initialises it (nor waits for it).
        let ready = POOL.state() == pool::global::GlobalState::Ready;
        if let Some(gs) = ready
            .then(|| POOL.pool().ok())
            .flatten()
            .map(|p| p.stats().grants)
        {
            s.grants_issued = gs.issued;
            s.grants_open = gs.open;
        }
        // SAFETY: the caller's contract.
        unsafe { *out = s };
        0
    })
}

/// What a peer needs to use a grant: address, length and rkey.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct rdma_pool_wire {
    /// First byte granted.
    pub addr: u64,
    /// Bytes granted.
    pub len: u64,
    /// The key, valid through the granted QP only.
    pub rkey: u32,
}

/// A grant handle ([`rdma_pool_grant()`]); opaque to C.
pub struct rdma_pool_grant {
    grant: Grant<'static>,
    _qp: Qp,
}

/// `IBV_ACCESS_REMOTE_WRITE`, `_READ` and `_ATOMIC`: the rights a grant may carry.
const REMOTE: u32 = (1 << 1) | (1 << 2) | (1 << 3);

fn grant_errno(e: &GrantError) -> c_int {
    match e {
        GrantError::Unavailable => libc::ENODEV,
        GrantError::Empty | GrantError::Rights(_) => libc::EINVAL,
        GrantError::OutsidePool | GrantError::NotAllocated { .. } | GrantError::Unregistered => {
            libc::ENOENT
        }
        GrantError::AcrossBlocks { .. } => libc::ERANGE,
        GrantError::ForeignQp => libc::EXDEV,
        GrantError::QpNotReady(_) => libc::ENOTCONN,
        GrantError::Unsupported(_) => libc::EOPNOTSUPP,
        GrantError::Limit { .. } => libc::ENOSPC,
        GrantError::BindFailed(_) => libc::EIO,
        GrantError::Revoked => libc::EALREADY,
        GrantError::Timeout(_) => libc::ETIMEDOUT,
        GrantError::Nic(n) => n.errno().filter(|&e| e > 0).unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

/// Grant the peer at the other end of `qp` the rights `access` (`IBV_ACCESS_REMOTE_READ`,
/// `_WRITE`, `_ATOMIC`) to exactly `len` bytes at `buf`, part of one live heap block: on 0,
/// `*grant` is the handle and `*wire` what the peer needs. The key works once the bind's
/// completion has reached the pool ([`rdma_pool_grant_state`]); through `qp` only.
///
/// Errors: `EINVAL` (null arguments, no or other rights), `ENOENT` (not a live block of the
/// pool), `ERANGE` (past the block's end), `EXDEV` (`qp` not in the pool's PD or of another
/// device), `ENOTCONN` (`qp` not ready to send), `EOPNOTSUPP` (the device has no memory
/// windows), `ENOSPC` (grant limits), `ENODEV` (the soft NIC or no pool), a verb's errno.
///
/// # Safety
/// `qp` is a live RC `struct ibv_qp *` in [`rdma_pool_pd`], and stays alive until every
/// grant on it is revoked and its completions were handed over; with a write or atomic
/// right, the program does not access the bytes while the peer may (atomically or once its
/// protocol says the peer is done, or after the revocation); `grant` and `wire` are valid
/// for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_grant(
    qp: *mut ibv_qp,
    buf: *const c_void,
    len: size_t,
    access: u32,
    grant: *mut *mut rdma_pool_grant,
    wire: *mut rdma_pool_wire,
) -> c_int {
    if qp.is_null() || buf.is_null() || grant.is_null() || wire.is_null() {
        return fail(libc::EINVAL, &"rdma_pool_grant: null argument");
    }
    if access == 0 || access & !REMOTE != 0 {
        return fail(
            libc::EINVAL,
            &"rdma_pool_grant: access takes IBV_ACCESS_REMOTE_{READ,WRITE,ATOMIC} only",
        );
    }
    guard(|| {
        let (nic, pd, pool) = match (POOL.nic(), POOL.pd(), POOL.pool()) {
            (Ok(n), Ok(d), Ok(p)) => (n, d, p),
            (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => return fail(libc::ENODEV, e),
        };
        // SAFETY: a live `struct ibv_qp` (the caller's contract).
        let (send, recv) = unsafe { ((*qp).send_cq, (*qp).recv_cq) };
        // SAFETY: the QP's own CQs live as long as it (the caller's contract).
        let cqs = unsafe {
            Cq::from_raw(nic, send.cast()).and_then(|s| {
                let r = if recv == send {
                    s.clone()
                } else {
                    Cq::from_raw(nic, recv.cast())?
                };
                Ok((s, r))
            })
        };
        let (send_cq, recv_cq) = match cqs {
            Ok(c) => c,
            Err(e) => return fail(libc::EXDEV, &e),
        };
        // SAFETY: as above.
        let q = match unsafe { Qp::from_raw(pd, qp.cast(), &send_cq, &recv_cq) } {
            Ok(q) => q,
            Err(e) => return fail(libc::EXDEV, &e),
        };
        // SAFETY: the caller keeps the bytes as the contract says; the slice is only read
        // by the pool to check the range (it lives in the pool's memory, checked by `issue`).
        let bytes: &'static [u8] = unsafe { std::slice::from_raw_parts(buf.cast(), len) };
        let rights = Access::from_bits_truncate(access);
        // SAFETY: the caller takes on `grant_with`'s contract (this function's).
        match unsafe { pool.grant_with(bytes, &q, rights, GrantKind::Auto) } {
            Ok(g) => {
                let w = g.wire();
                // SAFETY: the caller's contract.
                unsafe {
                    *wire = rdma_pool_wire {
                        addr: w.addr,
                        len: w.len,
                        rkey: w.rkey.0,
                    };
                    *grant = Box::into_raw(Box::new(rdma_pool_grant { grant: g, _qp: q }));
                }
                0
            }
            Err(e) => fail(grant_errno(&e), &e),
        }
    })
}

/// Hand the pool a completion the application polled from a CQ its grants post on: 1 when
/// it was the pool's (a bind or invalidation: consumed, do not look at it), 0 when it is the
/// application's.
///
/// # Safety
/// `wc` is null (0) or a completion `ibv_poll_cq` returned, handed over once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_on_completion(wc: *const ibv_wc) -> c_int {
    if wc.is_null() {
        return 0;
    }
    guard(|| {
        let Ok(pool) = POOL.pool() else {
            return 0;
        };
        // SAFETY: the caller's contract.
        let c: Completion = unsafe { Completion::from_raw(wc.cast()) };
        // SAFETY: as above.
        c_int::from(unsafe { pool.on_completion(&c) })
    })
}

/// Where a grant stands: 0 while its bind's completion has not reached the pool, 1 once the
/// key works, 2 once it was revoked and the key is dead, -`errno` when the bind failed (the
/// grant is then revoked) or for a null handle (-`EINVAL`).
///
/// # Safety
/// `grant` is null or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_grant_state(grant: *const rdma_pool_grant) -> c_int {
    if grant.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: the caller's contract.
    let g = unsafe { &(*grant).grant };
    guard(|| {
        if g.is_revoked() {
            return 2;
        }
        match g.bind_state() {
            None => 0,
            Some(Ok(())) => 1,
            Some(Err(GrantError::Revoked)) => 0,
            Some(Err(e)) => -fail(grant_errno(&e), &e),
        }
    })
}

/// Start revoking a grant (an invalidation posted on its QP; the key is dead once its
/// completion reached the pool, see [`rdma_pool_grant_state`]): 0, `EALREADY` when already
/// revoking, `EINVAL` for null, a verb's errno.
///
/// # Safety
/// `grant` is null or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_revoke(grant: *mut rdma_pool_grant) -> c_int {
    if grant.is_null() {
        return fail(libc::EINVAL, &"rdma_pool_revoke: null grant");
    }
    // SAFETY: the caller's contract.
    let g = unsafe { &mut (*grant).grant };
    guard(|| match g.start_revoke() {
        Ok(()) => 0,
        Err(e) => fail(grant_errno(&e), &e),
    })
}

/// Free a grant handle; an unrevoked grant is revoked first, without waiting (its buffer,
/// once freed, stays quarantined until the key is dead). Null is ignored.
///
/// # Safety
/// `grant` is null or a live handle, freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_pool_grant_free(grant: *mut rdma_pool_grant) {
    if grant.is_null() {
        return;
    }
    // SAFETY: the caller's contract: a handle made by `Box::into_raw`, freed once.
    let g = unsafe { Box::from_raw(grant) };
    let _ = catch_unwind(AssertUnwindSafe(|| drop(g)));
}
