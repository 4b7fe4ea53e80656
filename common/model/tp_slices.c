/* Where each number of a TP rank's slice sits in the unsplit model: the inverse of the
 * slicing that gpt_init_params applies (common/model.c), written tensor by tensor.
 *
 * Block of rank r with t ranks (C channels, Cl = C/t, Hl = 4C/t):
 *   qkv_w  local rows [my Q heads | my K heads | my V heads]: local row p*Cl + i is
 *          unsplit row p*C + r*Cl + i (p = 0, 1, 2 for Q, K, V); qkv_b likewise
 *   proj_w [C, Cl]: unsplit columns r*Cl .. r*Cl + Cl
 *   fc_w   [Hl, C]: unsplit rows r*Hl ..;  fc_b likewise
 *   fc2_w  [C, Hl]: unsplit columns r*Hl ..
 *   ln1, ln2, proj_b, fc2_b: replicated (every rank holds the whole tensor)
 * Embedding: wte rows [vocab_start, vocab_start + vocab_local) when vocab-parallel
 * (padding rows have no unsplit place), else replicated; wpe and the final LayerNorm
 * replicated. */
#include "tp_slices.h"

#include <string.h>

#include "alloc.h"
#include "floats.h"
#include "ops.h"

static void copy_floats(float *whole, float *part, size_t n, slice_direction dir) {
    if (dir == SLICE_TAKE) memcpy(part, whole, n * sizeof(float));
    else memcpy(whole, part, n * sizeof(float));
}

/* The shape of TP rank r of t with part's vocabulary split and MoE blocks. */
static gpt_shape shape_like(const gpt_shape *part, int t, int r) {
    gpt_shape s = gpt_shape_make(&part->cfg, t, r);
    if (part->vocab_parallel) gpt_shape_split_vocab(&s);
    gpt_shape_drop_moe_mlps(&s, part->moe_every);
    return s;
}

/* One block; mlp: whether it holds its MLP (an MoE model's MoE blocks do not). */
static void slice_block(const gpt_shape *part, float *whole_block, float *part_block,
                        slice_direction dir, int with_replicated, int mlp) {
    const gpt_shape whole = gpt_shape_make(&part->cfg, 1, 0);
    const size_t C = part->cfg.dim, Cl = part->dim_local, Hl = part->hidden_local;
    const size_t r = (size_t)part->tp_rank;
    gpt_block_tensors W = gpt_block_view(&whole, whole_block);
    gpt_block_tensors P = gpt_block_view(part, part_block);
    if (with_replicated) {
        copy_floats(W.ln1_w, P.ln1_w, C, dir);
        copy_floats(W.ln1_b, P.ln1_b, C, dir);
        copy_floats(W.proj_b, P.proj_b, C, dir);
        copy_floats(W.ln2_w, P.ln2_w, C, dir);
        copy_floats(W.ln2_b, P.ln2_b, C, dir);
        if (mlp) copy_floats(W.fc2_b, P.fc2_b, C, dir);
    }
    for (size_t p = 0; p < 3; p++) {   /* Q, K, V: my heads' rows of each */
        copy_floats(W.qkv_w + (p * C + r * Cl) * C, P.qkv_w + p * Cl * C, Cl * C, dir);
        copy_floats(W.qkv_b + p * C + r * Cl, P.qkv_b + p * Cl, Cl, dir);
    }
    for (size_t row = 0; row < C; row++)   /* row-parallel: my columns of each row */
        copy_floats(W.proj_w + row * C + r * Cl, P.proj_w + row * Cl, Cl, dir);
    if (!mlp) return;
    for (size_t row = 0; row < C; row++)
        copy_floats(W.fc2_w + row * 4 * C + r * Hl, P.fc2_w + row * Hl, Hl, dir);
    copy_floats(W.fc_w + r * Hl * C, P.fc_w, Hl * C, dir);   /* column-parallel rows */
    copy_floats(W.fc_b + r * Hl, P.fc_b, Hl, dir);
}

void tp_slice_block(const gpt_shape *part, float *whole_block, float *part_block,
                    slice_direction dir, int with_replicated) {
    slice_block(part, whole_block, part_block, dir, with_replicated, 1);
}

void tp_slice_model(const gpt_shape *part, float *whole, float *part_vec,
                    slice_direction dir, int with_replicated) {
    const gpt_shape ws = shape_like(part, 1, 0);
    const size_t C = part->cfg.dim, V = part->cfg.vocab;
    /* wte: my vocabulary rows (the real ones; padding stays out of the unsplit model) */
    if (part->vocab_parallel || with_replicated) {
        size_t start = (size_t)part->vocab_start, rows = 0;
        if (start < V) rows = V - start < (size_t)part->vocab_local ? V - start
                                                                   : (size_t)part->vocab_local;
        copy_floats(whole + start * C, part_vec, rows * C, dir);
    }
    if (with_replicated) {   /* wpe and the final LayerNorm */
        copy_floats(whole + V * C, part_vec + (size_t)part->vocab_local * C,
                    (size_t)part->cfg.ctx * C, dir);
        copy_floats(whole + gpt_slab_offset(&ws, gpt_final_slab(&ws)),
                    part_vec + gpt_slab_offset(part, gpt_final_slab(part)), 2 * C, dir);
    }
    for (int l = 0; l < part->cfg.layers; l++) {
        slice_block(part, whole + gpt_slab_offset(&ws, gpt_block_slab(&ws, l)),
                    part_vec + gpt_slab_offset(part, gpt_block_slab(part, l)), dir,
                    with_replicated, gpt_block_has_mlp(part, l));
    }
}

double tp_gather_whole(comm *tp, const gpt_shape *mine, const float *local, float *whole) {
    const int t = comm_size(tp), me = comm_rank(tp);
    const size_t n = gpt_num_params(mine);   /* the same on every rank of the group */
    float *all = mem_alloc(MEM_OTHER, (size_t)t * n * sizeof(float));
    if (t > 1) comm_allgather(tp, local, all, (size_t)t * n, COMM_F32);
    else ops_download(all, local, n * sizeof(float));
    double drift = 0.0;
    if (me == 0) {
        /* rank 0 first, with its replicated copies; then the others' own slices */
        for (int r = 0; r < t; r++) {
            const gpt_shape s = shape_like(mine, t, r);
            tp_slice_model(&s, whole, all + (size_t)r * n, SLICE_PUT, r == 0);
        }
        /* round trip: slicing the result again must give every rank's vector back;
         * only replicated tensors can differ, and only if the ranks drifted apart */
        float *again = mem_alloc(MEM_OTHER, n * sizeof(float));
        for (int r = 1; r < t; r++) {
            const gpt_shape s = shape_like(mine, t, r);
            memset(again, 0, n * sizeof(float));
            tp_slice_model(&s, whole, again, SLICE_TAKE, 1);
            double d = max_abs_diff(again, all + (size_t)r * n, n);
            if (d > drift) drift = d;
        }
        mem_free(again);
    }
    mem_free(all);
    return drift;
}
