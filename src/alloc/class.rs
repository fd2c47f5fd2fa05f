//! Size classes: 8-byte steps up to 64 bytes, then eight classes per power of two up to
//! [`MAX_SMALL`] (1 MiB), so a block wastes at most 12.5% of its size above 64 bytes.
//!
//! Invariants: `class_size(class_of(n)) >= n` for `1 <= n <= MAX_SMALL`;
//! `class_size(c) < class_size(c + 1)`; `class_size(class_of(n)) <= n + n / 8` above 64;
//! `page_shift(c)` is the smallest power of two of at least 64 KiB that holds eight blocks, and
//! at most one 2 MiB slab (which holds at least two blocks of any class): a thread's page of a
//! large class never pins more than a slab. That is the *dense* page; a heap's first
//! [`FIRST_SMALL_PAGES`] pages of a class are sized to its demand (`page_shift_for`): one 4 KiB
//! granule for blocks up to 1 KiB (a thread holding twenty 256-byte blocks holds 8 KiB, not
//! 68 KiB), else the smallest power of two of at least 4 KiB that holds one block — a thread
//! holding one 2 KiB block holds 4 KiB, not 64 KiB, and one holding two 200 KiB blocks two
//! 256 KiB pages, not 256 KiB + 2 MiB. Its next pages of the class are dense (one step, not a
//! doubling ramp: every page size a heap passes through cuts a slab of its own, shared with
//! other heaps). Pages of at most a step (256 KiB) lie on 4 KiB pages, committed where
//! touched, and in pinned mode registered a step at a time (`arena/step.rs`): a slab of a
//! page size few blocks use costs the steps in use, not the slab.

/// Largest size served from size-class pages; larger blocks are slab runs.
pub const MAX_SMALL: usize = 1 << 20;

/// Number of size classes.
pub const CLASSES: usize = 8 + 8 * 14;

/// log2 of the smallest page (4 KiB): the granule of the page table (one 128-byte descriptor
/// per granule, written only for carved pages: 3% of a slab cut into pages).
pub(crate) const GRANULE_SHIFT: u32 = 12;
/// log2 of the smallest dense page (64 KiB).
pub(crate) const DENSE_SHIFT: u32 = 16;

/// Sizes up to this are classed by one table load ([`SMALL_CLASS`]).
pub(crate) const TABLE_MAX: usize = 1024;

/// `SMALL_CLASS[k]` is the class of `8k` bytes: every class boundary up to [`TABLE_MAX`] is a
/// multiple of 8, so all sizes in `(8(k-1), 8k]` share it.
const SMALL_CLASS: [u8; TABLE_MAX / 8 + 1] = {
    let mut t = [0u8; TABLE_MAX / 8 + 1];
    let mut k = 0;
    while k < t.len() {
        t[k] = class_of_computed(k * 8) as u8;
        k += 1;
    }
    t
};

/// The class of a request of `size` bytes (`1..=MAX_SMALL`; 0 is served as 1): one table load
/// up to 1 KiB, so the fast paths take no branch on the size.
#[inline(always)]
pub(crate) fn class_of(size: usize) -> usize {
    if size <= TABLE_MAX {
        return small_class(size);
    }
    class_of_computed(size)
}

/// [`class_of`] of a size known to be at most [`TABLE_MAX`]: the table load alone.
#[inline(always)]
pub(crate) fn small_class(size: usize) -> usize {
    debug_assert!(size <= TABLE_MAX);
    // SAFETY: `(size + 7) / 8 <= TABLE_MAX / 8` (the caller's contract, checked in debug).
    (unsafe { *SMALL_CLASS.get_unchecked((size + 7) >> 3) }) as usize
}

/// [`class_of`] by arithmetic (what the table holds, and every size above it).
#[inline(always)]
pub(crate) const fn class_of_computed(size: usize) -> usize {
    if size <= 64 {
        return if size == 0 { 0 } else { size.div_ceil(8) - 1 };
    }
    let b = (usize::BITS - 1 - (size - 1).leading_zeros()) as usize;
    let sub = ((size - 1) >> (b - 3)) & 7;
    8 + (b - 6) * 8 + sub
}

/// Bytes in a block of class `c`.
#[inline]
pub const fn class_size(c: usize) -> usize {
    if c < 8 {
        (c + 1) * 8
    } else {
        let g = (c - 8) / 8 + 1;
        let s = (c - 8) % 8;
        (1 << (g + 5)) + ((s + 1) << (g + 2))
    }
}

/// The smallest class whose blocks hold `size` bytes at an address aligned to `align`
/// (a power of two no larger than [`MAX_SMALL`]): blocks sit at multiples of the block size from a
/// page start aligned to the page size, so the block size must be a multiple of `align`.
pub(crate) fn class_for(size: usize, align: usize) -> Option<usize> {
    let size = size.max(1).checked_next_multiple_of(align)?;
    if size > MAX_SMALL {
        return None;
    }
    (class_of(size)..CLASSES).find(|&c| class_size(c) % align == 0)
}

/// Exact division by a class's block size, for telling a block's first byte from any other
/// (`d = odd << shift`; `x` is a multiple of `d` iff its low `shift` bits are 0 and
/// `(x >> shift) * inv(odd) mod 2^64 <= u64::MAX / odd`).
#[derive(Clone, Copy)]
struct Divisor {
    shift: u32,
    inv: u64,
    lim: u64,
}

/// The inverse of odd `d` modulo 2^64 (Newton's iteration: each step doubles the bits).
const fn mod_inverse(d: u64) -> u64 {
    let mut x = d;
    let mut i = 0;
    while i < 6 {
        x = x.wrapping_mul(2u64.wrapping_sub(d.wrapping_mul(x)));
        i += 1;
    }
    x
}

const DIVISORS: [Divisor; CLASSES] = {
    let mut t = [Divisor {
        shift: 0,
        inv: 0,
        lim: 0,
    }; CLASSES];
    let mut c = 0;
    while c < CLASSES {
        let d = class_size(c) as u64;
        let shift = d.trailing_zeros();
        let odd = d >> shift;
        t[c] = Divisor {
            shift,
            inv: mod_inverse(odd),
            lim: u64::MAX / odd,
        };
        c += 1;
    }
    t
};

/// Whether `off` is a multiple of class `c`'s block size: a multiply and a compare, no
/// division (a size-less free checks that its pointer starts a block).
#[inline(always)]
pub(crate) fn is_block_offset(off: usize, c: usize) -> bool {
    // SAFETY: callers pass a page's class, below CLASSES.
    let d = unsafe { DIVISORS.get_unchecked(c) };
    let off = off as u64;
    off & ((1u64 << d.shift) - 1) == 0 && (off >> d.shift).wrapping_mul(d.inv) <= d.lim
}

/// log2 of the page size for class `c`.
pub(crate) const fn page_shift(c: usize) -> u32 {
    let want = class_size(c) * 8;
    let mut shift = DENSE_SHIFT;
    while (1usize << shift) < want && shift < MAX_PAGE_SHIFT {
        shift += 1;
    }
    shift
}

/// log2 of the page a heap takes for class `c` while it holds `held` pages of the class.
/// While the heap holds fewer than [`FIRST_SMALL_PAGES`] pages of the class, small pages:
/// 4 KiB for blocks up to 1 KiB (at least four blocks each), the smallest page of at least
/// 4 KiB that holds one block for larger ones; then the dense page ([`page_shift`]). A heap
/// holding 20 blocks of 256 bytes holds 8 KiB of pages, not 4 KiB + 64 KiB; one holding a
/// 2 KiB block 4 KiB, not 64 KiB; one holding two 200 KiB blocks 512 KiB, not
/// 256 KiB + 2 MiB.
pub(crate) const fn page_shift_for(c: usize, held: u32) -> u32 {
    let dense = page_shift(c);
    if held >= FIRST_SMALL_PAGES {
        return dense;
    }
    let mut shift = GRANULE_SHIFT;
    while (1usize << shift) < class_size(c) {
        shift += 1;
    }
    if shift < dense { shift } else { dense }
}

/// Small pages a heap holds of a class before it takes dense ones.
pub(crate) const FIRST_SMALL_PAGES: u32 = 4;

/// log2 of the largest page: one arena slab.
pub(crate) const MAX_PAGE_SHIFT: u32 = crate::arena::SLAB_SHIFT;

const _: () = assert!(1 << MAX_PAGE_SHIFT >= 2 * MAX_SMALL);

// Every size the table classes is cached (the fast paths skip the class test).
const _: () = assert!(class_of_computed(TABLE_MAX) < super::tcache::CACHED_CLASSES);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_offsets_are_told_exactly_without_division() {
        for c in 0..CLASSES {
            let bs = class_size(c);
            for k in [0usize, 1, 2, 7, 100, 1000] {
                assert!(is_block_offset(k * bs, c), "class {c}: {k} blocks");
                for d in [1usize, 8, 15, 16, bs / 2, bs - 1] {
                    if d % bs != 0 {
                        assert!(
                            !is_block_offset(k * bs + d, c),
                            "class {c}: {k} blocks + {d}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn classes_cover_every_size_with_bounded_waste() {
        for n in 0..=MAX_SMALL {
            let c = class_of(n);
            assert_eq!(
                c,
                class_of_computed(n),
                "{n}: table and arithmetic disagree"
            );
            let n = n.max(1);
            let s = class_size(c);
            assert!(s >= n, "{n} → class {c} of {s}");
            if n > 64 {
                assert!(s - n <= n / 8, "{n} → {s}");
            }
            if c > 0 {
                assert!(
                    class_size(c - 1) < n,
                    "{n} fits the smaller class {}",
                    c - 1
                );
            }
        }
        assert_eq!(class_of(MAX_SMALL), CLASSES - 1);
        assert_eq!(class_size(CLASSES - 1), MAX_SMALL);
    }

    #[test]
    fn aligned_classes_are_multiples_of_the_alignment() {
        for align in [8, 16, 64, 256, 4096, 65536] {
            for n in [1, 7, 65, 100, 1000, 5000, 70000, 300000] {
                let c = class_for(n, align).unwrap();
                assert_eq!(class_size(c) % align, 0);
                assert!(class_size(c) >= n);
            }
        }
        assert_eq!(class_for(MAX_SMALL + 1, 8), None);
    }

    #[test]
    fn a_heaps_first_pages_of_a_class_are_small_the_next_are_dense() {
        for c in 0..CLASSES {
            let first = 1usize << page_shift_for(c, 0);
            assert!(first >= 4 * class_size(c).min(1024), "class {c}");
            assert!(
                first == 4 << 10 || first < 2 * class_size(c),
                "class {c}: one block, under twice its size"
            );
            assert!(page_shift_for(c, 0) <= page_shift(c), "class {c}");
            for held in 1..FIRST_SMALL_PAGES {
                assert_eq!(page_shift_for(c, held), page_shift_for(c, 0), "class {c}");
            }
            for held in FIRST_SMALL_PAGES..300 {
                assert_eq!(page_shift_for(c, held), page_shift(c), "class {c}");
            }
        }
        // 200 KiB blocks: four 256 KiB pages, then dense 2 MiB ones.
        let c = class_of_computed(200 << 10);
        assert_eq!((page_shift_for(c, 3), page_shift_for(c, 4)), (18, 21));
        // 32-byte blocks: four 4 KiB pages, then 64 KiB ones.
        assert_eq!((page_shift_for(3, 3), page_shift_for(3, 4)), (12, 16));
        // 4 KiB blocks: four 4 KiB pages, then 64 KiB ones; 5 KiB blocks: 8 KiB pages.
        let c = class_of_computed(4 << 10);
        assert_eq!((page_shift_for(c, 0), page_shift_for(c, 4)), (12, 16));
        let c = class_of_computed(5 << 10);
        assert_eq!((page_shift_for(c, 3), page_shift_for(c, 4)), (13, 16));
    }

    #[test]
    fn pages_hold_eight_blocks_or_a_slab_of_at_least_two() {
        for c in 0..CLASSES {
            let p = 1usize << page_shift(c);
            assert!(
                p / class_size(c) >= 8 || p == 1 << MAX_PAGE_SHIFT,
                "class {c}"
            );
            assert!(p / class_size(c) >= 2, "class {c}");
            assert!((64 << 10..=2 << 20).contains(&p));
        }
    }
}
