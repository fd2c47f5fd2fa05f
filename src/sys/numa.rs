//! NUMA system calls: node masks, `mbind`, `get_mempolicy`, `getcpu`, `move_pages`, and the
//! machine's online nodes from sysfs. The arena's placement policy (`arena/numa.rs`) is built
//! on these.
//!
//! Contract:
//! - Binding is `mbind(MPOL_PREFERRED)` (see `arena/numa.rs` for why not `MPOL_BIND`).
//! - Nothing here allocates through the global allocator: sysfs is read with `open`/`read`
//!   into stack buffers, node masks are stack arrays.
//! - The query functions (`policy_of`, `node_of_page`, `policy_node_of`) are for tests and
//!   diagnostics; a failed call reads `None`, never panics.

use super::os::errno;

/// Most nodes whose mask the helpers handle (`nodemask` bits).
pub const MASK_NODES: usize = 1024;
/// Nodes `Local` keeps an open chunk for; threads on nodes at or above share the slot of
/// `node % MAX_NODES` (their chunks are still bound to their own node when opened).
pub const MAX_NODES: usize = 64;

const WORDS: usize = MASK_NODES / 64;

/// `MPOL_DEFAULT`: no policy (the process's, usually "local node at fault time").
pub const MPOL_DEFAULT: i32 = 0;
/// `MPOL_PREFERRED`: pages from the node while it has them, else from any.
pub const MPOL_PREFERRED: i32 = 1;
/// `MPOL_BIND`: pages from the node set only.
pub const MPOL_BIND: i32 = 2;
const MPOL_F_NODE: libc::c_ulong = 1;
const MPOL_F_ADDR: libc::c_ulong = 2;
const MPOL_F_MEMS_ALLOWED: libc::c_ulong = 4;

/// A node mask on the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mask([libc::c_ulong; WORDS]);

impl Mask {
    fn single(node: u32) -> Option<Mask> {
        let n = node as usize;
        (n < MASK_NODES).then(|| {
            let mut m = [0; WORDS];
            m[n / 64] = 1 << (n % 64);
            Mask(m)
        })
    }

    fn has(&self, node: u32) -> bool {
        let n = node as usize;
        n < MASK_NODES && self.0[n / 64] >> (n % 64) & 1 == 1
    }

    fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }
}

/// Parse a sysfs node list (`0`, `0-3,5`) into a mask; `None` when it does not parse.
fn parse_list(text: &[u8]) -> Option<Mask> {
    let mut m = Mask([0; WORDS]);
    let text = text.strip_suffix(b"\n").unwrap_or(text);
    if text.is_empty() {
        return None;
    }
    for part in text.split(|&b| b == b',') {
        let mut ends = part.splitn(2, |&b| b == b'-');
        let lo = parse_u32(ends.next()?)?;
        let hi = match ends.next() {
            Some(h) => parse_u32(h)?,
            None => lo,
        };
        if hi < lo || hi as usize >= MASK_NODES {
            return None;
        }
        for n in lo..=hi {
            m.0[n as usize / 64] |= 1 << (n % 64);
        }
    }
    Some(m)
}

fn parse_u32(v: &[u8]) -> Option<u32> {
    if v.is_empty() || v.len() > 9 {
        return None;
    }
    v.iter().try_fold(0u32, |n, &b| {
        b.is_ascii_digit().then(|| n * 10 + u32::from(b - b'0'))
    })
}

/// Read a small sysfs file into `buf`; the bytes read.
fn read_small(path: &std::ffi::CStr, buf: &mut [u8]) -> Option<usize> {
    super::os::read_small(path, buf).map(<[u8]>::len)
}

/// The online nodes (`/sys/devices/system/node/online`); `{0}` when sysfs does not say.
fn online_mask() -> Mask {
    let mut buf = [0u8; 512];
    read_small(c"/sys/devices/system/node/online", &mut buf)
        .and_then(|n| parse_list(&buf[..n]))
        .or_else(|| Mask::single(0))
        .unwrap_or(Mask([0; WORDS]))
}

/// The nodes this process may allocate from (`get_mempolicy(MPOL_F_MEMS_ALLOWED)`), if the
/// call answers.
fn allowed_mask() -> Option<Mask> {
    get_mempolicy(std::ptr::null(), MPOL_F_MEMS_ALLOWED).map(|(_, m)| m)
}

/// `get_mempolicy(&mode, mask, MASK_NODES, addr, flags)`: the mode and node mask, `None` when
/// the call fails.
fn get_mempolicy(addr: *const u8, flags: libc::c_ulong) -> Option<(libc::c_int, Mask)> {
    let mut m = Mask([0; WORDS]);
    let mut mode: libc::c_int = -1;
    // SAFETY: the kernel writes `mode` and at most MASK_NODES bits of `m`; `addr` is only
    // looked up (with MPOL_F_ADDR), never dereferenced.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            m.0.as_mut_ptr(),
            MASK_NODES as libc::c_ulong,
            addr as *mut libc::c_void,
            flags,
        )
    };
    (r == 0).then_some((mode, m))
}

/// Online NUMA nodes (1 on a single-node machine, or where sysfs says nothing).
///
/// # Examples
/// ```
/// assert!(rdma_pool::arena::numa::online_nodes() >= 1);
/// ```
pub fn online_nodes() -> u32 {
    online_mask().count().max(1)
}

/// Whether `node` is online and allowed to this process (its cpuset).
///
/// # Examples
/// ```
/// use rdma_pool::arena::numa::is_available;
/// assert!(is_available(0));
/// assert!(!is_available(100_000));
/// ```
pub fn is_available(node: u32) -> bool {
    online_mask().has(node) && allowed_mask().is_none_or(|m| m.has(node))
}

/// Bind `[addr, addr + len)` to `node` with `MPOL_PREFERRED` (see the module contract).
/// Pages already present keep their place (no `MPOL_MF_MOVE`).
///
/// # Errors
/// The call's `errno` (`EINVAL` for a node that does not exist, `EPERM` where a seccomp
/// profile refuses NUMA calls).
///
/// # Safety
/// The range is page-aligned and mapped by the caller (the call changes only its policy).
pub(crate) unsafe fn bind(addr: *mut u8, len: usize, node: u32) -> Result<(), i32> {
    let m = Mask::single(node).ok_or(libc::EINVAL)?;
    // SAFETY: mbind reads MASK_NODES bits of `m` (maxnode counts one past them, as the
    // kernel's `get_nodes` expects) and changes only the range's policy (caller).
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr as *mut libc::c_void,
            len as libc::c_ulong,
            MPOL_PREFERRED as libc::c_ulong,
            m.0.as_ptr(),
            (MASK_NODES + 1) as libc::c_ulong,
            0 as libc::c_uint,
        )
    };
    if r == 0 { Ok(()) } else { Err(errno()) }
}

/// The node of the CPU the calling thread runs on (`getcpu`), `None` if the call fails.
///
/// # Examples
/// ```
/// assert!(rdma_pool::arena::numa::current_node().is_some());
/// ```
pub fn current_node() -> Option<u32> {
    let (mut cpu, mut node): (libc::c_uint, libc::c_uint) = (0, 0);
    // SAFETY: getcpu writes the two integers; the cache argument is unused since 2.6.24.
    let r = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut libc::c_uint,
            &mut node as *mut libc::c_uint,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    (r == 0).then_some(node)
}

/// The node the page at `addr` resides on (`move_pages` with no target: a query), `None` for
/// a page not present or a failed call. For tests and diagnostics.
///
/// # Examples
/// ```
/// let x = Box::new(7u64); // touched: present
/// let node = rdma_pool::arena::numa::node_of_page(&*x as *const u64 as *const u8);
/// assert!(node.is_some());
/// ```
pub fn node_of_page(addr: *const u8) -> Option<u32> {
    let page = (addr as usize & !4095) as *mut libc::c_void;
    let mut status: libc::c_int = -1;
    // SAFETY: one page pointer in, one status out; a null node list only queries.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0 as libc::pid_t,
            1 as libc::c_ulong,
            &page as *const *mut libc::c_void,
            std::ptr::null::<libc::c_int>(),
            &mut status as *mut libc::c_int,
            0 as libc::c_int,
        )
    };
    (r == 0 && status >= 0).then_some(status as u32)
}

/// The policy of the mapping at `addr`: its mode (`MPOL_DEFAULT`, `MPOL_PREFERRED`,
/// `MPOL_BIND`, …) and the lowest node of its mask (`None` for an empty mask), from
/// `get_mempolicy(MPOL_F_ADDR)`; `None` when the call fails (unmapped address). For tests and
/// diagnostics.
///
/// # Examples
/// ```
/// use rdma_pool::arena::numa::{policy_of, MPOL_DEFAULT};
/// let x = Box::new(7u64);
/// assert_eq!(policy_of(&*x as *const u64 as *const u8), Some((MPOL_DEFAULT, None)));
/// ```
pub fn policy_of(addr: *const u8) -> Option<(i32, Option<u32>)> {
    let (mode, m) = get_mempolicy(addr, MPOL_F_ADDR)?;
    let first = (0..MASK_NODES as u32).find(|&n| m.has(n));
    // Strip the mode flags (MPOL_F_STATIC_NODES, …) the kernel may report in the high bits.
    Some((mode & 0xff, first))
}

/// The node the page at `addr` would be (or was) allocated on under the mapping's policy
/// (`get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)`), `None` when the call fails.
///
/// # Examples
/// ```
/// let x = Box::new(7u64);
/// let p = &*x as *const u64 as *const u8;
/// assert_eq!(rdma_pool::arena::numa::policy_node_of(p), rdma_pool::arena::numa::node_of_page(p));
/// ```
pub fn policy_node_of(addr: *const u8) -> Option<u32> {
    let mut node: libc::c_int = -1;
    // SAFETY: with MPOL_F_NODE the kernel writes one int into `node`, no mask.
    let r = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr as *mut libc::c_void,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    (r == 0 && node >= 0).then_some(node as u32)
}

/// CPUs this process may run on (its affinity mask; the CPUs online when that cannot be
/// read), at least 1. Allocates nothing (the allocator's own set-up calls it).
pub(crate) fn cpus_online() -> usize {
    // SAFETY: an all-zero `cpu_set_t` is an empty set; sched_getaffinity writes at most
    // `size_of::<cpu_set_t>()` bytes into it.
    let n = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            libc::CPU_COUNT(&set) as i64
        } else {
            libc::sysconf(libc::_SC_NPROCESSORS_ONLN) as i64
        }
    };
    usize::try_from(n).unwrap_or(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_parse() {
        let m = parse_list(b"0-2,5\n").unwrap();
        assert_eq!(m.count(), 4);
        assert!(m.has(0) && m.has(2) && m.has(5) && !m.has(3) && !m.has(6));
        assert_eq!(parse_list(b"0").map(|m| m.count()), Some(1));
        assert_eq!(parse_list(b"70-65"), None);
        assert_eq!(parse_list(b""), None);
        assert_eq!(parse_list(b"a"), None);
        assert_eq!(parse_list(b"1024"), None);
    }

    #[test]
    fn a_binding_is_what_get_mempolicy_reads_back() {
        let len = 1 << 21;
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p.cast::<u8>();
        assert_eq!(policy_of(p), Some((MPOL_DEFAULT, None)));
        let last = online_nodes() - 1;
        let node = (0..=last).rev().find(|&n| is_available(n)).unwrap();
        // SAFETY: the mapping above, page-aligned.
        unsafe { bind(p, len, node) }.unwrap();
        assert_eq!(policy_of(p), Some((MPOL_PREFERRED, Some(node))));
        assert_eq!(policy_node_of(p), Some(node));
        // SAFETY: our mapping.
        unsafe { p.write_volatile(1) };
        assert_eq!(node_of_page(p), Some(node));
        // SAFETY: as above.
        assert_eq!(unsafe { bind(p, len, 100_000) }, Err(libc::EINVAL));
        // SAFETY: the mapping above, no longer used.
        assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);
    }
}
