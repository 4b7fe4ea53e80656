/* Training with context parallelism (times tensor and data parallelism), a
 * configuration of the mesh trainer (mesh_train.h, parallelize.h): each rank of a CP
 * group holds a chunk of every sequence of its DP group's batch (the one model, model.h,
 * on the chunk's rows at their own positions, cp_attention_hook.h), its attention
 * crosses the chunks (cp_attention.h: ring or Ulysses), and the gradients, each rank's
 * chunk's share, are summed over the CP and DP groups together (dp_grads.h over the
 * cp x dp ranks, as Megatron-LM's data-parallel-with-CP group). Every rank holds the
 * whole model, fp32, or with TP its Megatron slice (the TP group splits heads and MLP
 * units inside every chunk, and the vocabulary, tp_split_vocab).
 *
 *   loss = (sum over every rank's tokens of their losses) / (batch x ctx): chunks of
 *          equal length, so each token weighs 1/(batch x ctx) wherever it sits. */
#ifndef CP_TRAIN_H
#define CP_TRAIN_H
#include <stdint.h>

#include "cp_attention.h"
#include "data.h"
#include "mesh.h"
#include "run_config.h"
#include "strategy_outcome.h"

enum { CP_MAX_RANKS = 64 };

/* One rank's numbers, per training step. */
typedef struct {
    double attention_work;    /* score entries computed (forward + backward) */
    double cp_bytes;          /* sent on the CP group (K/V blocks, or all-to-alls) */
    double grad_bytes;        /* sent by the gradient reduction (over cp x dp) */
    double activations;       /* activation bytes held, peak (allocator's tag) */
} cp_rank_numbers;

/* The outcome's extra (strategy_outcome.extra), filled by world rank 0. */
typedef struct {
    int tp, cp, dp;
    cp_options opts;
    cp_rank_numbers ranks[CP_MAX_RANKS];   /* [world], in world rank order */
    double cp_bytes_per_layer;              /* largest rank, measured */
    double cp_bytes_per_layer_formula;      /* cp_attention_bytes_formula */
    double work_imbalance;                  /* max / mean of attention_work */
} cp_extra;

/* Whether cp ranks of `world` can split cfg's model and batch this way; if not, one
 * line in err naming the value and what would fit. */
int cp_check_sizes(const run_config *cfg, int world, int tp, int cp, const cp_options *opts,
                   char *err, size_t err_len);

/* Launches cfg->comm.ranks ranks as cp x (ranks / cp) and trains; rank0_out->extra, when
 * set, is a cp_extra. Returns launch's status. */
int cp_launch(const run_config *cfg, const dataset *data, int cp, const cp_options *opts,
              strategy_outcome *rank0_out);
/* The same on tp x cp x (ranks / (tp x cp)) ranks, in the mesh's order. */
int cp_launch_tp(const run_config *cfg, const dataset *data, int tp, int cp,
                 const cp_options *opts, strategy_outcome *rank0_out);

#endif
