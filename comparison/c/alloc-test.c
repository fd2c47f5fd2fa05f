/* alloc-test: mimalloc-bench's `alloc-test` (bench/alloc-test, built with BENCH=4), run as
 * `alloc-test 1` and `alloc-test N` (at most 16 threads).
 *
 * Every thread owns 2^18 / T slots, half filled at the start; each of its 100 million steps
 * (x scale) picks a slot with an 80/20 (Pareto) distribution, most picks landing in a small
 * hot range, and frees what is there (summing its bytes first) or allocates 5 B - 1 KiB
 * (class c in 2..9 drawn with probability ~2^-(c-1), uniform inside it) and fills it.
 * Seed 41 in every thread, as the original.
 */
#include "common.h"

static size_t iters;

/* The original's generator: a xorshift variant returning the high 32 bits. */
static uint32_t next32(uint64_t *s) {
    uint64_t ret = *s * 0xd989bcacc137dcd5ull;
    *s ^= *s >> 11;
    *s ^= *s << 31;
    *s ^= *s >> 18;
    return (uint32_t)(ret >> 32);
}

static uint64_t next64(uint64_t *s) {
    uint64_t hi = next32(s);
    return hi << 32 | next32(s);
}

static size_t block_size(uint64_t r) {
    int c = __builtin_ctzll((r & 127) + 1) + 2;
    return (size_t)(((r >> 7) & ((1ull << c) - 1)) + 1 + (1ull << c));
}

/* Bucket k (probability P[k]) maps to a range of P[6 - k] of the slots. */
static const double P[7] = { 0.262144, 0.393216, 0.24576, 0.08192, 0.01536, 0.001536, 0.000064 };

struct slot { unsigned char *p; size_t size; };

static uint64_t release(struct slot *s) {
    uint64_t sum = 0;
    for (size_t i = 0; i < s->size; i++) sum += s->p[i];
    free(s->p);
    s->p = NULL;
    return sum;
}

static void fill(struct slot *s, uint64_t *rng) {
    s->size = block_size(next64(rng));
    s->p = xmalloc(s->size);
    memset(s->p, (unsigned char)s->size, s->size);
}

static uint64_t worker(int tid, void *ctx) {
    (void)tid;
    size_t n = (1u << 18) / (size_t)(intptr_t)ctx;
    double cum[7];
    size_t start[7], len[7], at = 0;
    double c = 0;
    for (int k = 0; k < 7; k++) {
        c += P[k];
        cum[k] = c;
        len[k] = (size_t)((double)n * P[6 - k]);
        if (!len[k]) len[k] = 1;
        start[k] = at;
        at += len[k];
    }
    uint64_t rng = 41, sum = 0;
    struct slot *slots = calloc(n, sizeof *slots);
    if (!slots) fail("out of memory");
    for (size_t i = 0; i < n / 32; i++) {
        uint32_t bits = next32(&rng);
        for (int j = 0; j < 32; j++)
            if (bits & (1u << j)) fill(&slots[i * 32 + (size_t)j], &rng);
    }
    for (size_t it = 0; it < iters; it++) {
        uint32_t r1 = next32(&rng), r2 = next32(&rng);
        double u = (double)r1 / (double)UINT32_MAX;
        int k = 0;
        while (k < 6 && u > cum[k]) k++;
        struct slot *s = &slots[(start[k] + r2 % len[k]) % n];
        if (s->p) sum += release(s);
        else fill(s, &rng);
    }
    for (size_t i = 0; i < n; i++)
        if (slots[i].p) sum += release(&slots[i]);
    free(slots);
    return sum;
}

static uint64_t run(int threads, double scale) {
    if (threads > 16) threads = 16;
    iters = scaled(100000000, scale);
    return run_threads(threads, worker, (void *)(intptr_t)threads);
}

int main(int argc, char **argv) { return bench_main(argc, argv, "alloc-test", 1, run); }
