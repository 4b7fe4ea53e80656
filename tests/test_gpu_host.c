/* The GPU path's rules that a CPU can check, in every build (no GPU needed):
 *
 *  - TF32 tolerance: the error that TF32's input rounding alone gives in linear at
 *    test_gpu_ops.c's shapes, simulated here (10 of 23 mantissa bits kept, rounded to
 *    nearest and, the worse case, truncated), must stay below that suite's TF32
 *    tolerance (2e-3). Negative control: keeping 7 bits (bfloat16) must exceed it.
 *  - Copies with memmove semantics (gpu/overlap.h): the rule that sends overlapping
 *    copies through a staging buffer, run here with host copies, must give memmove's
 *    bytes for every shift; negative control: a plain forward copy must not.
 *  - Grid limits (gpu/grid_limits.h): the column sums' grid never passes 65535 block
 *    rows and still visits every row chunk exactly once, up to 2^31 - 1 rows; negative
 *    control: one block row per chunk (the former shape) passes 65535 at 8.4M rows.
 *  - The device allocator's cache (gpu/block_cache.h): best fit on the same GPU, never
 *    a block more than twice the size asked for, findable by pointer, drained per GPU;
 *    a ZeRO-like step (the same buffers allocated and freed every step) allocates only
 *    in its first step. Negative control: without the cache every step allocates.
 *  - The run header on a machine without a usable GPU: a GPU=1 build says "no GPU
 *    visible: running on the CPU" with CUDA's reason; a CPU build, which never looks
 *    for one, says plain "device: cpu;" (the control that the note is not always there).
 *  - The device script's rules (gpu/check.sh --self-test): how exit statuses and SKIP
 *    lines become verdicts, among them the negative control that a skip while a GPU
 *    is seen is a failure, and how the benchmark ratios are formed.
 *
 * Each check prints the largest difference it saw. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gpu/block_cache.h"
#include "../gpu/grid_limits.h"
#include "../gpu/overlap.h"
#include "check_run.h"
#include "cli.h"
#include "comm.h"
#include "device.h"
#include "rng.h"

/* ---- TF32 input rounding ------------------------------------------------------------ */

#define TOL_TF32 2e-3   /* tests/test_gpu_ops.c */

/* x with only `bits` of its 23 mantissa bits: rounded to nearest (ties away, as the
 * tensor cores' conversion) or truncated. */
static float keep_mantissa(float x, int bits, int truncate) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const int drop = 23 - bits;
    const uint32_t mask = ((uint32_t)1 << drop) - 1;
    if (!truncate) u += (uint32_t)1 << (drop - 1);
    u &= ~mask;
    float y;
    memcpy(&y, &u, sizeof y);
    return y;
}

static float *uniform(size_t n, uint64_t stream) {
    float *x = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(2.0 * rng_uniform(7, stream, i) - 1.0);
    return x;
}

/* C[M,N] = A[M,K] B[K,N] (row strides lda, ldb) with A and B first cut to `bits`
 * mantissa bits (bits 23: exact), summed in double: what is left is the rounding of
 * the inputs. Returns max |C_bits - C_exact| / max |C_exact|. */
static double product_error(const float *A, size_t a_row, size_t a_col, const float *B,
                            size_t b_row, size_t b_col, int M, int N, int K, int bits,
                            int truncate) {
    double worst = 0.0, scale = 0.0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double exact = 0.0, cut = 0.0;
            for (int k = 0; k < K; k++) {
                const float a = A[m * a_row + k * a_col], b = B[k * b_row + n * b_col];
                exact += (double)a * b;
                cut += (double)keep_mantissa(a, bits, truncate) * keep_mantissa(b, bits, truncate);
            }
            const double d = fabs((double)(float)cut - exact);
            if (d > worst) worst = d;
            if (fabs(exact) > scale) scale = fabs(exact);
        }
    return worst / scale;
}

/* The worst of linear's three products at one shape: out = inp W^T, dinp = dout W,
 * dweight = dout^T inp (inp [N,IC], W [OC,IC], dout [N,OC]). */
static double linear_error(int N, int IC, int OC, int bits, int truncate) {
    float *inp = uniform((size_t)N * IC, 1), *w = uniform((size_t)OC * IC, 2),
          *dout = uniform((size_t)N * OC, 3);
    double e = product_error(inp, IC, 1, w, 1, IC, N, OC, IC, bits, truncate);
    double e2 = product_error(dout, OC, 1, w, IC, 1, N, IC, OC, bits, truncate);
    double e3 = product_error(dout, 1, OC, inp, IC, 1, OC, IC, N, bits, truncate);
    free(inp), free(w), free(dout);
    return fmax(e, fmax(e2, e3));
}

static double tf32_shapes_error(int bits, int truncate) {
    return fmax(linear_error(111, 72, 200, bits, truncate),
                linear_error(256, 384, 128, bits, truncate));
}

START_TEST(tf32_rounding_fits_the_tolerance) {
    const double nearest = tf32_shapes_error(10, 0), truncated = tf32_shapes_error(10, 1);
    printf("  TF32 inputs, rounded to nearest: rel error %.3e; truncated: %.3e"
           " (tolerance %.0e; the former 1e-03 left %.0f%% headroom)\n",
           nearest, truncated, TOL_TF32, 100.0 * (1.0 - truncated / 1e-3));
    ck_assert_msg(truncated < TOL_TF32, "TF32 rounding alone gives %.3e >= %.0e",
                  truncated, TOL_TF32);
    ck_assert_msg(nearest <= truncated, "rounding to nearest %.3e worse than truncating %.3e",
                  nearest, truncated);
}
END_TEST

START_TEST(bf16_rounding_exceeds_the_tolerance) {
    /* negative control: the same check with 7 mantissa bits must fail */
    const double bf16 = tf32_shapes_error(7, 0);
    printf("  negative control, bfloat16 inputs (7 bits): rel error %.3e (must exceed %.0e)\n",
           bf16, TOL_TF32);
    ck_assert_msg(bf16 > TOL_TF32, "7-bit inputs give only %.3e", bf16);
}
END_TEST

/* ---- copies with memmove semantics ------------------------------------------------- */

/* What comm_cuda_copy and cuda_vec_copy do, with host copies standing in for CUDA's. */
static void staged_copy(unsigned char *dst, const unsigned char *src, size_t bytes,
                        unsigned char *stage) {
    if (bytes == 0 || dst == src) return;
    if (ranges_overlap(dst, src, bytes)) {
        memcpy(stage, src, bytes);
        src = stage;
    }
    memcpy(dst, src, bytes);
}

/* A copy that ignores overlap, byte by byte forward: what an undefined copy may do. */
static void forward_copy(unsigned char *dst, const unsigned char *src, size_t bytes,
                         unsigned char *stage) {
    (void)stage;
    for (size_t i = 0; i < bytes; i++) dst[i] = src[i];
}

typedef void (*copy_fn)(unsigned char *, const unsigned char *, size_t, unsigned char *);

/* Shifts of -64..64 bytes of a 100-byte range inside 256 bytes: how many differ from
 * memmove. */
static int shifts_unlike_memmove(copy_fn copy) {
    enum { SIZE = 256, LEN = 100, BASE = 78 };
    unsigned char want[SIZE], got[SIZE], stage[SIZE];
    int differing = 0;
    for (int shift = -64; shift <= 64; shift++) {
        for (int i = 0; i < SIZE; i++) want[i] = got[i] = (unsigned char)(i * 7 + 3);
        memmove(want + BASE + shift, want + BASE, LEN);
        copy(got + BASE + shift, got + BASE, LEN, stage);
        if (memcmp(want, got, SIZE) != 0) differing++;
    }
    return differing;
}

START_TEST(overlapping_copies_behave_as_memmove) {
    unsigned char buf[64];
    ck_assert(!ranges_overlap(buf, buf, 10));        /* the same range: nothing to do */
    ck_assert(!ranges_overlap(buf + 10, buf, 10));   /* adjacent */
    ck_assert(!ranges_overlap(buf, buf + 10, 10));
    ck_assert(ranges_overlap(buf + 9, buf, 10));
    ck_assert(ranges_overlap(buf, buf + 9, 10));
    ck_assert(!ranges_overlap(buf + 1, buf, 0));
    const int staged = shifts_unlike_memmove(staged_copy);
    const int forward = shifts_unlike_memmove(forward_copy);
    printf("  copies unlike memmove over 129 shifts: staged %d; negative control, plain"
           " forward copy %d (must be > 0)\n", staged, forward);
    ck_assert_int_eq(staged, 0);
    ck_assert_int_gt(forward, 0);
}
END_TEST

/* ---- grid limits ----------------------------------------------------------------------- */

/* Walks the kernel's loop (block row y: chunks y, y + grid_y, ...) and checks that it
 * visits chunks 0..chunks-1 once each, in increasing order per block row. */
static int grid_covers(size_t chunks, unsigned grid_y) {
    size_t visited = 0;
    for (size_t y = 0; y < grid_y; y++)
        for (size_t chunk = y; chunk < chunks; chunk += grid_y) visited++;
    /* distinct by construction (chunk = y mod grid_y), so the count settles it */
    return visited == chunks;
}

START_TEST(column_sums_grid_stays_within_limits) {
    static const size_t rows[] = {1, 127, 128, 129, 8388480, 8388481, 50000000,
                                  2147483647};
    unsigned largest = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const size_t chunks = column_chunks(rows[i]);
        const unsigned grid_y = column_grid_y(chunks);
        if (grid_y > largest) largest = grid_y;
        ck_assert_msg(grid_y >= 1 && grid_y <= CUDA_GRID_Y_MAX, "%zu rows: grid y %u",
                      rows[i], grid_y);
        ck_assert_msg(grid_covers(chunks, grid_y), "%zu rows: chunks not covered once",
                      rows[i]);
    }
    /* negative control: one block row per chunk, as before */
    const size_t old_grid_y = column_chunks(8388481);
    printf("  column sums up to 2^31-1 rows: grid y at most %u (limit %u); negative"
           " control, one block row per chunk at 8388481 rows: %zu\n",
           largest, CUDA_GRID_Y_MAX, old_grid_y);
    ck_assert_uint_gt(old_grid_y, CUDA_GRID_Y_MAX);
}
END_TEST

/* ---- the device allocator's cache ------------------------------------------------ */

/* What cuda_device_malloc / cuda_device_free do with the cache, with host memory
 * standing in for device memory; counts the allocations the cache could not serve. */
typedef struct {
    block_cache cache;
    int use_cache;
    int allocations;
} fake_device;

static void *fake_malloc(fake_device *d, int gpu, size_t bytes) {
    cached_block *b = d->use_cache ? block_cache_take(&d->cache, gpu, bytes) : NULL;
    if (!b) {
        b = calloc(1, sizeof *b);
        b->capacity = block_cache_round(bytes);
        b->ptr = malloc(b->capacity);
        b->gpu = gpu;
        d->allocations++;
    }
    block_cache_track(&d->cache, b);
    return b->ptr;
}

static void fake_free(fake_device *d, void *ptr) {
    cached_block *b = block_cache_release(&d->cache, ptr);
    ck_assert_ptr_nonnull(b);
    if (d->use_cache) {
        block_cache_keep(&d->cache, b);
        return;
    }
    free(b->ptr);
    free(b);
}

static void fake_device_free_all(fake_device *d) {
    for (cached_block *b = block_cache_drain(&d->cache, 0), *next; b; b = next) {
        next = b->next;
        free(b->ptr);
        free(b);
    }
}

/* Ten steps of a ZeRO-like loop: per-slab gradient buffers and a comm scratch,
 * allocated and freed every step. Returns the allocations made. */
static int zero_like_steps(int use_cache) {
    static const size_t sizes[] = {4 * 197376, 4 * 197376, 4 * 197376, 4 * 65536, 4 * 1000};
    enum { BUFFERS = sizeof sizes / sizeof sizes[0], STEPS = 10 };
    fake_device d = {.use_cache = use_cache};
    for (int step = 0; step < STEPS; step++) {
        void *live[BUFFERS];
        for (int i = 0; i < BUFFERS; i++) live[i] = fake_malloc(&d, 0, sizes[i]);
        for (int i = BUFFERS - 1; i >= 0; i--) fake_free(&d, live[i]);
    }
    fake_device_free_all(&d);
    return d.allocations;
}

START_TEST(device_cache_reuses_blocks_that_fit) {
    fake_device d = {.use_cache = 1};
    void *a = fake_malloc(&d, 0, 1000), *big = fake_malloc(&d, 0, 4096),
         *other_gpu = fake_malloc(&d, 1, 1000);
    ck_assert_ptr_null(block_cache_release(&d.cache, (char *)a + 1));   /* not handed out */
    fake_free(&d, a);
    fake_free(&d, big);
    fake_free(&d, other_gpu);
    ck_assert_uint_eq(d.cache.idle_bytes, 1024 + 4096 + 1024);
    /* best fit on the same GPU: the 1024-byte block of GPU 0 */
    ck_assert_ptr_eq(fake_malloc(&d, 0, 900), a);
    /* 4096 bytes are more than twice 1024: a new block, the big one stays idle */
    void *small = fake_malloc(&d, 0, 700);
    ck_assert_ptr_ne(small, big);
    ck_assert_int_eq(d.allocations, 4);
    ck_assert_ptr_eq(fake_malloc(&d, 0, 2048), big);   /* 4096 <= 2 x 2048 */
    /* draining GPU 0 leaves GPU 1's block */
    fake_free(&d, a);
    fake_free(&d, small);
    fake_free(&d, big);
    fake_device_free_all(&d);
    ck_assert_uint_eq(d.cache.idle_bytes, 1024);
    ck_assert_ptr_eq(fake_malloc(&d, 1, 1000), other_gpu);
    fake_free(&d, other_gpu);
    cached_block *left = block_cache_drain(&d.cache, 1);
    ck_assert_ptr_nonnull(left);
    free(left->ptr);
    free(left);

    const int cached = zero_like_steps(1), uncached = zero_like_steps(0);
    printf("  device allocations over 10 ZeRO-like steps of 5 buffers: cached %d;"
           " negative control, no cache %d\n", cached, uncached);
    ck_assert_int_eq(cached, 5);
    ck_assert_int_eq(uncached, 50);
}
END_TEST

/* ---- the run header without a GPU ---------------------------------------------------- */

START_TEST(header_says_why_there_is_no_gpu) {
    comm_options opts = comm_options_default();
    opts.ranks = 2;
    opts.device = device_resolve(DEVICE_AUTO);
    char header[320], why[160];
    launch_describe(&opts, 2, header, sizeof header);
    printf("  %s\n", header);
    if (device_gpu_count() > 0) {   /* a GPU machine: the header names it */
        ck_assert_msg(strstr(header, "device: cuda") != NULL, "%s", header);
    } else if (device_gpu_backend()) {
        ck_assert_msg(strstr(header, "no GPU visible: running on the CPU") != NULL, "%s",
                      header);
        ck_assert_msg(strstr(header, device_no_gpu_reason(why, sizeof why)) != NULL,
                      "%s: no reason", header);
        /* in words a student knows, not only the runtime's "driver version is
         * insufficient", which reads as "upgrade" where no driver is installed */
        ck_assert_msg(strstr(why, "no NVIDIA GPU driver") || strstr(why, "sees no GPU") ||
                          strstr(why, "cannot use a GPU"), "%s: CUDA's words only", why);
    } else {
        ck_assert_msg(strncmp(header, "device: cpu;", 12) == 0, "%s", header);
    }
}
END_TEST

/* device_check, which the command line asks before any rank starts: cpu and auto are
 * always there; cuda only with a GPU build that sees a GPU, else the one line saying
 * which of the two is missing (the control: a GPU machine gets NULL for cuda too). */
START_TEST(device_check_names_what_is_missing) {
    char why[256];
    ck_assert(device_check(DEVICE_CPU, why, sizeof why) == NULL);
    ck_assert(device_check(DEVICE_AUTO, why, sizeof why) == NULL);
    const char *cuda = device_check(DEVICE_CUDA, why, sizeof why);
    printf("  %s\n", cuda ? cuda : "--device cuda: fine, a GPU is visible");
    if (device_gpu_count() > 0) ck_assert(cuda == NULL);
    else if (device_gpu_backend())
        ck_assert(cuda && strstr(cuda, "--device cuda: no GPU is visible to this process"));
    else
        ck_assert(cuda && strcmp(cuda, "--device cuda: this build has no GPU support (build"
                                       " with GPU=1, or use --device cpu)") == 0);
}
END_TEST

/* ---- the device script's own rules ------------------------------------------------ */

/* The repository root: this program is <root>/build/<variant>/tests/test_gpu_host. */
static void repository_root(char *out, size_t size) {
    ssize_t n = readlink("/proc/self/exe", out, size - 1);
    ck_assert_msg(n > 0, "cannot read /proc/self/exe");
    out[n] = '\0';
    for (int up = 0; up < 4; up++) {
        char *slash = strrchr(out, '/');
        ck_assert_ptr_nonnull(slash);
        *slash = '\0';
    }
}

START_TEST(device_script_rules_hold) {
    char root[4096], command[4200 + 64];
    repository_root(root, sizeof root - 64);
    snprintf(command, sizeof command, "'%s/gpu/check.sh' --self-test", root);
    FILE *p = popen(command, "r");
    ck_assert_ptr_nonnull(p);
    char line[512], last[512] = "";
    while (fgets(line, sizeof line, p)) {
        if (strncmp(line, "WRONG", 5) == 0) printf("  %s", line);
        snprintf(last, sizeof last, "%s", line);
    }
    const int status = pclose(p);
    printf("  gpu/check.sh --self-test: %s", last);
    fflush(stdout);
    ck_assert_msg(status == 0, "gpu/check.sh --self-test: %s", last);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("gpu_host");
    TCase *tf32 = tcase_create("tf32_tolerance");
    tcase_set_timeout(tf32, 60);
    tcase_add_test(tf32, tf32_rounding_fits_the_tolerance);
    tcase_add_test(tf32, bf16_rounding_exceeds_the_tolerance);
    suite_add_tcase(suite, tf32);
    TCase *rules = tcase_create("device_rules");
    tcase_set_timeout(rules, 60);   /* the device script's self-test: a few seconds */
    tcase_add_test(rules, overlapping_copies_behave_as_memmove);
    tcase_add_test(rules, column_sums_grid_stays_within_limits);
    tcase_add_test(rules, device_cache_reuses_blocks_that_fit);
    tcase_add_test(rules, device_script_rules_hold);
    tcase_add_test(rules, header_says_why_there_is_no_gpu);
    tcase_add_test(rules, device_check_names_what_is_missing);
    suite_add_tcase(suite, rules);
    return check_run(suite, 0);
}
