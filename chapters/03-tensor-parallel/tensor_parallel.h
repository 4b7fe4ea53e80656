/* Chapter 3, tensor parallelism: what the three parts and the tests share.
 *
 *   matrix_split.c  part 1: y = W x split by outputs (column-parallel) and by inputs
 *                   (row-parallel), and Megatron's f and g operators
 *   block_demo.c    part 2: one transformer block built from those layers
 *   tp_slices.c     the map between the unsplit model and a TP rank's slice
 *   tp_train.c      part 3: the whole model trained with TP (x DP), checked against
 *                   the single-device baseline
 *   link_projection.c  part 3's arithmetic: TP's all-reduces on NVLink, IB, Ethernet
 *   main.c          flags, the baseline, launch, the printed report */
#ifndef TENSOR_PARALLEL_H
#define TENSOR_PARALLEL_H
#include <stddef.h>

#include "comm.h"
#include "model.h"
#include "report.h"
#include "tp_linear.h"
#include "train.h"

/* ---- part 1: y = W x by hand --------------------------------------------------------- */
typedef struct {
    int rows, cols;                           /* W is rows x cols */
    double diff_column, diff_row;             /* largest |y_split - y_whole| */
    double bytes_gather, bytes_reduce;        /* sent per rank, measured */
    double formula_gather, formula_reduce;    /* ring formulas */
} split_report;
void part1_matrix_split(comm *tp, const run_config *cfg, split_report *out);

/* ---- part 2: one Megatron block -------------------------------------------------------- */
typedef struct {
    int drop_f_backward;   /* test only: the negative control, f backward = identity */
} megatron_block_options;

typedef struct megatron_block megatron_block;
megatron_block *megatron_block_create(const gpt_shape *s, int B, int T, comm *tp,
                                      const megatron_block_options *opts);
void megatron_block_free(megatron_block *b);
/* out[N, C] = block(x): x and out are replicated over tp, params is this rank's slice
 * of one block slab (gpt_block_view layout). */
void megatron_block_forward(megatron_block *b, float *out, const float *x,
                            const float *params);
/* dx[N, C] = d(block input) (overwritten); grads accumulates the slab's gradients.
 * Uses the activations of the last forward. */
void megatron_block_backward(megatron_block *b, float *dx, const float *dout,
                             const float *params, float *grads);

typedef struct {
    int tp, B, T;
    double diff_out, diff_dx, diff_grads;     /* vs the unsplit block, largest rank */
    int allreduces_forward, allreduces_backward;
    double bytes_forward, bytes_backward;     /* sent per rank per block, measured */
    double formula_per_allreduce;             /* ring: 2(t-1)/t x B T C x 4 */
    size_t params_per_rank, params_whole;     /* elements of one block */
    size_t replicated_per_rank;               /* LayerNorms + row-parallel biases */
} block_report;
/* Runs one block split over tp and the same block unsplit on every rank, on the same
 * input and output gradient; fills the report (every rank gets the same numbers). */
void block_compare(comm *tp, const gpt_config *cfg, int B, int T, uint64_t seed,
                   const megatron_block_options *opts, block_report *out);
void part2_block(comm *tp, const run_config *cfg, block_report *out);

/* ---- the unsplit model <-> a TP rank's slice ------------------------------------------- */
typedef enum { SLICE_TAKE, SLICE_PUT } slice_direction;   /* whole -> part, part -> whole */
/* Copies rank part->tp_rank's pieces of one block slab between the unsplit layout and
 * the slice. with_replicated: also copy LayerNorms and row-parallel biases. */
void tp_slice_block(const gpt_shape *part, float *whole_block, float *part_block,
                    slice_direction dir, int with_replicated);
/* The same for the whole parameter (or gradient) vector, embedding included. */
void tp_slice_model(const gpt_shape *part, float *whole, float *part_vec,
                    slice_direction dir, int with_replicated);
/* Gathers every tp rank's slice and reassembles the unsplit vector on tp rank 0
 * (whole: gpt_num_params of the unsplit shape; may be NULL on the other ranks).
 * Replicated tensors are taken from rank 0; the return value (on rank 0) is the
 * largest difference between rank 0's copies and the other ranks' (0 when the ranks
 * stayed in step). Collective over tp. */
double tp_gather_whole(comm *tp, const gpt_shape *mine, const float *local, float *whole);

/* ---- part 3: training the whole model ------------------------------------------------ */
/* Checks a TP size against the model and the world before any rank starts: heads,
 * dim and world must be multiples of tp, and the global batch of the dp size. On
 * failure writes one line (naming the numbers and the sizes that would work). */
int tp_check_sizes(const run_config *cfg, int world, int tp, char *err, size_t err_len);

typedef struct {
    run_result result;          /* on world rank 0: compared with the baseline */
    float *loss;                /* per step (global-batch mean) */
    float *first_grads;         /* world rank 0: unsplit gradients of step 1 */
    float *final_params;        /* world rank 0: unsplit parameters after the last step */
    double replica_drift;       /* largest difference between TP ranks' replicated copies */
    int tp, dp;
    int vocab_local, vocab_padding;
    size_t params_per_rank;     /* elements this rank holds */
    double allreduces_per_step; /* measured on the tp group, timed steps */
    double bytes_tp_per_step, bytes_dp_per_step;   /* per rank, measured */
} tp_train_run;

/* Cuts world into tp groups of t adjacent ranks (as on one NVLink island) and dp
 * groups of the ranks with the same tp rank: rank = dp_index * t + tp_rank. */
void tp_mesh_split(comm *world, int t, comm **tp, comm **dp);

/* world = tp x dp ranks, laid out by tp_mesh_split. Every rank trains; world rank 0
 * gathers and compares. */
void tp_train(comm *world, comm *tp, comm *dp, const run_config *cfg,
              const dataset *data, const baseline_run *baseline, tp_train_run *out);
void tp_train_run_free(tp_train_run *r);
/* The textbook bytes each rank sends per step (ring all-reduce). */
double tp_bytes_formula(const gpt_config *m, int B_local, int T, int tp, int dp,
                        size_t params_per_rank);

/* Wire time of TP's all-reduces on NVLink, InfiniBand and Ethernet (the course's
 * speeds) next to the compute: for this run (t ranks, B_local sequences) and for one
 * GPT-3 layer with TP 8 on H100s (link_projection.c). */
void print_link_projection(const run_config *cfg, int t, int B_local,
                           double compute_ms_per_step);

#endif
