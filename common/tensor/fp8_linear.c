/* FP8 linears of a bf16 run: quantize, the emulated FP8 product, bias (fp8_linear.h). */
#include "fp8_linear.h"

#include "fp8_matmul.h"
#include "number_formats.h"
#include "precision.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

static int fp8_on;
static fp8_recipe fp8_current = FP8_BLOCKWISE;
static fp8_training_format fp8_format_now = FP8_FORMAT_E4M3;
static int fp8_unscaled, fp8_local_amax, fp8_local_grad_amax;
static double fp8_outlier_factor = 1.0;
static int delayed_length = FP8_DEFAULT_HISTORY, delayed_margin = 0;
#define FP8_ROLES 3   /* activation, weight, output gradient: a history each per site */
static int generation;   /* each fp8_linear_use starts the histories afresh */
static _Thread_local int current_site;
static _Thread_local fp8_amax_reduce_fn amax_reduce;   /* NULL: one device */
static _Thread_local void *amax_ctx;

void fp8_linear_use(const fp8_recipe *recipe) {
    fp8_on = recipe != NULL;
    if (recipe) fp8_current = *recipe;
    __atomic_add_fetch(&generation, 1, __ATOMIC_SEQ_CST);
}

const char *fp8_linear_delayed(int history, int margin) {
    fp8_delayed probe;
    const char *why = fp8_delayed_init(&probe, history, margin);
    fp8_delayed_free(&probe);
    if (why) return why;
    delayed_length = history;
    delayed_margin = margin;
    return NULL;
}

void fp8_linear_site(int site) { current_site = site; }

static const char *const training_format_names[FP8_TRAINING_FORMATS] = {"e4m3", "hybrid"};

const char *fp8_training_format_name(fp8_training_format f) {
    return (unsigned)f < FP8_TRAINING_FORMATS ? training_format_names[f] : "?";
}

int fp8_training_format_parse(const char *name, fp8_training_format *out) {
    for (int f = 0; f < FP8_TRAINING_FORMATS; f++)
        if (name && strcmp(name, training_format_names[f]) == 0) {
            *out = (fp8_training_format)f;
            return 0;
        }
    return -1;
}

void fp8_linear_format(fp8_training_format f) { fp8_format_now = f; }

fp8_training_format fp8_linear_format_now(void) { return fp8_format_now; }

int fp8_linear_backward_active(void) {
    return fp8_on && fp8_format_now == FP8_FORMAT_HYBRID && current_site != FP8_NO_SITE;
}


void fp8_linear_test_local_amax(int on) { fp8_local_amax = on; }

void fp8_linear_test_local_grad_amax(int on) { fp8_local_grad_amax = on; }

int fp8_linear_active(fp8_recipe *recipe) {
    if (fp8_on && recipe) *recipe = fp8_current;
    return fp8_on;
}

void fp8_linear_test_unscaled(int on) { fp8_unscaled = on; }

/* ---- weights quantised before the product (ZeRO-3's FP8 all-gather) ---------------- */
enum { GIVEN_MAX = 8 };   /* two gathered blocks' four weights (a prefetch) */
static _Thread_local struct {
    const uint16_t *weight;
    const uint8_t *codes;
    const float *scales;
} given[GIVEN_MAX];

int fp8_linear_takes_given_weights(void) {
    return fp8_on && !fp8_unscaled && fp8_outlier_factor == 1.0;
}

int fp8_linear_give_weight(const uint16_t *weight, const uint8_t *codes, const float *scales) {
    for (int i = 0; i < GIVEN_MAX; i++)
        if (!given[i].weight) {
            given[i].weight = weight;
            given[i].codes = codes;
            given[i].scales = scales;
            return 1;
        }
    return 0;
}

void fp8_linear_forget_weight(const uint16_t *weight) {
    for (int i = 0; i < GIVEN_MAX; i++)
        if (given[i].weight == weight) given[i].weight = NULL;
}

static int given_of(const uint16_t *weight) {
    if (!fp8_linear_takes_given_weights()) return -1;
    for (int i = 0; i < GIVEN_MAX; i++)
        if (given[i].weight == weight) return i;
    return -1;
}

void fp8_linear_outliers(double factor) { fp8_outlier_factor = factor; }

void fp8_outliers_apply(float *x, float *w, int M, int N, int K, double factor) {
    static const int channels[FP8_OUTLIER_CHANNELS] = {5, 17, 40, 99};
    for (int c = 0; c < FP8_OUTLIER_CHANNELS && channels[c] < K; c++) {
        const int k = channels[c];
        for (int i = 0; i < M; i++) x[(size_t)i * K + k] *= (float)factor;
        for (int j = 0; w && j < N; j++) w[(size_t)j * K + k] /= (float)factor;
    }
}

const char *fp8_linear_recipe_check(fp8_recipe recipe, int ranks) {
    (void)ranks;   /* per-tensor recipes all-reduce their amax (fp8_linear_group) */
    return (unsigned)recipe < FP8_RECIPES ? NULL : "valid: delayed, tensorwise, rowwise, blockwise";
}

/* The calling thread's scratch: fp32 copies, codes, scales, the product's workspace;
 * held under a key whose destructor frees it when the thread ends. */
typedef struct {
    size_t floats, codes;
    float *f;
    uint8_t *c;
    /* delayed: an amax history per site and role, [sites][FP8_ROLES], of this generation */
    int sites, generation;
    fp8_delayed *history;
} fp8_scratch;

static void histories_free(fp8_scratch *s) {
    for (int i = 0; i < FP8_ROLES * s->sites; i++) fp8_delayed_free(&s->history[i]);
    free(s->history);
    s->history = NULL;
    s->sites = 0;
}

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p) {
    fp8_scratch *s = p;
    if (!s) return;
    histories_free(s);
    free(s->f);
    free(s->c);
    free(s);
}

static void scratch_make_key(void) { pthread_key_create(&scratch_key, scratch_free); }

static fp8_scratch *scratch_fit(size_t floats, size_t codes) {
    pthread_once(&scratch_once, scratch_make_key);
    fp8_scratch *s = pthread_getspecific(scratch_key);
    if (!s && (s = calloc(1, sizeof *s))) pthread_setspecific(scratch_key, s);
    if (s && floats > s->floats) {
        free(s->f);
        s->floats = (s->f = malloc(floats * sizeof(float))) ? floats : 0;
    }
    if (s && codes > s->codes) {
        free(s->c);
        s->codes = (s->c = malloc(codes)) ? codes : 0;
    }
    if (!s || !s->f || !s->c) {
        fprintf(stderr, "fp8_linear: out of memory for %zu floats\n", floats);
        exit(1);
    }
    return s;
}

void fp8_linear_group(fp8_amax_reduce_fn reduce, void *ctx) {
    amax_reduce = reduce;
    amax_ctx = ctx;
    pthread_once(&scratch_once, scratch_make_key);
    fp8_scratch *s = pthread_getspecific(scratch_key);
    if (s) histories_free(s);   /* a run starts: no amax from another */
}

void fp8_linear_release_thread(void) {
    pthread_once(&scratch_once, scratch_make_key);
    scratch_free(pthread_getspecific(scratch_key));
    pthread_setspecific(scratch_key, NULL);
}

/* q's shape and blocks for `role` under the run's recipe; storage set by the caller. */
static fp8_matrix shaped(fp8_role role, int rows, int cols) {
    fp8_matrix q = {.format = FP8_E4M3, .rows = rows, .cols = cols};
    fp8_recipe_blocks(fp8_current, role, rows, cols, &q.block_rows, &q.block_cols);
    return q;
}

/* The history of the current site's operand in `role`: made when the site is first seen
 * in this generation (the first step's only allocation), kept after. */
static fp8_delayed *history_at(fp8_scratch *s, int site, fp8_role role) {
    const int gen = __atomic_load_n(&generation, __ATOMIC_SEQ_CST);
    if (s->generation != gen) {
        histories_free(s);
        s->generation = gen;
    }
    site = site > 0 ? site : 0;
    if (site >= s->sites) {
        fp8_delayed *h = realloc(s->history, FP8_ROLES * (size_t)(site + 1) * sizeof *h);
        if (!h) abort();
        for (int i = FP8_ROLES * s->sites; i < FP8_ROLES * (site + 1); i++)
            if (fp8_delayed_init(&h[i], delayed_length, delayed_margin)) abort();
        s->history = h;
        s->sites = site + 1;
    }
    return &s->history[FP8_ROLES * site + (int)role];
}

static fp8_delayed *history_of(fp8_scratch *s, fp8_role role) {
    return history_at(s, current_site, role);
}

float fp8_linear_delayed_weight_scale(int site, float amax) {
    fp8_delayed *d = history_at(scratch_fit(1, 1), site, FP8_WEIGHT);
    const float scale = fp8_delayed_scale(d, FP8_E4M3, amax);
    fp8_delayed_record(d, amax);
    return scale;
}

/* A per-tensor operand's amax: an activation's or an output gradient's over the whole
 * batch, the max of the ranks' shares over the group (a weight is the same on every
 * rank: its own). */
static float tensor_amax(fp8_role role, const fp8_matrix *q, const float *x) {
    float amax;
    fp8_block_amax(x, q->rows, q->cols, q->rows, q->cols, &amax);
    if (role != FP8_WEIGHT && amax_reduce && !fp8_local_amax &&
        !(role == FP8_GRADIENT && fp8_local_grad_amax))
        amax = amax_reduce(amax_ctx, amax);
    return amax;
}

/* q's codes and scales for x under the run's recipe; delayed: from the site's history of
 * `role`, this amax recorded when `record` (backward's second look at a forward operand
 * reads the history the forward left, without recording again). */
static void quantize(fp8_scratch *s, fp8_role role, fp8_matrix *q, const float *x, int record) {
    const int per_tensor = fp8_current == FP8_DELAYED || fp8_current == FP8_TENSORWISE;
    if (per_tensor && !fp8_unscaled) {   /* one block: q->scales[0] */
        const float amax = tensor_amax(role, q, x);
        fp8_delayed *d = fp8_current == FP8_DELAYED ? history_of(s, role) : NULL;
        q->scales[0] = d ? fp8_delayed_scale(d, q->format, amax) : fp8_scale_for(q->format, amax, 0);
        fp8_quantize_with_scales(q, x);
        if (d && record) fp8_delayed_record(d, amax);
        return;
    }
    if (!fp8_unscaled) {
        fp8_quantize(q, x);
        return;
    }
    const size_t n = fp8_scale_count(q->rows, q->cols, q->block_rows, q->block_cols);
    for (size_t b = 0; b < n; b++) q->scales[b] = 1.0f;
    fp8_quantize_with_scales(q, x);
}

void fp8_linear_forward(uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                        const uint16_t *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    fp8_matrix x = shaped(FP8_ACTIVATION, N, IC), w = shaped(FP8_WEIGHT, OC, IC);
    const size_t nx = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
    const size_t sx = fp8_scale_count(N, IC, x.block_rows, x.block_cols);
    const size_t sw = fp8_scale_count(OC, IC, w.block_rows, w.block_cols);
    const size_t work = fp8_matmul_workspace(&x, &w);
    /* floats: x32 [N*IC] | w32 [OC*IC] | out32 [N*OC] | scales | workspace */
    fp8_scratch *scratch = scratch_fit(nx + nw + no + sx + sw + work, nx + nw);
    float *x32 = scratch->f, *w32 = x32 + nx, *o32 = w32 + nw;
    x.scales = o32 + no;
    w.scales = x.scales + sx;
    float *ws = w.scales + sw;
    x.codes = scratch->c;
    w.codes = scratch->c + nx;
    const int g = given_of(weight);   /* codes and scales gathered already */
    precision_bf16_to_f32(x32, inp, nx);
    if (g < 0) precision_bf16_to_f32(w32, weight, nw);
    if (fp8_outlier_factor != 1.0) fp8_outliers_apply(x32, w32, N, OC, IC, fp8_outlier_factor);
    quantize(scratch, FP8_ACTIVATION, &x, x32, 1);
    if (g >= 0) {
        memcpy(w.codes, given[g].codes, nw);
        memcpy(w.scales, given[g].scales, sw * sizeof *w.scales);
    } else {
        quantize(scratch, FP8_WEIGHT, &w, w32, 1);
    }
    const char *why = fp8_matmul(o32, &x, &w, ws);
    if (why) {   /* the recipes' blocks always nest: a caller's bug */
        fprintf(stderr, "fp8_linear_forward: %s\n", why);
        exit(1);
    }
    for (int i = 0; i < N; i++) {
        float *o = o32 + (size_t)i * OC;
        if (bias)
            for (int j = 0; j < OC; j++) o[j] += number_from_bf16(bias[j]);
    }
    precision_f32_to_bf16(out, o32, no);
}

/* x [rows, cols] replaced by its FP8 values, decode(encode(x * scale)) / scale, in
 * format f under the run's recipe for role. codes: rows * cols bytes; scales: enough. */
static void round_through(fp8_scratch *s, fp8_role role, fp8_format f, float *x, int rows,
                          int cols, uint8_t *codes, float *scales, int record) {
    fp8_matrix q = shaped(role, rows, cols);
    q.format = f;
    q.codes = codes;
    q.scales = scales;
    quantize(s, role, &q, x, record);
    fp8_dequantize(&q, x);
}

/* Backward of a hybrid run (fp8_linear.h). Each operand is rounded in its own layout,
 * [N, OC], [OC, IC], [N, IC], so a rank's blocks are the single device's (blocks run
 * along channels, never across the batch a rank shares); the products then multiply
 * those FP8 values (decode / scale) in fp32. A scale that varies along a product's
 * inner dimension (W's rows in dinp's, the tokens' in dweight's) cannot be taken out
 * of its sum, so each value carries its own: the same numbers an FP8 unit multiplies,
 * the fp32 sums in another order. */
void fp8_linear_backward(uint16_t *dinp, float *dweight, const uint16_t *dout,
                         const uint16_t *inp, const uint16_t *weight, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0 || IC <= 0 || (!dinp && !dweight)) return;
    const size_t ng = (size_t)N * OC, nw = (size_t)OC * IC, nx = (size_t)N * IC;
    size_t codes = ng > nw ? ng : nw;
    codes = codes > nx ? codes : nx;
    /* floats: g32 [N*OC] | w32 [OC*IC] | x32 [N*IC] (dinp's fp32 too) | scales */
    fp8_scratch *s = scratch_fit(ng + nw + nx + codes, codes);
    float *g32 = s->f, *w32 = g32 + ng, *x32 = w32 + nw, *scales = x32 + nx;
    precision_bf16_to_f32(g32, dout, ng);
    /* dY in E5M2: range before precision (its own scales and delayed history) */
    round_through(s, FP8_GRADIENT, FP8_E5M2, g32, N, OC, s->c, scales, 1);
    if (dinp) {   /* dinp [N, IC] = dY [N, OC] W [OC, IC], rounded to bf16 once */
        precision_bf16_to_f32(w32, weight, nw);
        round_through(s, FP8_WEIGHT, FP8_E4M3, w32, OC, IC, s->c, scales, 0);
        /* a row at a time: OpenBLAS sums a row of C by where it falls in the call's
           blocking (matmul16.c), and a last fp32 bit here, rounded to bf16 and then to
           the next linear's E5M2, would be a whole E5M2 step: one row a call gets a
           rank's rows the whole batch's bits */
        for (int i = 0; i < N; i++)
            cblas_sgemv(CblasRowMajor, CblasTrans, OC, IC, 1.0f, w32, IC, g32 + (size_t)i * OC,
                        1, 0.0f, x32 + (size_t)i * IC, 1);
        precision_f32_to_bf16(dinp, x32, nx);
    }
    if (dweight) {   /* dweight [OC, IC] += dY^T [OC, N] X [N, IC], in fp32 */
        precision_bf16_to_f32(x32, inp, nx);
        round_through(s, FP8_ACTIVATION, FP8_E4M3, x32, N, IC, s->c, scales, 0);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, g32, OC, x32,
                    IC, 1.0f, dweight, IC);
    }
}
