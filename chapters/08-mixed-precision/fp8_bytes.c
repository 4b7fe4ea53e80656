/* Part 6e: bytes per parameter and ZeRO-3's all-gather bytes per step in fp32, bf16 and
 * FP8 (scales counted), from the model's shapes; the FP8 rows are what ZeRO-3's FP8
 * path sends (fsdp_fp8_gather_bytes: forward's blocks as codes, with the all-reduces of
 * their amaxes and bf16 LayerNorms and biases; backward's in bf16), which chapter 2
 * (--precision fp8 --stage 3) and tests/test_fp8_training.c measure equal to the byte. FP8 covers the linears' weights (qkv,
 * proj, fc, fc2 of every block); the embedding (the tied LM head), LayerNorms and
 * biases stay bf16, as in DeepSeek-V3 and Transformer Engine. */
#include "mixed.h"

#include "fp8_scaling.h"
#include "fsdp_fp8.h"

static const int bytes_recipes[FP8_BYTES_ROWS] = {-1, -1, FP8_TENSORWISE, FP8_ROWWISE,
                                                  FP8_BLOCKWISE};

/* The four weights of a block: [out, in] each. */
static void block_weights(const gpt_shape *s, int shapes[4][2]) {
    const int C = s->cfg.dim, H = s->hidden_local;
    const int w[4][2] = {{3 * C, C}, {C, C}, {H, C}, {C, H}};
    for (int i = 0; i < 4; i++) shapes[i][0] = w[i][0], shapes[i][1] = w[i][1];
}

/* Scales a block's weights hold in a recipe (FP8_ACTIVATION's blocks never used here). */
static double block_scales(const gpt_shape *s, fp8_recipe recipe) {
    int shapes[4][2];
    block_weights(s, shapes);
    double n = 0;
    for (int i = 0; i < 4; i++) {
        int br, bc;
        fp8_recipe_blocks(recipe, FP8_WEIGHT, shapes[i][0], shapes[i][1], &br, &bc);
        n += (double)fp8_scale_count(shapes[i][0], shapes[i][1], br, bc);
    }
    return n;
}

/* zero_comm_plan's ZeRO-3 gathers (forward: every slab, the tied embedding again for the
 * head; backward: the blocks again): each block twice, the embedding twice, the final
 * LayerNorm once; a ring sends (N-1)/N of each. */
double fp8_gather_bytes(const gpt_shape *s, int N, double linear_bytes, double scales) {
    int shapes[4][2];
    block_weights(s, shapes);
    double linear = 0;
    for (int i = 0; i < 4; i++) linear += (double)shapes[i][0] * shapes[i][1];
    const double block = (double)gpt_slab_numel(s, gpt_block_slab(s, 0));
    const double embed = (double)gpt_slab_numel(s, gpt_embed_slab(s));
    const double final_ln = (double)gpt_slab_numel(s, gpt_final_slab(s));
    const double block_bytes = linear * linear_bytes + scales * 4 + (block - linear) * 2;
    const double bytes = 2 * s->cfg.layers * block_bytes + 2 * embed * 2 + final_ln * 2;
    return bytes * (N - 1) / N;
}

void fp8_bytes(const run_config *cfg, fp8_report *r) {
    const gpt_shape s = gpt_shape_make(&cfg->model, 1, 0);
    const int N = cfg->comm.ranks, L = cfg->model.layers;
    int shapes[4][2];
    block_weights(&s, shapes);
    r->ranks = N;
    r->P = (double)gpt_num_params(&s);
    r->linear = 0;
    for (int i = 0; i < 4; i++) r->linear += (double)L * shapes[i][0] * shapes[i][1];
    r->other = r->P - r->linear;
    const comm_plan f32 = zero_comm_plan(&s, 3, PRECISION_FP32);
    const comm_plan b16 = zero_comm_plan(&s, 3, PRECISION_BF16);
    r->gather_bytes[0] = plan_ring_bytes(&f32, COMM_KIND_ALLGATHER, N);
    r->gather_bytes[1] = plan_ring_bytes(&b16, COMM_KIND_ALLGATHER, N);
    r->reduce_bytes = plan_ring_bytes(&f32, COMM_KIND_REDUCE_SCATTER, N);
    r->weight_bytes[0] = 4 * r->P;
    r->weight_bytes[1] = 2 * r->P;
    for (int i = 2; i < FP8_BYTES_ROWS; i++) {
        const double per_block = block_scales(&s, (fp8_recipe)bytes_recipes[i]);
        r->scales[i] = L * per_block;
        r->weight_bytes[i] = r->linear + 4 * r->scales[i] + 2 * r->other;
        double sent[2];   /* what ZeRO-3 sends (fsdp_fp8.h), measured equal in chapter 2 */
        fsdp_fp8_gather_bytes(&s, (fp8_recipe)bytes_recipes[i], N, sent);
        r->gather_bytes[i] = sent[0] + sent[1];
    }
}
