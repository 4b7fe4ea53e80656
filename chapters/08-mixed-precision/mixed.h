/* Chapter 8's parts: where the bytes per parameter come from (bytes), what 16 bits do
 * to the matmul and the step (speed), to the loss (accuracy) and to the wire (wire).
 * Every part measures through the library's strategies (zero_launch, ddp_launch,
 * tp_launch, baseline_train) and formats; it owns no training code.
 *
 * Under mpirun every process calls the *_launches functions (the collective runs);
 * the *_local functions train on world rank 0's process alone (one-rank baselines),
 * and only that process prints. */
#ifndef MIXED_H
#define MIXED_H
#include <stdio.h>

#include "data.h"
#include "fp8_scaling.h"
#include "run_config.h"
#include "zero_train.h"

/* The precisions a part compares, in table order. */
typedef struct {
    const char *label;   /* "fp32", "bf16", "bf16 fp32-grads", ... */
    precision p, grads;
    int no_loss_scale;
} precision_case;

/* ---- part 1-2: bytes ------------------------------------------------------------------ */
#define BYTES_CASES 4      /* fp32, bf16 with fp32 gradients, bf16, fp16 */
#define BYTES_STEPS 3
typedef struct {
    size_t num_params;
    int ranks;
    /* stage 0 (DDP) of each case: model state held (params, grads, optimizer), the
     * gradients', activations' and communication buffers' peaks, bytes sent per step */
    double state[BYTES_CASES][3], grads_peak[BYTES_CASES], activations[BYTES_CASES];
    double comm_buffers[BYTES_CASES];
    double sent[BYTES_CASES];
    /* ZeRO stages 0-3 in fp32 and in bf16 with bf16 gradients (the paper's storage):
     * model state held by the largest rank, and what uneven shards add */
    double zero_state[2][ZERO_STAGES], zero_padding[2][ZERO_STAGES];
} bytes_report;

extern const precision_case bytes_cases[BYTES_CASES];
/* The formula's bytes per parameter for a case: params, grads, optimizer. */
void bytes_formula_per_param(const precision_case *c, double out[3]);
/* The ZeRO paper's Table 1 with K = 12 for a stage (bytes per rank), and this
 * program's fp32 storage (4 + 4 + 8 sharded the same way). */
double bytes_paper_k12(int stage, size_t P, int N);
/* The grads tag's peak at stage 0 (bytes per rank): fp32 gradients accumulate in place
 * (what is held); 16-bit ones add backward's fp32 working copies of the tied
 * embedding's slab and one other (AdamW widens a chunk at a time, adding nothing). */
double bytes_grads_peak(const precision_case *c, const gpt_config *model);
double bytes_fp32_stored(int stage, size_t P, int N);
int bytes_launches(const run_config *cfg, const dataset *data, bytes_report *r);
void bytes_print(const bytes_report *r);
void bytes_json(FILE *o, const bytes_report *r);

/* ---- part 3: speed -------------------------------------------------------------------- */
#define SPEED_SHAPES 5
typedef struct {
    int M, N, K;
    const char *what;
    double gflops[PRECISION_COUNT];
} speed_shape;
typedef struct {
    speed_shape shapes[SPEED_SHAPES];
    const char *blas_kernel;
    char kernel16[PRECISION_COUNT][128];   /* matmul16_impl at the step's first shape */
    int native_bf16;                       /* the CPU multiplies bf16 itself */
    /* ms per step: [0] one rank (the baseline), [1] cfg's ranks (DDP) */
    double step_ms[2][PRECISION_COUNT];
    int ranks;
} speed_report;

int speed_launches(const run_config *cfg, const dataset *data, speed_report *r);
/* The kernels of r->shapes[0]'s product in each precision, and whether bf16's is native */
void speed_kernels(speed_report *r);
void speed_local(const run_config *cfg, const dataset *data, speed_report *r);
void speed_print(const speed_report *r);
void speed_json(FILE *o, const speed_report *r);

/* ---- part 4: accuracy ----------------------------------------------------------------- */
#define ACCURACY_CASES 4   /* fp32, bf16, fp16 with loss scale, fp16 without */
typedef struct {
    int steps;
    float *loss[ACCURACY_CASES];          /* [steps] */
    float *loss_scale;                    /* [steps], fp16 with its scale */
    int skipped[ACCURACY_CASES];
    int skipped_after_warmup;             /* fp16 scaled, after the warm-up steps */
    double final_scale;
    double max_param_diff[ACCURACY_CASES];   /* against fp32 after the last step */
    /* the underflow probe: one step of probe_tokens tokens */
    int probe_tokens;
    double flush_unscaled, flush_scaled;  /* fp16_flush_share of fp32's gradients */
    double lost_to_zero;                  /* fp16 without scale: fp32's non-zero elements
                                             that came out 0 */
    double grad_error[ACCURACY_CASES];    /* ||g - g32|| / ||g32|| of the probe */
    /* the sum that goes wrong in bf16 */
    int sum_terms;
    double sum_term, sum_bf16, sum_fp32, sum_bf16_inputs_fp32;
} accuracy_report;

extern const precision_case accuracy_cases[ACCURACY_CASES];
void accuracy_local(const run_config *cfg, const dataset *data, int probe_batch,
                    accuracy_report *r);
/* 10000 x 0.01 summed in a bf16 accumulator, in fp32, and bf16 inputs in fp32. */
void accuracy_bf16_sum(accuracy_report *r);
void accuracy_print(const accuracy_report *r);
void accuracy_json(FILE *o, const accuracy_report *r);
void accuracy_free(accuracy_report *r);
int accuracy_write_svg(const char *path, const accuracy_report *r);

/* ---- part 5: wire --------------------------------------------------------------------- */
#define WIRE_STRATEGIES 3  /* ddp, fsdp (zero3), tp */
#define WIRE_CASES 3       /* fp32, bf16 (fp32 gradients), bf16 with bf16 gradients */
typedef struct {
    int ranks, steps, tp;   /* tp: the TP run's size (the largest that divides) */
    double sent[WIRE_STRATEGIES][WIRE_CASES], formula[WIRE_STRATEGIES][WIRE_CASES];
    int ran[WIRE_STRATEGIES][WIRE_CASES];       /* TP's row: fp32 gradients */
    double loss_gap[WIRE_CASES];   /* DDP: largest |loss - fp32's| over the steps */
    double final_loss[WIRE_CASES];
    double grad_dtype_gap;   /* largest |loss| between bf16 with bf16 and fp32 gradients */
} wire_report;

extern const precision_case wire_cases[WIRE_CASES];
extern const char *const wire_strategy_names[WIRE_STRATEGIES];
int wire_launches(const run_config *cfg, const dataset *data, int steps, wire_report *r);
void wire_print(const wire_report *r);
void wire_json(FILE *o, const wire_report *r);

/* ---- part 6: fp8 ----------------------------------------------------------------------- */
/* No CPU here has FP8 units: the part is about accuracy and bytes, never speed. */
#define FP8_TRAIN_STEPS 100   /* fp32 steps before the activations are read */
#define FP8_HISTORY 16        /* delayed scaling: the amax of the batches before */
#define FP8_ERROR_CASES 4     /* real activations; outlier channels x100, x1e4, x1e5 */
#define FP8_ERROR_ROWS 6      /* bf16; e4m3 x the 4 recipes; e5m2 tensorwise */
#define FP8_BYTES_ROWS 5      /* fp32, bf16, fp8 tensorwise, rowwise, blockwise */
#define FP8_SPIKE_STEPS 24
#define FP8_SPIKE_AT 4        /* the step whose activations jump */
#define FP8_SPIKE_FACTOR 10
#define FP8_SPIKE_MARGIN 4    /* 2^4 = 16 of headroom: a jump of 10 fits */
#define FP8_SPIKE_RUNS 3      /* current; delayed, margin 0; delayed, margin 4 */
#define FP8_CURVE_STEPS 300   /* c: the loss curves' steps (--fp8-steps) */
#define FP8_CURVE_ROWS 11     /* fp32, bf16, 4 recipes, 2 with outlier channels, 3 reseeds */
#define FP8_CURVE_RESEEDS 3   /* bf16 from other initial weights: the run-to-run spread */
#define FP8_CURVE_BF16 1      /* the row the gaps are measured against */
#define FP8_CURVE_OUTLIERS 1e7
#define FP8_CURVE_LIMIT 0.01  /* a recipe trains as bf16 does: mean loss within 1% */
#define FP8_DEEPSEEK_GAP 0.0025
typedef struct {
    const char *label;
    precision p;
    int fp8, recipe;   /* recipe: fp8_recipe, when fp8 */
    double outliers;   /* fp8_linear_outliers' factor (1: none) */
    int reseed;        /* > 0: the initial weights from seed + reseed, the same batches */
} fp8_curve_row;
extern const fp8_curve_row fp8_curve_rows[FP8_CURVE_ROWS];
typedef struct {
    const char *label;
    int bf16, format, recipe;   /* format, recipe: fp8_format, fp8_recipe */
} fp8_error_row;
extern const fp8_error_row fp8_error_rows[FP8_ERROR_ROWS];
extern const double fp8_outlier_factors[FP8_ERROR_CASES];   /* 1: real activations */

typedef struct {
    /* b: fc2's product (out = x w^T) of the last block, after FP8_TRAIN_STEPS */
    int layer, M, N, K;
    double amax, rms;                                  /* of the real activations */
    double error[FP8_ERROR_ROWS][FP8_ERROR_CASES];     /* ||y - y32|| / ||y32|| */
    /* d: FP8_SPIKE_STEPS batches, the activations times FP8_SPIKE_FACTOR at
     * FP8_SPIKE_AT; the error of current scaling and of delayed scaling with margins 0
     * and FP8_SPIKE_MARGIN, and the amax each step */
    double spike_amax[FP8_SPIKE_STEPS], spike_error[FP8_SPIKE_RUNS][FP8_SPIKE_STEPS];
    /* c: each row's loss a step, its mean over the steps and its gap to bf16's mean,
     * (mean - bf16's) / bf16's */
    int curve_steps;
    float *curve[FP8_CURVE_ROWS];
    double curve_mean[FP8_CURVE_ROWS], curve_gap[FP8_CURVE_ROWS];
    double curve_spread;   /* the reseeded bf16 rows' largest |gap|: what the initial
                              weights alone move the mean by */
    /* c, the formats: step 1's gradients against fp32's, relative, per recipe in e4m3
     * and hybrid (fp8_linear.h's fp8_training_format), and bf16's */
    double grad_error[FP8_RECIPES][2], grad_error_bf16;
    /* e: the whole model's weights and ZeRO-3 on `ranks` */
    int ranks;
    double P, linear, other;            /* parameters: all, the linears' weights, the rest */
    double scales[FP8_BYTES_ROWS];      /* weight scales held (fp8 rows) */
    double weight_bytes[FP8_BYTES_ROWS];   /* the compute copy of the weights */
    double gather_bytes[FP8_BYTES_ROWS];   /* ZeRO-3 all-gathers, sent per rank per step */
    double reduce_bytes;                   /* its reduce-scatter (fp32 gradients) */
} fp8_report;

/* a: the grids are the library's facts, drawn (fp8_print). b and d need world rank 0's
 * process (FP8_TRAIN_STEPS of one-rank fp32 training, then forwards), e no run at all. */
void fp8_local(const run_config *cfg, const dataset *data, fp8_report *r);
/* The trained model whose activations b and d read. */
typedef struct {
    gpt_model *model;
    const float *params;   /* host */
    const dataset *data;
    const run_config *cfg;
    int K;                 /* fc2's inner dimension: the hidden width */
} fp8_source;
/* fc2's input of the last block for the batch of `step`: x [batch x ctx, K]. */
void fp8_activations_at(const fp8_source *src, int step, float *x);
/* b: one batch's product error per recipe and outlier case (fp8_error.c) */
void fp8_measure_errors(const fp8_source *src, const float *w, fp8_report *r);
/* c: the loss curves of fp8_curve_rows over `steps` steps (fp8_curves.c). */
void fp8_curves(const run_config *cfg, const dataset *data, int steps, fp8_report *r);
void fp8_curves_free(fp8_report *r);
void fp8_curves_print(const fp8_report *r);
void fp8_curves_json(FILE *o, const fp8_report *r);
/* c, the formats: one step per recipe and format against fp32's gradients (fp8_grads.c) */
void fp8_gradient_errors(const run_config *cfg, const dataset *data, fp8_report *r);
void fp8_gradient_errors_print(const fp8_report *r);
void fp8_gradient_errors_json(FILE *o, const fp8_report *r);
/* d: delayed scaling when the amax jumps, against current scaling. */
void fp8_spike(const fp8_source *src, const float *w, fp8_report *r);
/* ref [M, N] = x w^T in fp32 (sgemm); the relative error ||y - ref|| / ||ref|| of the
 * emulated FP8 product y of qx and qw. */
void fp8_reference(float *ref, const float *x, const float *w, int M, int N, int K);
double fp8_product_error(const fp8_matrix *qx, const fp8_matrix *qw, const float *ref);
/* The relative error of x w^T per row against fp32, x [M, K] and w [N, K]. */
void fp8_product_errors(const float *x, const float *w, int M, int N, int K,
                        const float history[FP8_HISTORY], double error[FP8_ERROR_ROWS]);
void fp8_bytes(const run_config *cfg, fp8_report *r);
/* ZeRO-3's all-gather bytes per rank per step when the linears' weights move at
 * `linear_bytes` a parameter plus `scales` fp32 scales and the rest at 2 bytes. */
double fp8_gather_bytes(const gpt_shape *s, int N, double linear_bytes, double scales);
void fp8_print(const fp8_report *r);
void fp8_json(FILE *o, const fp8_report *r);

/* A run of cfg in one case: quiet, its precision, gradients and loss scale. */
run_config mixed_case_config(const run_config *cfg, const precision_case *c, int steps);
/* The chapter's model and data: 2 layers of the default width, 200 steps of the
 * accuracy curves, docs/design.md when it is at hand. */
void mixed_chapter_defaults(run_config *cfg);

#endif
