//! `librdma_pool.so` / `librdma_pool.a`: rdma-pool as the `malloc` of C and C++ programs, so
//! that every heap byte of a service is NIC-registered, with a C API (`rdma_pool.h`) for the
//! keys of any heap pointer, the pool's verbs objects, statistics and grants.
//!
//! ```c
//! // cc app.c $(pkg-config --cflags --libs rdma_pool)   or   LD_PRELOAD=librdma_pool.so ./app
//! char *buf = malloc(4096);
//! uint32_t lkey, rkey;
//! if (rdma_pool_keys_of(buf, 4096, &lkey, &rkey) == 0)
//!     post_send(qp, buf, 4096, lkey);          // no ibv_reg_mr
//! ```
//!
//! Contract:
//! - **One pool per process**, [`POOL`]: a [`GlobalPool`] with [`Fallback::Mmap`], which is
//!   also this library's own Rust global allocator, so nothing in it ever calls the system
//!   `malloc` (which would be this library again). What the pool cannot serve — while it calls
//!   into the NIC (opening the device: libibverbs and its providers allocate), while it
//!   initialises, or when it degrades — comes from its bootstrap region and then from whole-page
//!   anonymous mappings, as `GlobalPool`'s contract says.
//! - **Lazy and cheap initialisation**: nothing happens when the library is loaded; the first
//!   allocation opens the NIC the environment names (`RDMA_POOL_NIC`, else the first verbs
//!   device, else the soft NIC) and reserves the arena.
//! - **Every `free` finds its block by address** (`GlobalPool::free_unsized`): the pool's,
//!   the bootstrap region's, a fallback mapping; a pointer none of them handed out — memory
//!   ld.so allocated before the library was the process's `malloc` — is ignored and counted.
//! - `malloc` and friends follow POSIX and glibc: 16-byte alignment (`max_align_t`), `errno`
//!   set to `ENOMEM`/`EINVAL` on failure, `free` preserves `errno`, `realloc(p, 0)` frees `p` and
//!   returns NULL (glibc's choice).
//! - **Never panic across the C ABI**: the C API catches panics and reports `EIO`; the malloc
//!   family does not panic (the pool's allocation paths never do).
//!
//! Build and install: `bash scripts/install-capi.sh [PREFIX]` (README, "C and C++").

#![warn(missing_docs, unreachable_pub)]

pub mod api;
pub mod malloc;

use pool::GlobalPool;
use pool::arena::Hugepages;
use pool::global::{Fallback, GlobalConfig};
use pool::nic::Nic;
use std::sync::OnceLock;

/// The process's pool: its `malloc` and this library's Rust global allocator.
///
/// On 4 KiB pages by default ([`Hugepages::Off`]), unlike a Rust program's `GlobalPool`:
/// every process a preloaded service starts (a shell, `gcc` → `cc1`, `as`, `ld`) loads the
/// library, and with transparent huge pages each slab a small process touches is 2 MiB of
/// resident memory — measured: `python3 -c pass` at 40 MB instead of 17 MB (13 MB under
/// glibc). `RDMA_POOL_HUGEPAGES=transparent` (or `prefer`) gives a NIC-heavy service fewer
/// translations for the device to cache.
///
/// Its NIC is the one [`Nic::open_default`] picks; when that fails (`RDMA_POOL_NIC` names a
/// device that is not there) the pool is built on the soft NIC instead — a heap that works at
/// full speed, registered with no device — and [`api::rdma_pool_init`] reports why (`ENODEV`
/// and the message), rather than every block becoming a page of its own.
#[global_allocator]
pub static POOL: GlobalPool = GlobalPool::with_config(GlobalConfig {
    arena: pool::arena::ArenaConfig {
        hugepages: Hugepages::Off,
        ..GlobalConfig::DEFAULT.arena
    },
    fallback: Fallback::Mmap,
    open: Some(open_nic),
    ..GlobalConfig::DEFAULT
});

/// Why the NIC the environment asked for could not be opened (set once, by the pool's
/// initialisation, when it fell back to the soft NIC).
static OPEN_ERROR: OnceLock<String> = OnceLock::new();

/// The pool's NIC: the default one, else the soft NIC (see [`POOL`]).
fn open_nic() -> pool::nic::Result<Nic> {
    Nic::open_default().or_else(|e| {
        let _ = OPEN_ERROR.set(format!(
            "{e}; the heap is on the soft NIC instead (registered with no device)"
        ));
        Ok(Nic::soft())
    })
}
