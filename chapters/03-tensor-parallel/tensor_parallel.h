/* Chapter 3, tensor parallelism: what the three parts and the tests share.
 *
 *   matrix_split.c  part 1: y = W x split by outputs (column-parallel) and by inputs
 *                   (row-parallel), and Megatron's f and g operators
 *   block_demo.c    part 2: one transformer block built from those layers
 *   part 3          the whole model trained with TP (x DP): the library's tp_train.h,
 *                   checked against the single-device baseline in main.c
 *   link_projection.c  part 3's arithmetic: TP's all-reduces on NVLink, IB, Ethernet
 *   main.c          flags, the baseline, launch, the printed report */
#ifndef TENSOR_PARALLEL_H
#define TENSOR_PARALLEL_H
#include <stddef.h>

#include "comm.h"
#include "model.h"
#include "report.h"
#include "mesh.h"
#include "tp_linear.h"
#include "tp_slices.h"
#include "baseline.h"
#include "replica.h"
#include "tp_train.h"

/* ---- part 1: y = W x by hand --------------------------------------------------------- */
typedef struct {
    int rows, cols;                           /* W is rows x cols */
    double diff_column, diff_row;             /* largest |y_split - y_whole| */
    double bytes_gather, bytes_reduce;        /* sent per rank, measured */
    double formula_gather, formula_reduce;    /* ring formulas */
} split_report;
void part1_matrix_split(comm *tp, const run_config *cfg, split_report *out);

/* ---- part 2: one Megatron block -------------------------------------------------------- */
/* The model's own block (common/model.c: gpt_block_forward / gpt_block_backward), run
 * as a one-block pipeline stage so that its input and output gradient can be given and
 * its output and input gradient read. */
typedef struct {
    int drop_f_backward;   /* test only: the negative control, f backward = identity */
} megatron_block_options;

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

/* Wire time of TP's all-reduces on NVLink, InfiniBand and Ethernet (the course's
 * speeds) next to the compute: for this run (t ranks, B_local sequences) and for one
 * GPT-3 layer with TP 8 on H100s (link_projection.c). */
void print_link_projection(const run_config *cfg, int t, int B_local,
                           double compute_ms_per_step);

#endif
