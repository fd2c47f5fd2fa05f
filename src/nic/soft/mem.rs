//! The soft NIC's view of process memory: its "DMA engine" and its page-table queries.
//!
//! Contract: the soft NIC never dereferences a user address. Bytes move with
//! `process_vm_readv` on our own pid, which fails with `EFAULT` instead of faulting when a page
//! is unmapped or lacks the needed protection, just as a NIC's DMA fails instead of crashing
//! the host. Protection and page size come from `/proc/self/maps` and `/proc/self/smaps`, only
//! on cold paths (registration, ODP faults, prefetch, UMEM).

use std::io;

/// The base page size.
pub(crate) fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if v > 0 { v as usize } else { 4096 }
    })
}

/// Copy `len` bytes from `src` to `dst` (both addresses in this process) the way a DMA engine
/// would: an unreadable source or unwritable destination is an error, never a crash.
pub(crate) fn dma_copy(dst: usize, src: usize, len: usize) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: dst as *mut libc::c_void,
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: src as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: process_vm_readv validates both ranges in the kernel and returns EFAULT instead
    // of touching an invalid page; the iovecs are valid for the duration of the call.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != len {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(())
}

/// Protection of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prot {
    pub(crate) read: bool,
    pub(crate) write: bool,
}

fn parse_maps_line(line: &str) -> Option<(usize, usize, Prot)> {
    let mut it = line.split_whitespace();
    let range = it.next()?;
    let perms = it.next()?.as_bytes();
    let (a, b) = range.split_once('-')?;
    let start = usize::from_str_radix(a, 16).ok()?;
    let end = usize::from_str_radix(b, 16).ok()?;
    Some((
        start,
        end,
        Prot {
            read: perms.first() == Some(&b'r'),
            write: perms.get(1) == Some(&b'w'),
        },
    ))
}

/// The weakest protection over `[addr, addr + len)`, or `None` when part of it is unmapped.
pub(crate) fn range_prot(addr: usize, len: usize) -> Option<Prot> {
    let end = addr.checked_add(len)?;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut cursor = addr;
    let mut prot = Prot {
        read: true,
        write: true,
    };
    for (s, e, p) in maps.lines().filter_map(parse_maps_line) {
        if e <= cursor {
            continue;
        }
        if s > cursor {
            return None;
        }
        prot.read &= p.read;
        prot.write &= p.write;
        cursor = e;
        if cursor >= end {
            return Some(prot);
        }
    }
    None
}

/// The kernel page size backing `addr` (4 KiB, or the huge page size for hugetlb mappings).
/// Read from `/proc/self/maps`, not `smaps` (which walks every page table of the process: with
/// thousands of threads, seconds per call): only hugetlb mappings have a larger kernel page —
/// anonymous ones are named `/anon_hugepage`, file ones live on a hugetlbfs mount (`statfs`).
pub(crate) fn backing_page_size(addr: usize) -> Option<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps
        .lines()
        .find(|l| parse_maps_line(l).is_some_and(|(s, e, _)| s <= addr && addr < e))?;
    // Fields: range, perms, offset, dev, inode, path (which may hold spaces).
    let path = line.splitn(6, char::is_whitespace).nth(5).map(str::trim);
    let Some(path) = path.filter(|p| p.starts_with('/')) else {
        return Some(page_size());
    };
    if path.starts_with("/anon_hugepage") {
        return Some(default_huge_page_size());
    }
    let file = path.trim_end_matches(" (deleted)");
    let Ok(c) = std::ffi::CString::new(file) else {
        return Some(page_size());
    };
    // SAFETY: `statfs` writes into a zeroed struct; `c` is NUL-terminated.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let hugetlbfs =
        unsafe { libc::statfs(c.as_ptr(), &mut fs) } == 0 && fs.f_type as i64 == HUGETLBFS_MAGIC;
    Some(if hugetlbfs {
        fs.f_bsize as usize
    } else {
        page_size()
    })
}

const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// The default hugetlb page size (`Hugepagesize` in `/proc/meminfo`), 2 MiB when unreadable.
fn default_huge_page_size() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kb = m.lines().find_map(|l| l.strip_prefix("Hugepagesize:"))?;
            kb.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<usize>()
                .ok()
        })
        .map_or(2 << 20, |kb| kb * 1024)
}

/// True when the CPU has the page at `page_addr` resident (`mincore`).
pub(crate) fn cpu_resident(page_addr: usize) -> bool {
    let mut vec = 0u8;
    // SAFETY: mincore writes one byte per page into `vec`, which has room for one page; an
    // unmapped address makes it fail with ENOMEM rather than fault.
    let rc = unsafe { libc::mincore(page_addr as *mut libc::c_void, page_size(), &mut vec) };
    rc == 0 && vec & 1 == 1
}

/// True when this process may pin memory beyond `RLIMIT_MEMLOCK` (`CAP_IPC_LOCK`).
pub(crate) fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`u64::MAX` for unlimited).
pub(crate) fn memlock_rlimit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) };
    if rc != 0 || rl.rlim_cur == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        rl.rlim_cur
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dma_copy_moves_bytes_and_reports_faults() {
        let src = [1u8, 2, 3, 4];
        let mut dst = [0u8; 4];
        dma_copy(dst.as_mut_ptr() as usize, src.as_ptr() as usize, 4).unwrap();
        assert_eq!(dst, src);
        let none = memmap2::MmapOptions::new()
            .len(page_size())
            .map_anon()
            .unwrap();
        let p = none.as_ptr() as usize;
        // SAFETY: the mapping is ours; making it inaccessible affects only this test.
        unsafe { libc::mprotect(p as *mut libc::c_void, page_size(), libc::PROT_NONE) };
        assert_eq!(
            dma_copy(dst.as_mut_ptr() as usize, p, 4)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EFAULT)
        );
        assert_eq!(
            range_prot(p, 1),
            Some(Prot {
                read: false,
                write: false
            })
        );
    }

    #[test]
    fn backing_page_size_of_a_hugetlb_mapping_is_the_huge_page() {
        let len = 2 << 20;
        // SAFETY: a fresh anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            // No hugetlb page reserved here: the refusal is the kernel's.
            let errno = io::Error::last_os_error().raw_os_error();
            assert!(
                matches!(errno, Some(libc::ENOMEM | libc::EINVAL)),
                "{errno:?}"
            );
            return;
        }
        assert_eq!(
            backing_page_size(p as usize),
            Some(default_huge_page_size())
        );
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, len) };
    }

    #[test]
    fn range_prot_sees_read_only_and_unmapped() {
        let m = memmap2::MmapOptions::new()
            .len(2 * page_size())
            .map_anon()
            .unwrap();
        let p = m.as_ptr() as usize;
        assert_eq!(
            range_prot(p, 2 * page_size()),
            Some(Prot {
                read: true,
                write: true
            })
        );
        let ro = m.make_read_only().unwrap();
        assert_eq!(
            range_prot(p, 1),
            Some(Prot {
                read: true,
                write: false
            })
        );
        // A range that runs off the end of a mapping into a hole is unmapped. The hole is made
        // without unmapping anything: the page at address 0 can never be mapped
        // (`vm.mmap_min_addr`), whereas a freed address may be reused at once by another test's
        // mapping.
        drop(ro);
        assert_eq!(range_prot(0, 1), None);
        assert_eq!(range_prot(page_size(), page_size()), None);
        assert_eq!(backing_page_size(0), None);
    }

    #[test]
    fn backing_page_size_of_heap_is_base_page() {
        let v = vec![0u8; 1 << 20];
        assert_eq!(backing_page_size(v.as_ptr() as usize), Some(page_size()));
    }
}
