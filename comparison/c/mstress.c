/* mstress: mimalloc-bench's `mstress` (bench/mstress, mimalloc's test-stress), run as
 * `mstress T 50 25`: T threads, scale 50, 25 rounds.
 *
 * Each round runs T threads (the original runs thread 0 on main), each allocating
 * 100 x 50 x (tid % 8 + 1) (x scale) items with calloc: 1-16 words (freed soon) or 1-64 words
 * (retained to the end), 1% of them x100, x1000 or x10000 larger. Two thirds of the time a random short-lived item
 * is freed; a quarter of the time one is swapped with one of 1000 shared transfer slots, so
 * items move between threads and rounds. Every item is checked to be zeroed, filled when
 * allocated and checked word by word when freed. Half the transfer slots are emptied after
 * each round, all after the last. The checksum is the words freed (a sum over the threads:
 * who frees a transferred item depends on scheduling, that it is freed does not).
 */
#include "common.h"

enum { TRANSFERS = 1000 };
static const uint64_t COOKIE = 0xbf58476d1ce4e5b9ull;

static uint64_t *transfer[TRANSFERS];
static size_t items_per_thread;
static uint64_t words;

/* The original's generator: a splitmix64 finaliser. */
static uint64_t pick(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return *s = x;
}

static int chance(uint64_t *s, unsigned percent) { return pick(s) % 100 <= percent; }

/* n words, word i holding (n - i) ^ COOKIE (so word 0 gives n back). */
static uint64_t *alloc_items(size_t n, uint64_t *r) {
    if (chance(r, 1)) n *= chance(r, 1) ? 10000 : chance(r, 10) ? 1000 : 100;
    if (n == 40) n++; /* the original avoids the size pthreads uses for stacks */
    uint64_t *p = calloc(n, sizeof *p);
    if (!p) fail("out of memory");
    for (size_t i = 0; i < n; i++) {
        if (p[i]) fail("mstress: calloc returned memory that is not zeroed");
        p[i] = (n - i) ^ COOKIE;
    }
    return p;
}

static uint64_t free_items(uint64_t *p) {
    if (!p) return 0;
    size_t n = p[0] ^ COOKIE;
    for (size_t i = 0; i < n; i++)
        if (p[i] != ((n - i) ^ COOKIE)) fail("mstress: memory corruption in an item");
    free(p);
    return n;
}

static uint64_t stress(int tid, void *ctx) {
    (void)ctx;
    uint64_t r = ((uint64_t)tid + 1) * 43, freed = 0;
    size_t allocs = items_per_thread * (size_t)(tid % 8 + 1), retain = allocs / 2;
    size_t cap = allocs + 1, top = 0, kept = 0;
    uint64_t **data = calloc(cap, sizeof *data), **retained = calloc(retain + 1, sizeof *data);
    if (!data || !retained) fail("out of memory");
    while (allocs > 0 || retain > 0) {
        if (retain == 0 || (chance(&r, 50) && allocs > 0)) {
            data[top++] = alloc_items((size_t)1 << (pick(&r) % 5), &r);
            allocs--;
        } else {
            retained[kept++] = alloc_items((size_t)1 << (pick(&r) % 7), &r);
            retain--;
        }
        if (chance(&r, 66) && top > 0) {
            size_t i = pick(&r) % top;
            freed += free_items(data[i]);
            data[i] = NULL;
        }
        if (chance(&r, 25) && top > 0) {
            size_t i = pick(&r) % top, t = pick(&r) % TRANSFERS;
            data[i] = __atomic_exchange_n(&transfer[t], data[i], __ATOMIC_ACQ_REL);
        }
    }
    for (size_t i = 0; i < kept; i++) freed += free_items(retained[i]);
    for (size_t i = 0; i < top; i++) freed += free_items(data[i]);
    free(data);
    free(retained);
    __atomic_fetch_add(&words, freed, __ATOMIC_RELAXED);
    return 0;
}

static uint64_t run(int threads, double scale) {
    items_per_thread = scaled(100 * 50, scale);
    uint64_t r = 43 * 43;
    const int rounds = 25;
    for (int round = 0; round < rounds; round++) {
        run_threads(threads, stress, NULL);
        for (int t = 0; t < TRANSFERS; t++) {
            if (chance(&r, 50) || round == rounds - 1) {
                words += free_items(transfer[t]);
                transfer[t] = NULL;
            }
        }
    }
    return mix(0, words);
}

int main(int argc, char **argv) { return bench_main(argc, argv, "mstress", 1, run); }
