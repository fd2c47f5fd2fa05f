//! Sparse classes: a heap's first blocks of a small class live on the page of its group's
//! leader, so that a thread holding a few blocks of many classes holds a few pages, not a page
//! per class.
//!
//! Why: a page is the least a class costs a heap (one 4 KiB granule), so a thread holding one
//! or two blocks of each of thirty classes held thirty pages — 120 KiB for the 8 KiB of 32
//! blocks of 16–512 bytes a `spawn_blocking` task of `tokio-blocking` allocates. jemalloc's
//! threads share their arena's slabs; ours own their pages (no lock, no atomic on the fast
//! paths), so they share among classes instead.
//!
//! Contract: classes of at most [`SPARSE_MAX`] bytes form groups `(L/2, L]` for each power of
//! two `L`, led by the class of `L` ([`leader`]). While a heap has not yet served class `c` from
//! its slow path [`ALIAS_TURNS`] times (`Heap::aliased`), holds no page of `c` and holds fewer
//! than `FIRST_SMALL_PAGES` pages of the leader's class (its 4 KiB first pages), its slow
//! path serves `c` from the leader's current page (a block of the leader's class: at most
//! twice the size asked for) and points `current[c]` at that page, so that the fast path of
//! `c` pops from it too — no new instruction on the fast paths. Afterwards `c` takes pages of
//! its own, as every class did before (the first ones a 4 KiB granule).
//!
//! Invariant (extends `heap.rs`'s): `current[c]` is `&EMPTY`, the head of `queue[c]`, or — `c`
//! not a leader, aliased — a page of `queue[leader(c)]` of this heap. Whatever takes a page out
//! of a leader's queue (`Heap::dequeue`) points its aliases back at `&EMPTY` in the same
//! step, so an alias never outlives the page's stay in the heap; code that works on the pages
//! of class `c` through `current[c]` first drops an alias ([`Heap::unalias`]: the slow path,
//! `Heap::enqueue` — a page of `c` adopted back, or requeued, while `c` is aliased) or skips
//! it (`Heap::retire_empty`). A double-free check looks for a block in the caches of every
//! class up to its page's (`Heap::caches`); statistics count a cached block in the class of its
//! page. `realloc` keeps a block in place only within its page's class (the leader's, for a
//! sparse block), and an unsized free caches it in that class.
//! A block of the leader's page freed with the smaller size goes to the thread cache of the
//! smaller class: a cache may hold blocks larger than its class (`tcache.rs`).

use super::*;
use crate::alloc::class::{FIRST_SMALL_PAGES, TABLE_MAX, class_of_computed, class_size};

/// Largest class size that shares its leader's page while sparse.
pub(crate) const SPARSE_MAX: usize = TABLE_MAX;

/// Slow-path turns a class is served from its leader's page before it takes pages of its own.
pub(crate) const ALIAS_TURNS: u8 = 4;

/// `LEADER[c]`: the class whose page serves class `c` while it is sparse (`c` itself for a
/// class larger than [`SPARSE_MAX`] or of a power-of-two size).
const LEADER: [u8; CLASSES] = {
    let mut t = [0u8; CLASSES];
    let mut c = 0;
    while c < CLASSES {
        let s = class_size(c);
        t[c] = if s > SPARSE_MAX {
            c as u8
        } else {
            class_of_computed(s.next_power_of_two()) as u8
        };
        c += 1;
    }
    t
};

/// The leader of class `c` (see [`LEADER`]).
pub(crate) const fn leader(c: usize) -> usize {
    LEADER[c] as usize
}

/// The classes led by `l` other than itself: a contiguous range below it (empty when `l`
/// leads no other class).
fn members(l: usize) -> std::ops::Range<usize> {
    let mut first = l;
    while first > 0 && leader(first - 1) == l && first - 1 != l {
        first -= 1;
    }
    first..l
}

impl Heap {
    /// The slow path of a sparse class `c`: a block of its leader's page, with `current[c]`
    /// pointing there for the fast path; `None` when `c` is served from its own pages.
    pub(super) fn alloc_sparse(&self, c: usize) -> Option<*mut u8> {
        let l = leader(c);
        let turns = self.aliased[c].load(R);
        // Only while the leader's pages are first pages (4 KiB granules): a group dense enough
        // to need more is one whose classes each fill pages of their own.
        if l == c
            || turns >= ALIAS_TURNS
            || self.held[c].load(R) != 0
            || !self.queue[c].load(R).is_null()
            || self.full[c].load(R) != 0
            || u32::from(self.held[l].load(R)) >= FIRST_SMALL_PAGES
        {
            return None;
        }
        self.aliased[c].store(turns + 1, R);
        // From the leader's page, never its thread cache: `current[c]` must be the page the
        // block came from (`alloc_zeroed` reads whether it is fresh).
        let held = self.held[l].load(R);
        let b = self.alloc_page(l);
        // A page the leader took for the group does not size the leader's next pages: they
        // stay first pages while the leader's own blocks are few.
        self.held[l].store(held.min(self.held[l].load(R)), R);
        let page = self.current[l].load(R);
        if !b.is_null() && page != empty() {
            self.current[c].store(page, R);
        }
        Some(b)
    }

    /// Point `current[c]` back at class `c`'s own queue if it aliases its leader's page.
    pub(super) fn unalias(&self, c: usize) {
        let p = self.current[c].load(R);
        // SAFETY: `current[c]` is `&EMPTY` or a page of this heap (module invariant).
        if p != empty() && usize::from(unsafe { &*p }.class.load(R)) != c {
            let head = self.queue[c].load(R);
            self.current[c].store(if head.is_null() { empty() } else { head }, R);
        }
    }

    /// Page `p` of class `l` leaves this heap's queue: no class it leads points at it now.
    pub(super) fn drop_aliases(&self, l: usize, p: *mut Page) {
        for m in members(l) {
            if self.current[m].load(R) == p {
                self.current[m].store(empty(), R);
            }
        }
    }

    /// Whether `current[c]` aliases another class's page (debug checks, and walks over the
    /// current pages, which skip aliases).
    pub(super) fn is_alias(&self, c: usize) -> bool {
        let p = self.current[c].load(R);
        // SAFETY: as in `unalias`.
        p != empty() && usize::from(unsafe { &*p }.class.load(R)) != c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_halves_of_a_power_of_two_led_by_it() {
        for c in 0..CLASSES {
            let (l, s) = (leader(c), class_size(c));
            if s > SPARSE_MAX || s.is_power_of_two() {
                assert_eq!(l, c);
                continue;
            }
            assert!(class_size(l).is_power_of_two(), "class {c}");
            assert!(
                class_size(l) > s && class_size(l) < 2 * s,
                "class {c}: {s} → {l}"
            );
            assert!(members(l).contains(&c), "class {c} in the members of {l}");
        }
        assert_eq!(
            members(class_of_computed(64)),
            class_of_computed(40)..class_of_computed(64)
        );
        assert!(members(class_of_computed(16)).is_empty());
        assert!(members(class_of_computed(2048)).is_empty());
    }
}
