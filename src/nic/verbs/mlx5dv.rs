//! A tiny run-time binding to `libmlx5` for DEVX UMEM registration
//! (`mlx5dv_devx_umem_reg_ex(3)`), so that the crate builds and runs where the mlx5 provider is
//! absent.
//!
//! Contract:
//! - `libmlx5.so.1` is opened once, with `dlopen(RTLD_NOW | RTLD_LOCAL)`, on first use, and never
//!   closed; the resolved entry points are cached in a [`OnceLock`]. When the library or one of
//!   its required symbols is missing, every UMEM call reports [`Error::Unsupported`] and
//!   [`is_supported`] answers `false`.
//! - UMEM registration needs an mlx5 device *and* a context opened with
//!   `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)`; the verbs backend opens mlx5 devices that
//!   way (falling back to `ibv_open_device` without DEVX) and tells this module which case it is
//!   in through `DevxState`.
//! - A UMEM handle is the `struct mlx5dv_devx_umem *` cast to `u64`; it is passed to
//!   `umem_dereg` exactly once.
//! - This binding depends only on `crate::nic::{error, types}` and rdma-sys, never on its parent
//!   `verbs` module, which calls into it.
//!
//! The C declarations mirrored here (rdma-core `mlx5dv.h`, stable since rdma-core 31):
//! ```c
//! struct mlx5dv_context_attr { uint32_t flags; uint64_t comp_mask; };
//! struct mlx5dv_devx_umem { uint32_t umem_id; };
//! struct mlx5dv_devx_umem_in {
//!     void *addr; size_t size; uint32_t access; uint64_t pgsz_bitmap; uint64_t comp_mask;
//!     int dmabuf_fd; /* rdma-core >= 38, read only with MLX5DV_UMEM_MASK_DMABUF */
//! };
//! bool mlx5dv_is_supported(struct ibv_device *device);
//! struct ibv_context *mlx5dv_open_device(struct ibv_device *device,
//!                                        struct mlx5dv_context_attr *attr);
//! struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg(struct ibv_context *ctx, void *addr,
//!                                               size_t size, uint32_t access);
//! struct mlx5dv_devx_umem *mlx5dv_devx_umem_reg_ex(struct ibv_context *ctx,
//!                                                  struct mlx5dv_devx_umem_in *umem_in);
//! int mlx5dv_devx_umem_dereg(struct mlx5dv_devx_umem *umem);
//! ```

use crate::nic::error::{Error, Result, Verb, last_os_error};
use crate::nic::types::Access;
use rdma_sys::{ibv_context, ibv_device};
use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

/// The shared object that carries the mlx5 provider and its direct-verbs API.
const LIB_NAME: &CStr = c"libmlx5.so.1";

/// `MLX5DV_CONTEXT_FLAGS_DEVX`.
const MLX5DV_CONTEXT_FLAGS_DEVX: u32 = 1;

/// The page sizes the legacy `mlx5dv_devx_umem_reg` lets the kernel choose from: every power of
/// two from 4 KiB up (rdma-core passes `~(MLX5_ADAPTER_PAGE_SIZE - 1)`).
const LEGACY_PGSZ_BITMAP: u64 = !0xfff;

/// `struct mlx5dv_context_attr`.
#[repr(C)]
struct Mlx5dvContextAttr {
    flags: u32,
    comp_mask: u64,
}

/// `struct mlx5dv_devx_umem`.
#[repr(C)]
struct Mlx5dvDevxUmem {
    umem_id: u32,
}

/// `struct mlx5dv_devx_umem_in` (with the rdma-core 38+ tail; older libraries read only the
/// prefix, and `dmabuf_fd` is ignored unless `comp_mask` has `MLX5DV_UMEM_MASK_DMABUF`).
#[repr(C)]
struct Mlx5dvDevxUmemIn {
    addr: *mut c_void,
    size: usize,
    access: u32,
    pgsz_bitmap: u64,
    comp_mask: u64,
    dmabuf_fd: c_int,
}

type IsSupportedFn = unsafe extern "C" fn(*mut ibv_device) -> bool;
type OpenDeviceFn =
    unsafe extern "C" fn(*mut ibv_device, *mut Mlx5dvContextAttr) -> *mut ibv_context;
type UmemRegFn =
    unsafe extern "C" fn(*mut ibv_context, *mut c_void, usize, u32) -> *mut Mlx5dvDevxUmem;
type UmemRegExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut Mlx5dvDevxUmemIn) -> *mut Mlx5dvDevxUmem;
type UmemDeregFn = unsafe extern "C" fn(*mut Mlx5dvDevxUmem) -> c_int;

/// The resolved entry points of `libmlx5.so.1`.
struct Lib {
    is_supported: IsSupportedFn,
    open_device: Option<OpenDeviceFn>,
    umem_reg: Option<UmemRegFn>,
    umem_reg_ex: Option<UmemRegExFn>,
    umem_dereg: Option<UmemDeregFn>,
}

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// The last `dlerror()` message, or `fallback`.
fn dl_error(fallback: &str) -> String {
    // SAFETY: dlerror takes no arguments; it returns NULL or a NUL-terminated string owned by
    // the loader, valid until the next dl* call on this thread, which we copy out at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        fallback.to_owned()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Resolve `name` in `handle` as a function of type `F`; `None` when the symbol is absent.
///
/// # Safety
/// `handle` is a live `dlopen` handle, and `F` is the `unsafe extern "C" fn` type that mirrors
/// the C declaration of `name`.
unsafe fn sym<F: Copy>(handle: *mut c_void, name: &CStr) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    // SAFETY: `handle` is live (caller), `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: dlsym returned the entry address of the function `name`, and `F` is a function
    // pointer type of the same size that matches its C signature (caller).
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

fn load() -> Result<Lib, String> {
    // SAFETY: LIB_NAME is NUL-terminated; loading libmlx5 runs its constructors, which only
    // register the provider with libibverbs (already a dependency of this process).
    let handle = unsafe { libc::dlopen(LIB_NAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(dl_error("dlopen(libmlx5.so.1) failed"));
    }
    // SAFETY: `handle` was just returned by dlopen and is never closed; each type mirrors the
    // declaration of the same name in mlx5dv.h (`bool` is C99 `_Bool`).
    let (is_supported, open_device, umem_reg, umem_reg_ex, umem_dereg) = unsafe {
        (
            sym::<IsSupportedFn>(handle, c"mlx5dv_is_supported"),
            sym::<OpenDeviceFn>(handle, c"mlx5dv_open_device"),
            sym::<UmemRegFn>(handle, c"mlx5dv_devx_umem_reg"),
            sym::<UmemRegExFn>(handle, c"mlx5dv_devx_umem_reg_ex"),
            sym::<UmemDeregFn>(handle, c"mlx5dv_devx_umem_dereg"),
        )
    };
    let Some(is_supported) = is_supported else {
        return Err("libmlx5.so.1 has no mlx5dv_is_supported".to_owned());
    };
    Ok(Lib {
        is_supported,
        open_device,
        umem_reg,
        umem_reg_ex,
        umem_dereg,
    })
}

fn lib() -> Result<&'static Lib, &'static str> {
    LIB.get_or_init(load).as_ref().map_err(String::as_str)
}

/// Why `libmlx5.so.1` is unusable, or `None` when it loaded with the symbols we need.
///
/// Public as [`crate::nic::mlx5_load_error`].
pub(crate) fn load_error() -> Option<&'static str> {
    lib().err()
}

/// True when `device` is driven by the mlx5 provider (`mlx5dv_is_supported`); false when
/// `libmlx5` is unavailable or `device` is null.
///
/// # Safety
/// `device` is null or an `ibv_device` from `ibv_get_device_list` whose list has not been freed,
/// or the device of an open context.
pub(crate) unsafe fn is_supported(device: *mut ibv_device) -> bool {
    if device.is_null() {
        return false;
    }
    match lib() {
        // SAFETY: `device` is a valid ibv_device (caller); mlx5dv_is_supported only compares
        // the device's provider ops with libmlx5's own.
        Ok(lib) => unsafe { (lib.is_supported)(device) },
        Err(_) => false,
    }
}

/// Whether a verbs context can register DEVX UMEMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DevxState {
    /// Not an mlx5 device (rxe, …): no DEVX at all.
    NotMlx5,
    /// An mlx5 device whose context could not be opened with DEVX.
    NoDevxContext,
    /// An mlx5 context opened with `MLX5DV_CONTEXT_FLAGS_DEVX`.
    Enabled,
}

/// Open `device` with `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)`.
///
/// # Errors
/// `Unsupported` when `libmlx5` or its `mlx5dv_open_device` is missing; otherwise the errno of
/// the failed open (e.g. `EOPNOTSUPP` from firmware without DEVX).
///
/// # Safety
/// `device` is a valid `ibv_device` (see [`is_supported`]); the returned context must be closed
/// with `ibv_close_device`.
pub(crate) unsafe fn open_devx(device: *mut ibv_device) -> Result<*mut ibv_context> {
    let lib = lib().map_err(|e| Error::unsupported(Verb::OpenDevice, e))?;
    let open = lib
        .open_device
        .ok_or_else(|| Error::unsupported(Verb::OpenDevice, "libmlx5 has no mlx5dv_open_device"))?;
    let mut attr = Mlx5dvContextAttr {
        flags: MLX5DV_CONTEXT_FLAGS_DEVX,
        comp_mask: 0,
    };
    // SAFETY: `device` is valid (caller); `attr` lives across the call.
    let ctx = unsafe { open(device, &mut attr) };
    if ctx.is_null() {
        return Err(Error::from_io(Verb::OpenDevice, last_os_error()));
    }
    Ok(ctx)
}

/// Register `[addr, addr + len)` as a DEVX UMEM, allowing the page sizes of `pgsz_bitmap`.
/// Returns (handle, umem id).
///
/// Uses `mlx5dv_devx_umem_reg_ex`; on a library without it (rdma-core < 31) falls back to
/// `mlx5dv_devx_umem_reg` only when `pgsz_bitmap` allows every page size from 4 KiB up (what the
/// legacy call lets the kernel pick), and reports `Unsupported` otherwise.
///
/// # Errors
/// `Unsupported` with detail "DEVX needs an mlx5 device" on other devices, when the context has
/// no DEVX, or when `libmlx5` is unavailable; otherwise the verb's errno (`EINVAL` when no page
/// size of the bitmap fits the range).
///
/// # Safety
/// `ctx` is the open context `state` describes; the range stays mapped until the UMEM is
/// deregistered, and the device may write to it.
pub(crate) unsafe fn umem_reg(
    state: DevxState,
    ctx: *mut ibv_context,
    addr: usize,
    len: usize,
    access: Access,
    pgsz_bitmap: u64,
) -> Result<(u64, u32)> {
    match state {
        DevxState::NotMlx5 => {
            return Err(Error::unsupported(
                Verb::UmemReg,
                "DEVX needs an mlx5 device",
            ));
        }
        DevxState::NoDevxContext => {
            return Err(Error::unsupported(
                Verb::UmemReg,
                "DEVX needs an mlx5 device context opened with MLX5DV_CONTEXT_FLAGS_DEVX, \
                 and mlx5dv_open_device refused it",
            ));
        }
        DevxState::Enabled => {}
    }
    let lib = lib().map_err(|e| Error::unsupported(Verb::UmemReg, e))?;
    let umem = if let Some(reg_ex) = lib.umem_reg_ex {
        let mut input = Mlx5dvDevxUmemIn {
            addr: addr as *mut c_void,
            size: len,
            access: access.bits(),
            pgsz_bitmap,
            comp_mask: 0,
            dmabuf_fd: -1,
        };
        // SAFETY: `ctx` is a live DEVX context (caller); `input` lives across the call; the
        // range stays mapped (caller).
        unsafe { reg_ex(ctx, &mut input) }
    } else if let Some(reg) = lib.umem_reg {
        if pgsz_bitmap & LEGACY_PGSZ_BITMAP != LEGACY_PGSZ_BITMAP {
            return Err(Error::unsupported(
                Verb::UmemReg,
                "libmlx5 lacks mlx5dv_devx_umem_reg_ex (rdma-core < 31); the legacy \
                 mlx5dv_devx_umem_reg cannot honour a restricted page-size bitmap",
            ));
        }
        // SAFETY: as above.
        unsafe { reg(ctx, addr as *mut c_void, len, access.bits()) }
    } else {
        return Err(Error::unsupported(
            Verb::UmemReg,
            "libmlx5 has no mlx5dv_devx_umem_reg(_ex)",
        ));
    };
    if umem.is_null() {
        return Err(Error::from_io(Verb::UmemReg, last_os_error()));
    }
    // SAFETY: non-null results point at the library's `struct mlx5dv_devx_umem`.
    let id = unsafe { (*umem).umem_id };
    Ok((umem as u64, id))
}

/// Deregister a UMEM from [`umem_reg`].
///
/// # Errors
/// The verb's errno (`EBUSY` while a DEVX object still uses the UMEM).
///
/// # Safety
/// `handle` came from [`umem_reg`] and is passed here once.
pub(crate) unsafe fn umem_dereg(handle: u64) -> Result<()> {
    let lib = lib().map_err(|e| Error::unsupported(Verb::UmemDereg, e))?;
    let dereg = lib.umem_dereg.ok_or_else(|| {
        Error::unsupported(Verb::UmemDereg, "libmlx5 has no mlx5dv_devx_umem_dereg")
    })?;
    // SAFETY: `handle` is a live `struct mlx5dv_devx_umem *` (caller).
    let rc = unsafe { dereg(handle as *mut Mlx5dvDevxUmem) };
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(Error::from_errno(Verb::UmemDereg, rc)),
        _ => Err(Error::from_io(Verb::UmemDereg, last_os_error())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_device_is_not_mlx5() {
        // SAFETY: null is accepted.
        assert!(!unsafe { is_supported(std::ptr::null_mut()) });
    }

    #[test]
    fn loader_either_resolves_the_umem_api_or_explains_why_not() {
        match lib() {
            Ok(lib) => {
                // Every libmlx5 with DEVX (rdma-core >= 24) exports these; a None here means a
                // symbol name above is misspelt.
                assert!(lib.open_device.is_some(), "mlx5dv_open_device not resolved");
                assert!(lib.umem_reg.is_some(), "mlx5dv_devx_umem_reg not resolved");
                assert!(
                    lib.umem_dereg.is_some(),
                    "mlx5dv_devx_umem_dereg not resolved"
                );
                assert!(load_error().is_none());
            }
            Err(why) => {
                assert!(!why.is_empty());
                assert_eq!(load_error(), Some(why));
            }
        }
    }

    #[test]
    fn umem_without_devx_is_unsupported_and_names_mlx5() {
        for state in [DevxState::NotMlx5, DevxState::NoDevxContext] {
            // SAFETY: these states return before touching the (null) context or the range.
            let err = unsafe {
                umem_reg(
                    state,
                    std::ptr::null_mut(),
                    0x1000,
                    4096,
                    Access::LOCAL_WRITE,
                    1 << 12,
                )
            }
            .unwrap_err();
            match err {
                Error::Unsupported {
                    verb: Verb::UmemReg,
                    detail,
                } => {
                    assert!(detail.contains("DEVX needs an mlx5 device"), "{detail}")
                }
                other => panic!("expected Unsupported, got {other:?}"),
            }
        }
    }

    #[test]
    fn umem_in_layout_matches_mlx5dv_h() {
        // void *addr; size_t size; uint32_t access; uint64_t pgsz_bitmap; uint64_t comp_mask;
        // int dmabuf_fd; on LP64.
        assert_eq!(std::mem::offset_of!(Mlx5dvDevxUmemIn, size), 8);
        assert_eq!(std::mem::offset_of!(Mlx5dvDevxUmemIn, access), 16);
        assert_eq!(std::mem::offset_of!(Mlx5dvDevxUmemIn, pgsz_bitmap), 24);
        assert_eq!(std::mem::offset_of!(Mlx5dvDevxUmemIn, comp_mask), 32);
        assert_eq!(std::mem::offset_of!(Mlx5dvDevxUmemIn, dmabuf_fd), 40);
        assert_eq!(std::mem::offset_of!(Mlx5dvContextAttr, comp_mask), 8);
    }
}
