//! The soft NIC's key table: every memory region and memory window lives in one slot, and a key
//! is `index << 8 | variant`.
//!
//! Contract: a key is valid iff its slot holds an object *and* the slot's variant equals the
//! key's low 8 bits and, for a window, it is bound (`Valid`). Each slot has its own lock, so the
//! data path (`check_and_access`) never takes a table-wide lock; the free-index list is locked
//! only by registration and deregistration. A data transfer holds its slot's read lock while it
//! copies, so a deregistration waits for in-flight DMA, as hardware does.
//!
//! Slots live in chunks of `CHUNK`, allocated when an index in them is first handed out (a
//! table sized for `max_mr + max_mw` costs memory only for the keys in use); indices are
//! handed out lowest first, recycled ones before fresh ones.
//!
//! Each chunk also keeps a bitmap of its slots that may hold an ODP region (a superset: set
//! when an ODP region is put in the slot, cleared when the slot is emptied), so the MMU
//! notifier ([`KeyTable::odp_indices`]) visits only those, not every slot of every device: it
//! runs on every unmap the allocator makes.
//!
//! In the mlx5 model a deregistered region's index may instead wait in the mkey cache with
//! its variant unchanged, for the next registration of its cache entry (`insert_cached`).
//!
//! Invariants: `|recycled| + (capacity - next) + |cached| + |occupied| == capacity - 1`
//! (index 0 is never used); `{ i : slot i holds an ODP region } ⊆ odp_indices()`;
//! `mr.num_mw == |{ mw : mw.bound.mr_index == mr's index }|`.

use super::mem;
use super::pin::PinnedPages;
use super::residency::Residency;
use crate::nic::types::{Access, MwType};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A registered region.
pub(super) struct MrObj {
    pub(super) pd: u64,
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) access: Access,
    /// `Some` for ODP regions.
    pub(super) odp: Option<Residency>,
    /// Windows currently bound to this region.
    pub(super) num_mw: AtomicU32,
    /// False after a failed re-registration (`ERR_CMD`): every access is refused.
    pub(super) usable: bool,
    /// Bytes charged to the memlock account (0 for ODP).
    pub(super) pinned: u64,
    /// The pages a pinned region holds (`None` for ODP).
    pub(super) pins: Option<PinnedPages>,
    /// mlx5 model: the descriptors of the mkey-cache entry the region came from.
    pub(super) cache_ndescs: Option<u64>,
    /// mlx5 model: the mkey is revoked while a re-registration updates it.
    pub(super) revoked: bool,
}

impl MrObj {
    pub(super) fn contains(&self, addr: u64, len: u64) -> bool {
        let (a, l) = (self.addr as u64, self.len as u64);
        addr >= a
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= a.saturating_add(l))
    }
}

/// A window's binding.
#[derive(Clone, Copy, Debug)]
pub(super) struct MwBinding {
    /// The region's key at bind time (index and variant).
    pub(super) mr_key: u32,
    pub(super) addr: usize,
    pub(super) len: usize,
    pub(super) access: Access,
    /// The QP number a type 2 window is bound through.
    pub(super) qpn: Option<u32>,
}

/// A memory window.
pub(super) struct MwObj {
    pub(super) pd: u64,
    pub(super) ty: MwType,
    /// `None`: free (type 2) or unbound (type 1).
    pub(super) binding: Option<MwBinding>,
}

pub(super) enum KeyObj {
    Mr(MrObj),
    Mw(MwObj),
}

pub(super) struct Slot {
    pub(super) variant: u8,
    pub(super) obj: Option<KeyObj>,
}

pub(super) struct KeyTable {
    /// Slot chunks, each allocated on first use (chunk 0, holding the never-used index 0,
    /// at once).
    chunks: Box<[OnceLock<Chunk>]>,
    capacity: u32,
    /// Free indices: recycled ones, and the first never handed out.
    free: Mutex<(Vec<u32>, u32)>,
    /// The mlx5 model's mkey cache: indices of deregistered regions with the cache entry
    /// (descriptors) they belong to, newest last; their slots keep their variant, so the next
    /// registration of that entry gets the same key ([`KeyTable::insert_cached`]).
    cache: Mutex<Vec<(u64, u32)>>,
}

/// Most deregistered regions the mkey cache keeps (beyond, they are freed as usual).
const MKEY_CACHE_MAX: usize = 256;

/// Slots per chunk.
const CHUNK: u32 = 1024;

/// `CHUNK` slots (fewer in the last chunk), and the bitmap of those that may hold an ODP
/// region.
struct Chunk {
    slots: Box<[RwLock<Slot>]>,
    odp: [AtomicU64; (CHUNK / 64) as usize],
}

/// Why a key lookup failed (mapped to a completion status or errno by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyFault {
    /// No object at that index.
    NoObject,
    /// The object's current variant differs (invalidated, rebound, re-registered).
    StaleVariant,
    /// A window key where a region key is required (or the reverse).
    WrongKind,
    /// Another PD.
    WrongPd,
    /// A type 2 window used through another QP.
    WrongQp,
    /// The window is not bound.
    Unbound,
    /// The range leaves the region or window.
    OutOfBounds,
    /// The access flags do not allow the operation.
    NoRight,
    /// The region was poisoned by a failed re-registration.
    Poisoned,
    /// The region's mkey is revoked while a re-registration updates it (mlx5 model).
    Revoked,
    /// An ODP page could not be faulted in (the process cannot access it).
    PageFault,
    /// The DMA copy failed (an ODP page went away between fault-in and copy).
    Dma,
    /// A pinned region's pages are no longer the ones the process sees (dropped, unmapped,
    /// remapped or made inaccessible after registration): hardware would move the old pages,
    /// the soft NIC refuses (see `pin.rs`).
    PinnedPagesGone,
    /// The message exceeds the transport's maximum message size.
    TooLong,
}

impl KeyTable {
    pub(super) fn new(capacity: u32) -> KeyTable {
        let capacity = capacity.clamp(2, 1 << 24);
        let chunks: Box<[OnceLock<_>]> = (0..capacity.div_ceil(CHUNK))
            .map(|_| OnceLock::new())
            .collect();
        let table = KeyTable {
            chunks,
            capacity,
            free: Mutex::new((Vec::new(), 1)),
            cache: Mutex::new(Vec::new()),
        };
        table.chunk(0);
        table
    }

    /// Chunk `c`, allocated if it was not yet.
    fn chunk(&self, c: u32) -> &Chunk {
        self.chunks[c as usize].get_or_init(|| Chunk {
            slots: (c * CHUNK..((c + 1) * CHUNK).min(self.capacity))
                .map(|i| {
                    RwLock::new(Slot {
                        variant: (i.wrapping_mul(37) & 0xff) as u8,
                        obj: None,
                    })
                })
                .collect(),
            odp: [const { AtomicU64::new(0) }; (CHUNK / 64) as usize],
        })
    }

    /// Note whether the slot at `index` (of an allocated chunk) may hold an ODP region: set
    /// when `obj` is one, cleared when the slot is emptied (`obj` `None`).
    pub(super) fn mark_odp(&self, index: u32, obj: Option<&KeyObj>) {
        let Some(chunk) = self
            .chunks
            .get((index / CHUNK) as usize)
            .and_then(|c| c.get())
        else {
            return;
        };
        let (word, bit) = (
            &chunk.odp[(index % CHUNK / 64) as usize],
            1u64 << (index % 64),
        );
        match obj {
            Some(KeyObj::Mr(MrObj { odp: Some(_), .. })) => word.fetch_or(bit, Ordering::AcqRel),
            None => word.fetch_and(!bit, Ordering::AcqRel),
            Some(_) => 0,
        };
    }

    /// Every index that may hold an ODP region (a superset), without allocating or locking.
    pub(super) fn odp_indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.chunks
            .iter()
            .enumerate()
            .filter_map(|(c, chunk)| chunk.get().map(|chunk| (c as u32, chunk)))
            .flat_map(|(c, chunk)| {
                chunk.odp.iter().enumerate().flat_map(move |(w, word)| {
                    let mut bits = word.load(Ordering::Acquire);
                    std::iter::from_fn(move || {
                        (bits != 0).then(|| {
                            let b = bits.trailing_zeros();
                            bits &= bits - 1;
                            c * CHUNK + w as u32 * 64 + b
                        })
                    })
                })
            })
    }

    /// The slot at `index`; index 0 (never handed out, always empty) for an index out of
    /// range or in a chunk never allocated.
    fn slot(&self, index: u32) -> &RwLock<Slot> {
        let first = &self.chunk(0).slots[0];
        if index >= self.capacity {
            return first;
        }
        match self.chunks[(index / CHUNK) as usize].get() {
            Some(chunk) => &chunk.slots[(index % CHUNK) as usize],
            None => first,
        }
    }

    /// Put `obj` in a free slot; returns its key, or `None` when the table is full.
    pub(super) fn insert(&self, obj: KeyObj) -> Option<u32> {
        let index = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            match free.0.pop() {
                Some(i) => i,
                None if free.1 < self.capacity => {
                    free.1 += 1;
                    free.1 - 1
                }
                None => return None,
            }
        };
        self.chunk(index / CHUNK);
        let mut slot = self.write(index);
        slot.variant = slot.variant.wrapping_add(1);
        self.mark_odp(index, Some(&obj));
        slot.obj = Some(obj);
        Some(index << 8 | slot.variant as u32)
    }

    /// Put a region `obj` of the mkey-cache entry `bucket` in the slot of the newest cached
    /// region of that entry, *keeping its variant* (mlx5 hands out the cached mkey as it was);
    /// gives `obj` back when the cache has none of that entry.
    pub(super) fn insert_cached(&self, bucket: u64, obj: Box<KeyObj>) -> Result<u32, Box<KeyObj>> {
        let index = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            match cache.iter().rposition(|&(b, _)| b == bucket) {
                Some(i) => cache.remove(i).1,
                None => return Err(obj),
            }
        };
        let mut slot = self.write(index);
        self.mark_odp(index, Some(&obj));
        slot.obj = Some(*obj);
        Ok(index << 8 | slot.variant as u32)
    }

    /// [`KeyTable::remove_if`], but into the mkey cache's entry `bucket` where it has room: the
    /// slot keeps its variant, and the index waits there for a registration of that entry.
    pub(super) fn remove_to_cache(
        &self,
        index: u32,
        bucket: u64,
        check: impl FnOnce(&KeyObj) -> Result<(), i32>,
    ) -> Result<KeyObj, i32> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MKEY_CACHE_MAX {
            drop(cache);
            return self.remove_if(index, check);
        }
        let obj = {
            let mut slot = self.write(index);
            check(slot.obj.as_ref().ok_or(libc::EINVAL)?)?;
            self.mark_odp(index, None);
            slot.obj.take().ok_or(libc::EINVAL)?
        };
        cache.push((bucket, index));
        Ok(obj)
    }

    /// Empty the slot at `index` and recycle it, if `check` accepts its object (checked under
    /// the slot's write lock, so nothing can bind to it in between).
    pub(super) fn remove_if(
        &self,
        index: u32,
        check: impl FnOnce(&KeyObj) -> Result<(), i32>,
    ) -> Result<KeyObj, i32> {
        let obj = {
            let mut slot = self.write(index);
            check(slot.obj.as_ref().ok_or(libc::EINVAL)?)?;
            slot.variant = slot.variant.wrapping_add(1);
            self.mark_odp(index, None);
            slot.obj.take().ok_or(libc::EINVAL)?
        };
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .push(index);
        Ok(obj)
    }

    /// Index 0 is never handed out, so an out-of-range index reads as an empty slot.
    pub(super) fn read(&self, index: u32) -> RwLockReadGuard<'_, Slot> {
        self.slot(index).read().unwrap_or_else(|e| e.into_inner())
    }

    /// [`KeyTable::read`] that never waits (`None` while a writer holds or waits for it).
    pub(super) fn try_read(&self, index: u32) -> Option<RwLockReadGuard<'_, Slot>> {
        match self.slot(index).try_read() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    pub(super) fn write(&self, index: u32) -> RwLockWriteGuard<'_, Slot> {
        self.slot(index).write().unwrap_or_else(|e| e.into_inner())
    }

    /// Check the invariants of the module contract; returns what is violated.
    pub(super) fn validate(&self) -> Result<(), String> {
        let free = {
            let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.0.len() + (self.capacity - free.1) as usize
        } + self.cache.lock().unwrap_or_else(|e| e.into_inner()).len();
        let occupied = self.occupied();
        if free + occupied.len() != self.capacity as usize - 1 {
            return Err(format!(
                "|free| {free} + |occupied| {} != capacity - 1 {}",
                occupied.len(),
                self.capacity - 1
            ));
        }
        let odp: std::collections::HashSet<u32> = self.odp_indices().collect();
        for &i in &occupied {
            if let Some(KeyObj::Mr(MrObj { odp: Some(_), .. })) = self.read(i).obj.as_ref() {
                if !odp.contains(&i) {
                    return Err(format!("ODP region {i} missing from the ODP bitmap"));
                }
            }
        }
        let mut bound = std::collections::HashMap::<u32, u32>::new();
        for &i in &occupied {
            if let Some(KeyObj::Mw(MwObj {
                binding: Some(b), ..
            })) = self.read(i).obj.as_ref()
            {
                *bound.entry(b.mr_key >> 8).or_default() += 1;
            }
        }
        for &i in &occupied {
            if let Some(KeyObj::Mr(mr)) = self.read(i).obj.as_ref() {
                let (have, want) = (
                    mr.num_mw.load(Ordering::Acquire),
                    bound.get(&i).copied().unwrap_or(0),
                );
                if have != want {
                    return Err(format!("region {i}: num_mw {have} != bound windows {want}"));
                }
            }
        }
        Ok(())
    }

    /// Every occupied index (cold: tests).
    pub(super) fn occupied(&self) -> Vec<u32> {
        self.indices()
            .filter(|&i| self.read(i).obj.is_some())
            .collect()
    }

    /// Every index whose slot exists (occupied or not), without allocating or locking; chunks
    /// never touched are skipped at once.
    pub(super) fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.capacity.div_ceil(CHUNK))
            .filter(|&c| self.chunks[c as usize].get().is_some())
            .flat_map(|c| (c * CHUNK).max(1)..((c + 1) * CHUNK).min(self.capacity))
    }
}

/// Who is asking, for the checks of `check_and_access`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Requester {
    pub(super) pd: u64,
    pub(super) qpn: u32,
    /// A remote access (rkey): windows allowed, remote rights needed.
    pub(super) remote: bool,
}

/// What happens to the bytes once the key and range are checked: the closure gets the
/// address to use and returns a DMA error.
pub(super) type Dma<'a> = &'a mut dyn FnMut(usize) -> std::io::Result<()>;

/// The NIC-side hooks needed while checking (fault accounting).
pub(super) trait FaultSink {
    fn page_fault(&self);
    fn rejected(&self, why: KeyFault);
}

/// One use of a key: `who` touches `len` bytes at `addr` through `key`, writing or not.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyUse {
    pub(super) key: u32,
    pub(super) who: Requester,
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) write: bool,
    /// An RC atomic (a remote write that needs `REMOTE_ATOMIC`).
    pub(super) atomic: bool,
}

/// Check `req` against the key table, then run `dma` while the slot is read-locked. ODP pages
/// are faulted in first; a refusal is reported to `sink`.
pub(super) fn check_and_access(
    table: &KeyTable,
    sink: &dyn FaultSink,
    req: KeyUse,
    dma: Dma<'_>,
) -> Result<(), KeyFault> {
    let r = check_and_access_inner(table, sink, req, dma);
    if let Err(why) = r {
        sink.rejected(why);
    }
    r
}

fn check_and_access_inner(
    table: &KeyTable,
    sink: &dyn FaultSink,
    req: KeyUse,
    dma: Dma<'_>,
) -> Result<(), KeyFault> {
    let KeyUse {
        key,
        who,
        addr,
        len,
        write,
        atomic,
    } = req;
    let slot = table.read(key >> 8);
    let obj = slot.obj.as_ref().ok_or(KeyFault::NoObject)?;
    if slot.variant != (key & 0xff) as u8 {
        return Err(KeyFault::StaleVariant);
    }
    let need = match (who.remote, write) {
        (false, false) => Access::empty(),
        (false, true) => Access::LOCAL_WRITE,
        (true, false) => Access::REMOTE_READ,
        (true, true) if atomic => Access::REMOTE_ATOMIC,
        (true, true) => Access::REMOTE_WRITE,
    };
    match obj {
        KeyObj::Mr(mr) => {
            if mr.pd != who.pd {
                return Err(KeyFault::WrongPd);
            }
            if !mr.usable {
                return Err(KeyFault::Poisoned);
            }
            if mr.revoked {
                return Err(KeyFault::Revoked);
            }
            if !mr.access.contains(need) {
                return Err(KeyFault::NoRight);
            }
            if !mr.contains(addr, len) {
                return Err(KeyFault::OutOfBounds);
            }
            access_mr(mr, sink, addr as usize, len as usize, write, dma)
        }
        KeyObj::Mw(mw) => {
            if !who.remote {
                return Err(KeyFault::WrongKind);
            }
            if mw.pd != who.pd {
                return Err(KeyFault::WrongPd);
            }
            let b = mw.binding.ok_or(KeyFault::Unbound)?;
            if mw.ty == MwType::Type2 && b.qpn != Some(who.qpn) {
                return Err(KeyFault::WrongQp);
            }
            if !b.access.contains(need) {
                return Err(KeyFault::NoRight);
            }
            let addr = if b.access.contains(Access::ZERO_BASED) {
                addr.checked_add(b.addr as u64)
                    .ok_or(KeyFault::OutOfBounds)?
            } else {
                addr
            };
            if addr < b.addr as u64
                || addr
                    .checked_add(len)
                    .is_none_or(|e| e > (b.addr + b.len) as u64)
            {
                return Err(KeyFault::OutOfBounds);
            }
            // Lock order: window, then region (binds take the window's write lock first too).
            let mr_slot = table.read(b.mr_key >> 8);
            let Some(KeyObj::Mr(mr)) = mr_slot
                .obj
                .as_ref()
                .filter(|_| mr_slot.variant == b.mr_key as u8)
            else {
                return Err(KeyFault::NoObject);
            };
            if !mr.usable {
                return Err(KeyFault::Poisoned);
            }
            if mr.revoked {
                return Err(KeyFault::Revoked);
            }
            access_mr(mr, sink, addr as usize, len as usize, write, dma)
        }
    }
}

fn access_mr(
    mr: &MrObj,
    sink: &dyn FaultSink,
    addr: usize,
    len: usize,
    write: bool,
    dma: Dma<'_>,
) -> Result<(), KeyFault> {
    if let Some(res) = &mr.odp.as_ref().filter(|_| len > 0) {
        let ps = mem::page_size();
        let pages = addr / ps..=(addr + len - 1) / ps;
        let missing: Vec<usize> = pages.filter(|&p| !res.present(p, write)).collect();
        if !missing.is_empty() {
            // One look at the process's page tables for the whole access; page by page only
            // when part of it is inaccessible.
            let ok = |p: Option<mem::Prot>| p.is_some_and(|p| p.read && (p.write || !write));
            let all_ok = ok(mem::range_prot(addr, len));
            for page in missing {
                sink.page_fault();
                if !all_ok && !ok(mem::range_prot(page * ps, ps)) {
                    return Err(KeyFault::PageFault);
                }
                res.insert(page, write);
            }
        }
    }
    if let Some(pins) = &mr.pins {
        // Registration proved the range mapped with the rights the region needs: a page that
        // changed, or a DMA that faults, means the pinned pages are not what the process sees.
        if !pins.held(addr, len) {
            return Err(KeyFault::PinnedPagesGone);
        }
        return dma(addr).map_err(|_| KeyFault::PinnedPagesGone);
    }
    dma(addr).map_err(|_| KeyFault::Dma)
}
