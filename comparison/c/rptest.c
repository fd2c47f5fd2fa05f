/* rptest: mimalloc-bench's `rptest` (bench/rptest, rpmalloc-benchmark), run as
 * `rptest T 0 1 2 500 1000 100 8 16000`: T threads, random sizes with a linear drop-off from 8
 * to 16000 bytes, a batch handed to another thread every 2 loops, 500 loops, 1000 live blocks
 * per thread, about 100 operations a loop. Here one allocation in 64 is a medium block of
 * 64 KiB to 1 MiB as well, and the calls are mixed: every third small block comes from
 * posix_memalign (16 or 64 bytes), one replacement in eight is a realloc of the block in place,
 * and malloc_usable_size is checked against every request.
 *
 * A loop frees blocks received from other threads, frees 24-80 of its own blocks (stepping
 * through the slots by 7), allocates 30-100 (stepping by 3, replacing what is there) and,
 * every second loop, allocates a batch of the same size for the next thread in turn. A
 * block's first word holds its size; one byte per 4 KiB page and its last byte are written.
 * The original runs 2 iterations of 500 loops; this one runs 20 (x scale) and is timed. A
 * thread that has finished frees no more batches: their senders do. The checksum is a sum over
 * everything freed (who frees a batch depends on scheduling).
 */
#include "common.h"

enum { SLOTS = 1000, LOOPS = 500, CROSS_RATE = 2, MIN_SIZE = 8, MAX_SIZE = 16000 };

struct batch { struct batch *next; size_t n; unsigned char *p[100]; };
struct mailbox { pthread_mutex_t lock; struct batch *head; int closed; };

static struct mailbox *boxes;
static int nthreads;
static size_t iterations;
static uint64_t freed_blocks, freed_bytes;

static size_t block_size(rng_t *r) {
    if (rng_next(r) % 64 == 0) return rng_range(r, 64 << 10, 1 << 20);
    size_t a = rng_next(r) % (MAX_SIZE - MIN_SIZE + 1), b = rng_next(r) % (MAX_SIZE - MIN_SIZE + 1);
    return MIN_SIZE + (a < b ? a : b); /* the smaller of two: density falls linearly */
}

static void touch(unsigned char *p, size_t size) {
    *(uint32_t *)p = (uint32_t)size;
    for (size_t page = 4096; page < size; page += 4096) p[page] = 1;
    p[size - 1] = 1;
}

static unsigned char *alloc_block(size_t size, size_t k) {
    void *p = NULL;
    size_t align = size < 4096 ? (size_t[]){ 0, 16, 64 }[k % 3] : 0;
    if (align ? posix_memalign(&p, align, size) != 0 : !(p = malloc(size))) fail("out of memory");
    if (align && (uintptr_t)p % align) fail("rptest: posix_memalign returned a misaligned block");
    if (malloc_usable_size(p) < size) fail("rptest: malloc_usable_size is below the request");
    touch(p, size);
    return p;
}

/* The size a block holds, checked against its last byte. */
static size_t check(const unsigned char *p) {
    size_t size = *(const uint32_t *)p;
    if (size < MIN_SIZE || size > (1 << 20) || p[size - 1] != 1)
        fail("rptest: a block was corrupted");
    return size;
}

static void release(unsigned char *p, uint64_t *blocks, uint64_t *bytes) {
    *bytes += check(p);
    *blocks += 1;
    free(p);
}

/* Free what `box` holds (closing it when `close`: later batches are freed by their sender). */
static void drain(struct mailbox *box, int close, uint64_t *blocks, uint64_t *bytes) {
    pthread_mutex_lock(&box->lock);
    struct batch *b = box->head;
    box->head = NULL;
    box->closed |= close;
    pthread_mutex_unlock(&box->lock);
    while (b) {
        struct batch *next = b->next;
        for (size_t i = 0; i < b->n; i++) release(b->p[i], blocks, bytes);
        free(b);
        b = next;
    }
}

static uint64_t worker(int tid, void *ctx) {
    (void)ctx;
    rng_t r = rng_new((uint64_t)tid + 1);
    unsigned char **slot = calloc(SLOTS, sizeof *slot);
    if (!slot) fail("out of memory");
    uint64_t blocks = 0, bytes = 0;
    size_t alloc_at = 0, free_at = 0, k = 0, sent = 0;
    for (size_t it = 0; it < iterations; it++) {
        for (size_t loop = 0; loop < LOOPS; loop++) {
            drain(&boxes[tid], 0, &blocks, &bytes);
            for (size_t n = rng_range(&r, 24, 80); n > 0; n--, free_at = (free_at + 7) % SLOTS) {
                if (slot[free_at]) release(slot[free_at], &blocks, &bytes);
                slot[free_at] = NULL;
            }
            size_t ops = rng_range(&r, 30, 100);
            for (size_t n = 0; n < ops; n++, alloc_at = (alloc_at + 3) % SLOTS) {
                size_t size = block_size(&r);
                unsigned char *old = slot[alloc_at];
                if (old && rng_next(&r) % 8 == 0) {
                    size_t was = check(old);
                    bytes += was;
                    unsigned char *p = realloc(old, size);
                    if (!p) fail("out of memory");
                    if (malloc_usable_size(p) < size)
                        fail("rptest: realloc returned a short block");
                    /* The first word and, if it grew, the old last byte are kept. */
                    if (*(uint32_t *)p != was || (size >= was && p[was - 1] != 1))
                        fail("rptest: realloc lost the contents");
                    touch(p, size);
                    slot[alloc_at] = p;
                } else {
                    if (old) release(old, &blocks, &bytes);
                    slot[alloc_at] = alloc_block(size, k++);
                }
            }
            if (nthreads > 1 && loop % CROSS_RATE == 0) {
                struct batch *b = xmalloc(sizeof *b);
                b->n = ops;
                for (size_t i = 0; i < ops; i++) b->p[i] = alloc_block(block_size(&r), k++);
                struct mailbox *to = &boxes[(tid + 1 + sent++ % (size_t)(nthreads - 1)) % nthreads];
                pthread_mutex_lock(&to->lock);
                int refused = to->closed;
                b->next = refused ? NULL : to->head;
                if (!refused) to->head = b;
                pthread_mutex_unlock(&to->lock);
                if (refused) drain(&(struct mailbox){ .head = b }, 0, &blocks, &bytes);
            }
        }
        for (size_t i = 0; i < SLOTS; i++) {
            if (slot[i]) release(slot[i], &blocks, &bytes);
            slot[i] = NULL;
        }
    }
    free(slot);
    drain(&boxes[tid], 1, &blocks, &bytes);
    __atomic_fetch_add(&freed_blocks, blocks, __ATOMIC_RELAXED);
    __atomic_fetch_add(&freed_bytes, bytes, __ATOMIC_RELAXED);
    return 0;
}

static uint64_t run(int threads, double scale) {
    nthreads = threads;
    iterations = scaled(20, scale);
    boxes = calloc((size_t)threads, sizeof *boxes);
    if (!boxes) fail("out of memory");
    for (int t = 0; t < threads; t++) pthread_mutex_init(&boxes[t].lock, NULL);
    run_threads(threads, worker, NULL);
    free(boxes);
    return mix(freed_blocks, freed_bytes);
}

int main(int argc, char **argv) { return bench_main(argc, argv, "rptest", 1, run); }
