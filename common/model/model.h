/* The tiny GPT-2: token + position embedding, pre-LayerNorm blocks of causal
 * multi-head attention and a GELU MLP, a final LayerNorm, and an LM head tied to the
 * token embedding, trained with softmax cross-entropy.
 *
 * Parameters live in one contiguous vector cut into slabs: slab 0 is the embedding
 * (wte, wpe), slabs 1..L are the blocks, slab L+1 the final LayerNorm. Gradients and
 * optimizer state use the same layout, so a strategy can all-reduce, shard, gather or
 * own a slab without knowing what is inside it.
 *
 * Tensor parallelism is a property of the shape: with tp_size t a block holds its
 * 1/t slice (attention heads and MLP columns split Megatron-style) and its forward and
 * backward all-reduce over the tp group; with t = 1 it is the plain layer. */
#ifndef MODEL_H
#define MODEL_H
#include <stddef.h>
#include <stdint.h>

#include "attention_block.h"
#include "comm.h"
#include "precision.h"

typedef struct {
    int vocab, ctx, layers, heads, dim;
} gpt_config;

/* One rank's slice of the model: its tensor-parallel slice of every tensor and, in a
 * pipeline, its stage's contiguous range of blocks.
 *
 * Slabs of a stage, in vector order (the whole model is the one stage that holds all):
 *   EMBED   token + position embedding              first stage
 *   BLOCK   one per block in [layer_begin, layer_end)
 *   FINAL   final LayerNorm                          last stage
 *   HEAD    a copy of the token embedding, the tied  last stage, when it is not also
 *           LM head's weight                         the first
 * The two copies of the tied weight start equal (both initialise from the token
 * embedding's values) and stay equal: after backward their gradients are summed over
 * the embedding group {first stage, last stage} (Megatron-LM does the same), and the
 * optimizer then makes the same update on both. */
typedef struct {
    gpt_config cfg;
    int tp_size, tp_rank;
    int dim_local;      /* attention channels on this rank: dim / tp */
    int heads_local;    /* heads / tp */
    int hidden_local;   /* MLP hidden units on this rank: 4 dim / tp */
    /* The token embedding (and tied LM head) rows this rank holds: the whole
     * vocabulary, or with gpt_shape_split_vocab a 1/tp slice of it, padded so that
     * every rank holds vocab_local rows (padding rows are zero and never a target). */
    int vocab_parallel, vocab_start, vocab_local;
    /* The pipeline stage: blocks [layer_begin, layer_end); the first stage embeds, the
     * last one holds the final LayerNorm and the head. */
    int layer_begin, layer_end;
    int has_embed, has_head;
    /* A mixture-of-experts model (moe.h): blocks l with l % moe_every == moe_every - 1
     * hold no MLP (their slabs end after ln2: the MoE layer keeps its routers and
     * experts apart); 0: every block holds its MLP. */
    int moe_every;
} gpt_shape;

/* Checks the config (and that tp divides heads); on failure writes why to err. */
int gpt_config_check(const gpt_config *cfg, int tp_size, char *err, size_t err_len);
/* The whole model (every block, both ends), TP rank tp_rank of tp_size. */
gpt_shape gpt_shape_make(const gpt_config *cfg, int tp_size, int tp_rank);
/* Splits the embedding and LM head over the vocabulary (Megatron's vocab-parallel
 * embedding): rank r holds rows [r * ceil(V/tp), (r+1) * ceil(V/tp)). */
void gpt_shape_split_vocab(gpt_shape *s);
/* Makes s the stage that holds blocks [layer_begin, layer_end). */
void gpt_shape_set_stage(gpt_shape *s, int layer_begin, int layer_end);
/* Stage `stage` of `stages` balanced contiguous stages: blocks
 * [stage * L / stages, (stage + 1) * L / stages). Needs stages <= L. */
void gpt_shape_split_stages(gpt_shape *s, int stages, int stage);
int gpt_stage_layers(const gpt_shape *s);               /* layer_end - layer_begin */
/* Makes s an MoE model's shape: the blocks the MoE layer replaces every `every`-th
 * (moe_config.every) hold no MLP weights, so they take no memory and get no weight
 * decay. The model then needs an MLP hook that replaces exactly those blocks. */
void gpt_shape_drop_moe_mlps(gpt_shape *s, int every);
int gpt_block_has_mlp(const gpt_shape *s, int layer);   /* layer: in the whole model */

/* Slabs and sizes (elements, this rank's slice of this stage). */
typedef enum { GPT_SLAB_EMBED, GPT_SLAB_BLOCK, GPT_SLAB_FINAL, GPT_SLAB_HEAD } gpt_slab_kind;
int gpt_num_slabs(const gpt_shape *s);
gpt_slab_kind gpt_slab_kind_of(const gpt_shape *s, int slab);
size_t gpt_slab_numel(const gpt_shape *s, int slab);
size_t gpt_slab_offset(const gpt_shape *s, int slab);   /* in the stage's vector */
size_t gpt_num_params(const gpt_shape *s);
/* Slab numbers: the embedding is slab 0 on the first stage; a block's slab follows;
 * -1 where the stage does not hold that part. */
int gpt_embed_slab(const gpt_shape *s);
int gpt_block_slab(const gpt_shape *s, int layer);      /* layer: in the whole model */
int gpt_final_slab(const gpt_shape *s);
int gpt_head_slab(const gpt_shape *s);                  /* the HEAD copy, or -1 */
/* The slab of the whole model (the same TP slice) that a stage's slab is: a HEAD copy
 * is the first gpt_tied_weight_numel elements of the whole model's embedding slab. */
int gpt_slab_in_whole(const gpt_shape *s, int slab);
/* The tied weight wte [vocab_local, dim] inside vec (parameters or gradients), on the
 * first and the last stage: the embedding's rows, or the HEAD copy. NULL elsewhere. */
float *gpt_tied_weight(const gpt_shape *s, float *vec);
size_t gpt_tied_weight_numel(const gpt_shape *s);

/* Pointers to the tensors inside one block slab (parameters or gradients alike). In a
 * block without its MLP (gpt_block_has_mlp) fc and fc2 point past the slab: not there. */
typedef struct {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *fc2_w, *fc2_b;
} gpt_block_tensors;
gpt_block_tensors gpt_block_view(const gpt_shape *s, float *slab);
/* The same tensors as element offsets in a block slab, for slabs of any precision. */
typedef struct {
    size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b;
    size_t ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b;
} gpt_block_layout;
gpt_block_layout gpt_block_offsets(const gpt_shape *s);

/* Initial values of elements [begin, end) of the parameter vector, written to out on
 * the host: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), LayerNorm weights 1,
 * biases 0. Each value depends only on (seed, tensor, index in the UNSPLIT tensor), so
 * every TP slice and every ZeRO shard starts bit-identical to the whole model. */
void gpt_init_params(const gpt_shape *s, uint64_t seed, size_t begin, size_t end,
                     float *out);

/* A model instance: activations and scratch for micro-batches of B x T on one rank,
 * for the blocks of its stage. It holds no parameters: every call is given the slabs
 * to use, so a strategy decides where parameters live (replicated, gathered just in
 * time, sharded).
 *
 * Micro-batches in flight: a pipeline stage runs the forward of several micro-batches
 * before their backward. Each has its own activations (a slot); the backward scratch
 * is shared. gpt_use_slot(m, k) makes the following calls work on slot k, which is
 * allocated on its first use and kept: after the first step the slots a schedule
 * needs exist, and the activation memory measured is what it really holds. */
typedef struct gpt_model gpt_model;

/* An MLP that replaces the blocks' own where it says so (a mixture of experts, moe.h):
 * forward writes out [N, C] from ln2 [N, C]; backward overwrites d_ln2 [N, C] from
 * d_out [N, C], accumulating its own parameters' gradients where it keeps them.
 * Activations are of precision p (void *, as ops_mixed.h takes them). What its backward
 * needs it keeps per micro-batch slot (gpt_use_slot) and layer, as the attention hook
 * below. With TP ln2 is replicated over the group and every rank computes the whole
 * MLP on it: out and d_ln2 are complete on every rank, so no all-reduce follows; with
 * SP the model all-gathers the group's rows of ln2 (and of d_out) before the hook and
 * keeps its own positions of out (and d_ln2) after it, so the hook sees the same whole
 * rows as without SP. The model holds none of its own MLP's activations for a block
 * the hook replaces (fc's and GELU's outputs, [N, 4C/tp] each a slot), nor their
 * gradients' scratch where it replaces every block of the stage. Not with a split
 * backward. */
typedef struct {
    void *ctx;
    int (*replaces)(void *ctx, int layer);
    void (*forward)(void *ctx, int slot, int layer, precision p, void *out, const void *ln2);
    void (*backward)(void *ctx, int slot, int layer, precision p, void *d_ln2,
                     const void *d_out);
} gpt_mlp_hook;

/* An attention core that replaces every block's own (context parallelism, whose ranks
 * each hold a chunk of every sequence: cp_attention_hook.h): forward writes atty [N, Cl]
 * from qkv [N, 3 Cl]; backward overwrites d_qkv [N, 3 Cl] from d_atty [N, Cl], given the
 * layer's qkv and atty. Activations are of precision p (void *: as the ops in
 * ops_mixed.h take them). What its backward needs (the model keeps no probabilities
 * then) it keeps itself, per micro-batch slot (gpt_use_slot) and layer: a forward of
 * (slot, layer) replaces what the last one kept. With activation checkpointing the
 * model calls forward again before backward, with the same inputs. With sequence
 * parallelism its N rows are the TP-gathered chunk (every position of it). */
typedef struct {
    void *ctx;
    void (*forward)(void *ctx, int slot, int layer, precision p, void *atty,
                    const void *qkv);
    void (*backward)(void *ctx, int slot, int layer, precision p, void *d_qkv,
                     const void *d_atty, const void *qkv, const void *atty);
} gpt_attention_hook;

typedef struct {
    /* What activations, their gradients and the compute weights are held in (the
     * parameter slabs every call is given are of this precision; parameter gradients
     * are fp32 in every precision): fp32 (0, the default) or bf16/fp16, mixed
     * precision (ops_mixed.h). */
    precision precision;
    int checkpoint_activations;   /* keep only block inputs; recompute in backward */
    comm *tp;                     /* tensor-parallel group; NULL when tp_size is 1 */
    int drop_f_backward;          /* negative control: f's backward all-reduce skipped */
    int max_slots;                /* micro-batches in flight at most (0: 1) */
    /* Selective recomputation (Korthikanti et al. 2022): the attention core's softmax
     * probabilities are not kept but formed again from Q and K in backward. */
    int recompute_attention;
    /* Megatron sequence parallelism on tp (tp_sequence.h): LayerNorms and the residual
     * stream hold T/tp positions of each sequence, and so do a stage's boundaries (a
     * pipeline sends 1/tp of the activations). T a multiple of tp; sp_copy_not_reduce:
     * negative control; sp_mlp_summed: negative control, the MLP hook's whole output
     * reduce-scattered (summed over the tp copies) instead of sliced. */
    int sequence_parallel, sp_copy_not_reduce, sp_mlp_summed;
    /* With sequence parallelism: forward's all-gathers and reduce-scatters as collective
     * matmuls in this many chunks (tp_overlap.h; 0: off), and its negative control. */
    int tp_overlap_chunks, tp_overlap_control;
    const gpt_mlp_hook *mlp;      /* replaces some blocks' MLP (NULL: none) */
    const gpt_attention_hook *attention;   /* replaces the attention core (NULL: none) */
    /* The positions of its sequence each of the T rows is (a CP rank's span: one or two
     * pieces of a longer sequence), for the position embedding; the caller keeps it.
     * NULL: 0..T-1. With sequence parallelism the T rows are the whole chunk's, and a
     * rank's rows are its slice of them. */
    const position_span *positions;
} gpt_model_options;

/* Why a model of shape s on T positions cannot take these options (a combination not
 * supported yet: one line in why, returned), or NULL when it can. gpt_model_create
 * takes only options this passes: a strategy asks first, its command line before any
 * rank starts. */
const char *gpt_model_options_check(const gpt_shape *s, int T, const gpt_model_options *o,
                                    char *why, size_t why_len);
gpt_model *gpt_model_create(const gpt_shape *s, int B, int T,
                            const gpt_model_options *opts);
void gpt_model_free(gpt_model *m);
const gpt_shape *gpt_model_shape(const gpt_model *m);
precision gpt_model_precision(const gpt_model *m);
void gpt_use_slot(gpt_model *m, int slot);   /* 0 <= slot < max_slots */

/* Uploads one micro-batch: tokens and next-token targets, B*T each, on the host. The
 * first stage needs the tokens, the last the targets; giving both is harmless. */
void gpt_set_batch(gpt_model *m, const int *tokens, const int *targets);
/* Host memory for 2 x B*T ints, the model's own, to stage a batch in (load_batch). */
int *gpt_host_batch(gpt_model *m);

/* The stage's boundary, [B*T, dim] on the device ([B*T/tp, dim], this rank's positions
 * of each sequence, with sequence parallelism), in the model's precision, for the
 * current slot:
 *   input        write the previous stage's output here before gpt_forward
 *   output       the activations to send to the next stage, after gpt_forward
 *   output_grad  write d(output) from the next stage here before gpt_backward
 *   input_grad   d(input) to send to the previous stage, after gpt_backward
 * (output_grad and input_grad are the backward scratch: use them at once.) */
void *gpt_stage_input(gpt_model *m);
const void *gpt_stage_output(gpt_model *m);
void *gpt_stage_output_grad(gpt_model *m);
const void *gpt_stage_input_grad(gpt_model *m);
/* Elements of one boundary tensor: B*T*dim, or B*T/tp*dim with sequence parallelism. */
size_t gpt_stage_boundary_numel(const gpt_model *m);

/* The pieces of one step, for strategies that act between layers (FSDP).
 * Forward: embed, blocks, head. Backward: head, blocks in reverse, embed. `layer` is
 * the block's number in the whole model. `embed` for the head is the tied weight's
 * slab (gpt_head_slab on a last stage that is not the first, else the embedding). */
void gpt_embed_forward(gpt_model *m, const void *embed);
void gpt_block_forward(gpt_model *m, int layer, const void *block);
/* Returns the mean loss over this micro-batch's tokens. */
float gpt_head_forward(gpt_model *m, const void *final_ln, const void *embed);
/* dloss: d(objective)/d(one token's loss), e.g. 1/(tokens in the global batch). */
void gpt_head_backward(gpt_model *m, const void *final_ln, const void *embed,
                       float *final_ln_grad, float *embed_grad, float dloss);
void gpt_block_backward(gpt_model *m, int layer, const void *block, float *block_grad);
void gpt_embed_backward(gpt_model *m, float *embed_grad);

/* The stage's whole step on its contiguous parameter vector. gpt_forward returns the
 * micro-batch's mean loss on the last stage, 0 elsewhere. */
float gpt_forward(gpt_model *m, const void *params);
/* Accumulates into grads. on_slab_ready(ctx, slab) is called as soon as a slab's
 * gradients are final for this micro-batch (head, final LayerNorm, blocks from last
 * to first; the tied embedding comes last), so DDP can start its all-reduce during
 * backward. */
typedef void (*gpt_slab_ready_fn)(void *ctx, int slab);
void gpt_backward(gpt_model *m, const void *params, float *grads, float dloss,
                  gpt_slab_ready_fn on_slab_ready, void *ctx);

/* The whole model's backward slab by slab, each slab's fp32 gradient in a buffer the
 * caller lends: open(ctx, slab) returns it (backward accumulates into it), close(ctx,
 * slab, buffer) takes it back the moment the slab's gradient is final: the final
 * LayerNorm, then the blocks from last to first, then the tied embedding, whose buffer
 * stays open through the pass (the LM head adds to it first). ZeRO-2 reduce-scatters
 * each slab in close; 16-bit gradients round it there. A whole model only (one stage,
 * no TP). */
typedef float *(*gpt_slab_open_fn)(void *ctx, int slab);
typedef void (*gpt_slab_close_fn)(void *ctx, int slab, float *grad);
void gpt_backward_by_slab(gpt_model *m, const void *params, float dloss,
                          gpt_slab_open_fn open, gpt_slab_close_fn close, void *ctx);

/* The same backward in two halves, as zero-bubble pipeline schedules run it:
 * gpt_backward_input computes d(input) (what the previous stage waits for) and keeps the
 * output gradient of every linear; gpt_backward_weights then computes the weight
 * gradients from them (and calls on_slab_ready as gpt_backward does). Together they
 * give gpt_backward's numbers bit for bit. Not with activation checkpointing. */
void gpt_backward_input(gpt_model *m, const void *params, float *grads, float dloss);
void gpt_backward_weights(gpt_model *m, const void *params, float *grads,
                          gpt_slab_ready_fn on_slab_ready, void *ctx);

/* The input of one of block `layer`'s four linears in the last forward of the current
 * slot: [B*T, in features] (ln1, the attention's output, ln2, GELU's output), in the
 * model's precision, on the device. NULL where it is not kept (activation
 * checkpointing, or an MLP a hook replaced). For inspection: chapter 8 quantizes real
 * activations to FP8 to measure the error of the product. */
typedef enum { GPT_QKV_INPUT, GPT_PROJ_INPUT, GPT_FC_INPUT, GPT_FC2_INPUT } gpt_linear_input;
const void *gpt_block_linear_input(const gpt_model *m, int layer, gpt_linear_input which);

/* FLOPs of one forward+backward over B*T tokens: 6 x (non-embedding params + LM head)
 * x tokens + attention (12 L T^2 C x B, causal-halved not taken). */
double gpt_flops_per_step(const gpt_config *cfg, int B, int T);

#endif
