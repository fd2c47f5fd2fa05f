/* sh6bench: mimalloc-bench's `sh6bench` (MicroQuill's SmartHeap benchmark, patched by
 * mimalloc-bench: call count 10000, blocks of 1 to 1000 bytes), run as `sh6bench 2*P`: two
 * threads per core (`--threads N` runs 2N).
 *
 * Each thread keeps a ring of 10000 / T block pointers and repeats, 10000 / T times (x scale):
 * for sizes stepping up 1, 2, 4, 7, 11, ... (x 3/2 + 1) below 1000, and each halved down to 1,
 * allocate 250 blocks of each size below 100 bytes and 50 of the others into the ring, writing
 * their first and last byte. When the ring is full, a fifth of it is kept for one more cycle
 * and the rest freed: the part below the kept fifth in allocation order, the part above it in
 * reverse; the next cycle's allocations skip over the kept fifth. The original leaks the kept
 * fifth at the end; this one frees it.
 */
#include "common.h"

static size_t ring_len, repeats;

struct ring { unsigned char **p; unsigned *size; uint64_t sum; };

static void release(struct ring *r, size_t i) {
    unsigned char *b = r->p[i];
    unsigned s = r->size[i];
    if (b[0] != (unsigned char)s || b[s - 1] != (unsigned char)s)
        fail("sh6bench: a block was corrupted");
    r->sum += s;
    free(b);
    r->p[i] = NULL;
}

static uint64_t worker(int tid, void *ctx) {
    (void)tid, (void)ctx;
    size_t n = ring_len, mp = 0, keep_start = n, keep_end = n;
    struct ring r = { calloc(n, sizeof(char *)), calloc(n, sizeof(unsigned)), 0 };
    if (!r.p || !r.size) fail("out of memory");
    for (size_t rep = 0; rep < repeats; rep++) {
        for (unsigned base = 1; base < 1000; base = base * 3 / 2 + 1) {
            for (unsigned size = base; size >= 1; size /= 2) {
                for (int it = size < 100 ? 250 : 50; it > 0; it--) {
                    unsigned char *b = r.p[mp] = xmalloc(size);
                    r.size[mp] = size;
                    b[0] = b[size - 1] = (unsigned char)size;
                    if (++mp == keep_start) mp = keep_end;
                    if (mp < n) continue;
                    /* The ring is full: keep the next fifth, free the rest. */
                    keep_start = keep_end < n ? keep_end : 0;
                    keep_end = keep_start + n / 5 < n ? keep_start + n / 5 : n;
                    for (size_t i = 0; i < keep_start; i++) release(&r, i);
                    for (size_t i = n; i > keep_end; i--) release(&r, i - 1);
                    mp = keep_start == 0 ? keep_end : 0;
                }
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        if (r.p[i]) release(&r, i);
    free(r.p);
    free(r.size);
    return r.sum;
}

static uint64_t run(int threads, double scale) {
    ring_len = 10000 / (size_t)threads;
    if (ring_len < 10) ring_len = 10;
    repeats = scaled(ring_len, scale);
    return run_threads(threads, worker, NULL);
}

int main(int argc, char **argv) { return bench_main(argc, argv, "sh6bench", 2, run); }
