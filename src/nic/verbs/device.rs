//! Finding and opening a verbs device: the device list, device names, the context (owned, or
//! attached to one the caller opened), and the capability query that fills [`Caps`].
//!
//! Contract:
//! - a [`Context`] closes its `ibv_context` on drop only when it opened it; an attached context
//!   belongs to the caller, who keeps it open while the NIC and its handles live;
//! - mlx5 devices are opened with `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)` so UMEMs can be
//!   registered, falling back to `ibv_open_device` (then [`DevxState::NoDevxContext`]);
//! - the driver name comes from `mlx5dv_is_supported`, the vendor id (rxe, siw), a known provider
//!   prefix of the device name, then sysfs (see [`guess_driver`]);
//! - only port 1 is queried (`PORT`), as every QP uses it.

use super::conv::{PORT, nonneg};
use super::inlines::{query_device_ex, query_port};
use super::mlx5dv::{self, DevxState};
use crate::nic::error::{Error, Result, Verb, rc_errno};
use crate::nic::types::{Caps, OdpCaps, OdpOps};
use rdma_sys as ffi;
use std::ffi::{CStr, c_char, c_int};
use std::ptr::{self, NonNull};

/// `vendor_id` of kernel Soft-RoCE devices (`RXE_VENDOR_ID`, since Linux 5.5; 0 before).
pub(super) const RXE_VENDOR_ID: u32 = 0xff_ffff;
/// `vendor_id` of kernel soft-iWARP devices (`SIW_VENDOR_ID`, ASCII "bmt").
pub(super) const SIW_VENDOR_ID: u32 = 0x62_6d74;

/// rdma-core provider names, to recognise a device name's prefix (`mlx5_0`, `rxe0`, …).
const KNOWN_PROVIDERS: &[&str] = &[
    "bnxt_re",
    "cxgb4",
    "efa",
    "erdma",
    "hfi1",
    "hns",
    "ionic",
    "irdma",
    "mana",
    "mlx4",
    "mlx5",
    "mthca",
    "ocrdma",
    "qedr",
    "rxe",
    "siw",
    "vmw_pvrdma",
];

/// Providers known to lack `ibv_rereg_mr` (no `rereg_mr` op in rdma-core; the kernel drivers
/// have no `rereg_user_mr` either).
const PROVIDERS_WITHOUT_REREG: &[&str] = &["rxe", "siw"];

/// `enum ibv_mtu` in bytes (0 for an unknown value).
pub(super) fn mtu_bytes(mtu: ffi::ibv_mtu::Type) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

/// The provider's name for a device: `mlx5` when libmlx5 claims it, `rxe`/`siw` by vendor id,
/// then a known provider prefix of the device name, then the kernel driver of the parent
/// device (without `_core`), then the name's prefix.
pub(super) fn guess_driver(
    name: &str,
    vendor_id: u32,
    is_mlx5: bool,
    sysfs_driver: Option<&str>,
) -> String {
    if is_mlx5 {
        return "mlx5".into();
    }
    match vendor_id {
        RXE_VENDOR_ID => return "rxe".into(),
        SIW_VENDOR_ID => return "siw".into(),
        _ => {}
    }
    let prefix = name
        .trim_end_matches(|c: char| c.is_ascii_digit())
        .trim_end_matches('_');
    if KNOWN_PROVIDERS.contains(&prefix) {
        return prefix.into();
    }
    if let Some(d) = sysfs_driver.filter(|d| !d.is_empty()) {
        return d.strip_suffix("_core").unwrap_or(d).into();
    }
    if prefix.is_empty() {
        "unknown".into()
    } else {
        prefix.into()
    }
}

/// The kernel driver bound to the device's parent (`/sys/class/infiniband/<name>/device/driver`).
fn sysfs_driver(name: &str) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/class/infiniband/{name}/device/driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// The NUMA node of the device (`/sys/class/infiniband/<name>/device/numa_node`): `None` for
/// `-1` (no node, or a single-node machine), a missing file or an unreadable value.
fn sysfs_numa_node(name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/sys/class/infiniband/{name}/device/numa_node"));
    parse_numa_node(&text.ok()?)
}

/// A sysfs `numa_node` value: a node number, or `-1` for none.
pub(super) fn parse_numa_node(text: &str) -> Option<u32> {
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// The result of `ibv_get_device_list`, freed on drop.
struct DeviceList {
    list: NonNull<*mut ffi::ibv_device>,
    len: usize,
}

impl DeviceList {
    /// `None` when libibverbs cannot enumerate (no RDMA subsystem, no uverbs).
    fn get() -> Option<DeviceList> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        Some(DeviceList {
            list: NonNull::new(list)?,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn devices(&self) -> impl Iterator<Item = *mut ffi::ibv_device> + '_ {
        (0..self.len)
            // SAFETY: the list has `len` entries followed by a NULL terminator.
            .map(|i| unsafe { *self.list.as_ptr().add(i) })
            .take_while(|d| !d.is_null())
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once; contexts opened
        // from its devices stay valid.
        unsafe { ffi::ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// `ibv_get_device_name(device)`.
///
/// # Safety
/// `dev` is a device of a live list or of an open context.
unsafe fn device_name(dev: *mut ffi::ibv_device) -> String {
    // SAFETY: `dev` is valid (caller).
    let name = unsafe { ffi::ibv_get_device_name(dev) };
    if name.is_null() {
        // SAFETY: `dev` is valid; `name` is a fixed array in it.
        return c_chars_to_string(unsafe { &(*dev).name });
    }
    // SAFETY: a non-null name is NUL-terminated and lives as long as the device.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// The names of the RDMA devices present (empty when there are none or no RDMA subsystem).
/// Public as [`crate::nic::device_names`].
pub(crate) fn device_names() -> Vec<String> {
    let Some(list) = DeviceList::get() else {
        return Vec::new();
    };
    // SAFETY: the devices belong to the live `list`.
    list.devices().map(|d| unsafe { device_name(d) }).collect()
}

/// An open device context: closed on drop when this process opened it here, left open when it
/// was attached (the caller's).
pub(super) struct Context {
    ptr: NonNull<ffi::ibv_context>,
    owned: bool,
}

impl Context {
    pub(super) fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.ptr.as_ptr()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: the context is open and, since the public layer keeps the NIC alive while any
        // of its objects lives, has no objects left.
        let rc = unsafe { ffi::ibv_close_device(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::error!(errno = rc_errno(rc), "ibv_close_device failed");
        }
    }
}

/// An opened device: its context, capabilities and DEVX state.
pub(super) type Opened = (Context, Caps, DevxState);

/// Open the device called `name`, or the first device.
///
/// mlx5 devices are opened with `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)` so that UMEMs can
/// be registered; when that fails the device is opened plainly and `caps.devx` is false.
///
/// # Errors
/// [`Error::DeviceNotFound`] when none is called `name` (there may be no device at all),
/// [`Error::NoDevice`] when there is no device to be the first, or the failing
/// `ibv_open_device` / `ibv_query_device_ex` / port query.
pub(super) fn open(name: Option<&str>) -> Result<Opened> {
    let missing = || match name {
        Some(n) => Error::DeviceNotFound(n.to_owned()),
        None => Error::NoDevice,
    };
    let Some(list) = DeviceList::get() else {
        return Err(missing());
    };
    if list.devices().next().is_none() {
        return Err(missing());
    }
    let dev = match name {
        None => list.devices().next(),
        // SAFETY: the devices belong to the live `list`.
        Some(want) => list.devices().find(|&d| unsafe { device_name(d) } == want),
    };
    let Some(dev) = dev else {
        return Err(Error::DeviceNotFound(name.unwrap_or_default().to_owned()));
    };
    // SAFETY: `dev` belongs to the live `list`.
    let dev_name = unsafe { device_name(dev) };
    // SAFETY: as above.
    let is_mlx5 = unsafe { mlx5dv::is_supported(dev) };
    let mut devx = DevxState::NotMlx5;
    let mut raw = ptr::null_mut();
    if is_mlx5 {
        // SAFETY: as above; the context is closed by `Context`.
        match unsafe { mlx5dv::open_devx(dev) } {
            Ok(ctx) => {
                raw = ctx;
                devx = DevxState::Enabled;
            }
            Err(e) => {
                tracing::info!(device = %dev_name, error = %e,
                    "mlx5 device without a DEVX context; UMEM registration is unavailable");
                devx = DevxState::NoDevxContext;
            }
        }
    }
    if raw.is_null() {
        // SAFETY: as above.
        raw = unsafe { ffi::ibv_open_device(dev) };
    }
    let Some(ptr) = NonNull::new(raw) else {
        return Err(Error::last(Verb::OpenDevice));
    };
    let ctx = Context { ptr, owned: true };
    drop(list);
    // SAFETY: the context was just opened.
    let caps = unsafe { query_caps(ctx.as_ptr(), dev_name, is_mlx5, devx) }?;
    Ok((ctx, caps, devx))
}

/// Attach to an open context without owning it. On an mlx5 device the context is taken to have
/// DEVX (as a DEVX user's context has); if it has not, UMEM registration fails with the verb's
/// errno.
///
/// # Errors
/// `InvalidArgument` for a null context; the failing device or port query.
///
/// # Safety
/// `ctx` is null or an open context that outlives the returned [`Context`].
pub(super) unsafe fn attach(ctx: *mut ffi::ibv_context) -> Result<Opened> {
    let Some(ptr) = NonNull::new(ctx) else {
        return Err(Error::invalid_arg("null ibv_context"));
    };
    let ctx = Context { ptr, owned: false };
    // SAFETY: the context is open (caller); its device lives as long as it.
    let dev = unsafe { (*ctx.as_ptr()).device };
    if dev.is_null() {
        return Err(Error::invalid_arg("ibv_context without a device"));
    }
    // SAFETY: `dev` is the device of an open context.
    let (name, is_mlx5) = unsafe { (device_name(dev), mlx5dv::is_supported(dev)) };
    let devx = if is_mlx5 {
        DevxState::Enabled
    } else {
        DevxState::NotMlx5
    };
    // SAFETY: the context is open (caller).
    let caps = unsafe { query_caps(ctx.as_ptr(), name, is_mlx5, devx) }?;
    Ok((ctx, caps, devx))
}

/// Query the device and port 1 of `ctx` into [`Caps`].
///
/// # Safety
/// `ctx` is an open context.
pub(super) unsafe fn query_caps(
    ctx: *mut ffi::ibv_context,
    name: String,
    is_mlx5: bool,
    devx: DevxState,
) -> Result<Caps> {
    // SAFETY: `ctx` is open (caller).
    let attr =
        unsafe { query_device_ex(ctx) }.map_err(|e| Error::from_errno(Verb::QueryDevice, e))?;
    // SAFETY: as above.
    let port =
        unsafe { query_port(ctx, PORT) }.map_err(|e| Error::from_errno(Verb::QueryPort, e))?;
    let orig = &attr.orig_attr;
    let driver = guess_driver(
        &name,
        orig.vendor_id,
        is_mlx5,
        sysfs_driver(&name).as_deref(),
    );
    let cap_flags = u64::from(orig.device_cap_flags) | attr.device_cap_flags_ex;
    let flag = |f: ffi::ibv_device_cap_flags| cap_flags & u64::from(f.0) != 0;
    let max_mw = nonneg(orig.max_mw);
    let general = attr.odp_caps.general_caps;
    let odp = OdpCaps {
        explicit: general & u64::from(ffi::ibv_odp_general_caps::IBV_ODP_SUPPORT.0) != 0,
        implicit: general & u64::from(ffi::ibv_odp_general_caps::IBV_ODP_SUPPORT_IMPLICIT.0) != 0,
        rc: OdpOps::from_bits_truncate(attr.odp_caps.per_transport_caps.rc_odp_caps),
    };
    let numa_node = sysfs_numa_node(&name);
    Ok(Caps {
        numa_node,
        rereg_mr: !PROVIDERS_WITHOUT_REREG.contains(&driver.as_str()),
        mkey_cache: driver == "mlx5",
        name,
        driver,
        max_mr_size: orig.max_mr_size,
        max_mr: nonneg(orig.max_mr),
        max_mw,
        max_sge: nonneg(orig.max_sge),
        max_qp_wr: nonneg(orig.max_qp_wr),
        max_cqe: nonneg(orig.max_cqe),
        odp,
        mw_type1: max_mw > 0 && flag(ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW),
        mw_type2: max_mw > 0
            && (flag(ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2A)
                || flag(ffi::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B)),
        // Advice applies to ODP regions only, and every provider that reports ODP implements
        // the verb (mlx5; rxe since rdma-core 61, together with kernel rxe ODP). Without ODP
        // there is nothing to advise, and the verb answers EOPNOTSUPP.
        advise_mr: odp.explicit,
        atomics: orig.atomic_cap != ffi::ibv_atomic_cap::IBV_ATOMIC_NONE,
        devx: devx == DevxState::Enabled,
        path_mtu: mtu_bytes(port.active_mtu),
    })
}

/// A `c_char` buffer as a `String` (up to the first NUL).
pub(super) fn c_chars_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
