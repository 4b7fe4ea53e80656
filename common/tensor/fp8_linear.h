/* FP8 training's linear layers (--precision fp8): the forward product of a bf16 run
 * taken on FP8-rounded inputs with their scales, emulated (fp8_matmul.h).
 *
 * A run in FP8 is a bf16 run (ops_mixed.h: bf16 activations and compute weights, fp32
 * masters, gradients and AdamW) whose linears' forward products read x and w rounded
 * to E4M3 under a scaling recipe (fp8_scaling.h), the partial sums in fp32, the bias
 * added in fp32 and the output rounded to bf16 once. Attention, softmax, LayerNorm,
 * the LM head (tied to the embedding; DeepSeek-V3 keeps it in bf16 too) and the loss
 * stay bf16. The format (--fp8-format) decides the backward: e4m3 keeps the backward
 * products bf16 (matmul16); hybrid (Transformer Engine's) takes them on FP8 operands,
 * the output gradient dY in E5M2 (range before precision: gradients span more binades
 * than activations) and W and X in E4M3, each scaled by the recipe (dY blocked as an
 * activation, with its own amax, all-reduced as an activation's, and under delayed its
 * own history per site; W and X under delayed read the histories the forward left).
 *
 * Recipes and data parallelism: rowwise and blockwise scale the activations per token
 * (a row, or a 1 x 128 tile of it) and the weights from the whole weight, which every
 * rank holds the same (DDP) or gathers whole before the product (ZeRO-3): a rank's
 * share of the batch does not change any scale, so DDP and ZeRO equal the FP8
 * baseline as bf16's do. tensorwise and delayed scale the activations by the amax of
 * the whole [N, K] tensor, of which a rank holds its share of the batch: the amax is
 * all-reduced (max) over the data-parallel group (fp8_linear_group, Transformer
 * Engine's amax reduction), a float a linear a forward, so every rank scales as one
 * device does. delayed keeps an amax history per
 * tensor (Transformer Engine): each linear of a block is a site (fp8_linear_site, set
 * by the model before the product), each site's activation and weight have their own
 * history of the last `history` forwards, and a product's scale comes from it (the first
 * forward from its own amax); its amax (the group's) then joins the history, the same on
 * every rank.
 *
 * The recipe is the process's, set before any rank starts and read by every rank's
 * thread; the scratch is each thread's own, grown once and kept (no allocation per
 * step once the largest linear has run; freed as the thread ends). */
#ifndef FP8_LINEAR_H
#define FP8_LINEAR_H
#include <stdint.h>

#include "fp8_scaling.h"

/* The formats of a run: e4m3 everywhere FP8 is used (the forward), or hybrid. */
typedef enum { FP8_FORMAT_E4M3, FP8_FORMAT_HYBRID, FP8_TRAINING_FORMATS } fp8_training_format;
const char *fp8_training_format_name(fp8_training_format f);   /* "e4m3", "hybrid" */
int fp8_training_format_parse(const char *name, fp8_training_format *out);   /* -1: unknown */
/* The format from now on (set before any rank starts, as the recipe), and which it is. */
void fp8_linear_format(fp8_training_format f);
fp8_training_format fp8_linear_format_now(void);
/* Whether the calling thread's next linear backward runs in FP8 (FP8 on, hybrid, and
 * a site set: not FP8_NO_SITE). */
int fp8_linear_backward_active(void);

/* FP8 linears with this recipe from now on (NULL: off, bf16 linears). */
void fp8_linear_use(const fp8_recipe *recipe);
/* delayed's amax history length (forwards) and margin (the scale 2^margin smaller) from
 * now on; NULL, or why they cannot be used. */
const char *fp8_linear_delayed(int history, int margin);
/* The linear the calling thread's next products belong to (delayed: whose history);
 * FP8_NO_SITE: they are not an FP8 linear's (the LM head's backward stays bf16). */
#define FP8_NO_SITE (-1)
void fp8_linear_site(int site);
/* A run starts on the calling thread: its delayed histories start empty, and its
 * per-tensor activation amaxes become reduce(ctx, amax): the largest over the ranks
 * that hold a share of the tensor (the training loop's all-reduce with MAX over its
 * data-parallel group; the tensor layer knows no communicator). NULL: one device.
 * Collective: every rank of the group runs the same linears in order. */
typedef float (*fp8_amax_reduce_fn)(void *ctx, float amax);
void fp8_linear_group(fp8_amax_reduce_fn reduce, void *ctx);
/* Negative control (tests): each rank's own amax, not all-reduced. */
void fp8_linear_test_local_amax(int on);
/* Negative control (tests): the output gradients' amax alone each rank's own. */
void fp8_linear_test_local_grad_amax(int on);
/* Whether FP8 linears are on; *recipe is theirs when they are (recipe may be NULL). */
int fp8_linear_active(fp8_recipe *recipe);
/* Returns NULL, or why the training path cannot take recipe on `ranks` data-parallel
 * ranks (a sentence naming what is valid). */
const char *fp8_linear_recipe_check(fp8_recipe recipe, int ranks);
/* Weights quantised before the product (ZeRO-3's FP8 all-gather, fsdp_fp8.h): with any
 * recipe (no test hook on), the calling thread's products whose bf16 `weight` pointer
 * was given take these E4M3 codes [OC * IC] and the recipe's weight scales instead of
 * quantising the weight themselves; the caller guarantees they are what quantising it
 * would give (delayed: its scale from fp8_linear_delayed_weight_scale). */
int fp8_linear_takes_given_weights(void);
/* Delayed: the scale of `site`'s weight from the calling thread's history of it, and
 * the whole weight's amax recorded there, as that linear's forward does for a weight
 * it quantises itself (a given one it does not record). */
float fp8_linear_delayed_weight_scale(int site, float amax);
/* Returns 0 when 8 weights are given already (then nothing is). */
int fp8_linear_give_weight(const uint16_t *weight, const uint8_t *codes, const float *scales);
void fp8_linear_forget_weight(const uint16_t *weight);
/* Negative control (tests): every scale 1, as if the recipe were not applied. */
void fp8_linear_test_unscaled(int on);

/* Outlier channels, as LLMs' activations have (a few channels 100x the rest, in fixed
 * channels): FP8_OUTLIER_CHANNELS of a product's inner dimension, all in its first
 * 1 x 128 tile, multiplied by factor in x [M, K] and divided by it in w [N, K] (w may be
 * NULL), so x w^T is the same product and only the scaling sees the difference. */
#define FP8_OUTLIER_CHANNELS 4
void fp8_outliers_apply(float *x, float *w, int M, int N, int K, double factor);
/* Every FP8 linear's inputs with outlier channels of this factor from now on (1: none):
 * the chapter's designed failure of per-tensor scaling, in training. */
void fp8_linear_outliers(double factor);

/* out[N,OC] = fp8(inp[N,IC]) fp8(weight[OC,IC])^T + bias[OC], bf16 bit patterns in and
 * out (bias may be NULL): the product and the bias in fp32, rounded to bf16 once. */
void fp8_linear_forward(uint16_t *out, const uint16_t *inp, const uint16_t *weight,
                        const uint16_t *bias, int N, int IC, int OC);
/* hybrid's backward, bf16 bit patterns in, for out = X W^T + b:
 *   dinp [N, IC]     = e5m2(dout) [N, OC] e4m3(weight) [OC, IC], rounded to bf16 once
 *   dweight [OC, IC] += e5m2(dout)^T e4m3(inp) [N, IC], in fp32
 * either may be NULL (dbias is the caller's: bf16's sums of dout). Collective under the
 * per-tensor recipes (dY's amax), as the forward. */
void fp8_linear_backward(uint16_t *dinp, float *dweight, const uint16_t *dout,
                         const uint16_t *inp, const uint16_t *weight, int N, int IC, int OC);
/* Frees the calling thread's scratch (at a rank thread's end). */
void fp8_linear_release_thread(void);

#endif
