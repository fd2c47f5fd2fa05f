/* common.h: what the C programs of comparison/c share.
 *
 * Each program re-writes one of mimalloc-bench's benchmarks as a whole C program that uses
 * only malloc, free, realloc, calloc, posix_memalign, malloc_usable_size and pthreads, so
 * that any allocator can be put under it with LD_PRELOAD. A program runs a fixed amount of
 * work (the originals mostly run for a fixed time) and prints one line, the one the Rust
 * runner (comparison/src/bin/compare.rs) reads from its own workloads too:
 *
 *   RESULT <allocator> <program> <threads> <seconds> <peak_kib> <final_kib> <checksum>
 *
 * <allocator> is $COMPARE_ALLOCATOR (the runner sets it), <seconds> the wall time of the
 * work, <peak_kib> VmHWM + HugetlbPages and <final_kib> VmRSS + HugetlbPages once the work
 * has freed everything (what the allocator keeps), both from /proc/self/status, and
 * <checksum> a function of what the work computed: equal under every allocator (each thread
 * draws from its own seeded generator; results that depend on scheduling are combined with
 * sums). A program exits with status 1 and a message when it finds its memory corrupted.
 *
 * With $COMPARE_SETTLE_MS set, the program then sleeps that long and reads VmRSS + HugetlbPages
 * again, printed after the checksum as "settled_kib=<KiB>" (what the allocator still holds
 * once its purge delay passed with the program idle).
 *
 * Arguments: [--threads N] [--scale F] (or a positional scale). N defaults to the cores,
 * F to 1 (the original's parameters); CI runs F = 0.01.
 */
#ifndef COMPARE_COMMON_H
#define COMPARE_COMMON_H

#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A small, fast generator (xorshift64*), the same as the Rust workloads' `Rng`. */
typedef struct { uint64_t s; } rng_t;

static inline rng_t rng_new(uint64_t seed) { return (rng_t){ seed * 0x9E3779B97F4A7C15ull | 1 }; }

static inline uint64_t rng_next(rng_t *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

/* Uniform in lo..=hi. */
static inline size_t rng_range(rng_t *r, size_t lo, size_t hi) {
    return lo + (size_t)(rng_next(r) % (hi - lo + 1));
}

/* Mix x into a running checksum (order matters: use it for per-thread results in thread
 * order, a plain sum for what threads hand each other). */
static inline uint64_t mix(uint64_t sum, uint64_t x) {
    uint64_t v = (sum ^ x) * 0x100000001B3ull;
    return (v << 5) | (v >> 59);
}

/* n scaled, at least 1. */
static inline size_t scaled(size_t n, double scale) {
    size_t v = (size_t)((double)n * scale);
    return v ? v : 1;
}

static void fail(const char *what) {
    fprintf(stderr, "%s\n", what);
    exit(1);
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) fail("out of memory");
    return p;
}

/* Run fn(tid, ctx) for tid 0..n-1 on n threads; their results mixed in tid order. */
typedef uint64_t (*worker_fn)(int tid, void *ctx);
struct job { worker_fn fn; int tid; void *ctx; uint64_t out; pthread_t th; };

static void *job_main(void *p) {
    struct job *j = p;
    j->out = j->fn(j->tid, j->ctx);
    return NULL;
}

static inline uint64_t run_threads(int n, worker_fn fn, void *ctx) {
    if (n < 1) fail("no threads");
    struct job *jobs = xmalloc(sizeof(struct job) * (size_t)n);
    for (int t = 0; t < n; t++) {
        jobs[t] = (struct job){ fn, t, ctx, 0, 0 };
        if (pthread_create(&jobs[t].th, NULL, job_main, &jobs[t])) fail("pthread_create failed");
    }
    uint64_t sum = 0;
    for (int t = 0; t < n; t++) {
        pthread_join(jobs[t].th, NULL);
        sum = mix(sum, jobs[t].out);
    }
    free(jobs);
    return sum;
}

/* A field of /proc/self/status in KiB (0 when absent). */
static uint64_t status_kib(const char *name) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t v = 0;
    size_t n = strlen(name);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, name, n)) v = strtoull(line + n, NULL, 10);
    if (f) fclose(f);
    return v;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Parse the arguments, run `run(threads, scale)`, print the RESULT line. `threads_per_core`
 * is what N is multiplied by (mimalloc-bench runs sh6bench with 2 threads per core), 0 for a
 * program that always runs one thread. */
static int bench_main(int argc, char **argv, const char *name, int threads_per_core,
                      uint64_t (*run)(int threads, double scale)) {
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    double scale = 1.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--scale") && i + 1 < argc) scale = strtod(argv[++i], NULL);
        else if (argv[i][0] != '-') scale = strtod(argv[i], NULL);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--scale F]\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1 || !(scale > 0)) fail("threads and scale must be positive");
    threads = threads_per_core ? threads * threads_per_core : 1;
    const char *alloc = getenv("COMPARE_ALLOCATOR");
    double start = now();
    uint64_t checksum = run((int)threads, scale);
    double secs = now() - start;
    uint64_t huge = status_kib("HugetlbPages:");
    uint64_t final_kib = status_kib("VmRSS:") + huge;
    uint64_t peak_kib = status_kib("VmHWM:") + huge;
    const char *settle = getenv("COMPARE_SETTLE_MS");
    long settle_ms = settle ? strtol(settle, NULL, 10) : 0;
    char settled[64] = "";
    if (settle_ms > 0) {
        struct timespec ts = {settle_ms / 1000, (settle_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        snprintf(settled, sizeof settled, " settled_kib=%llu",
                 (unsigned long long)(status_kib("VmRSS:") + status_kib("HugetlbPages:")));
    }
    printf("RESULT %s %s %ld %.6f %llu %llu %016llx%s\n", alloc ? alloc : "c", name, threads, secs,
           (unsigned long long)peak_kib, (unsigned long long)final_kib,
           (unsigned long long)checksum, settled);
    return 0;
}

#endif
