/* The arithmetic of ZeRO: model-state bytes per device and communication per step,
 * from the ZeRO paper (Rajbhandari et al., 2019) and as this program stores them.
 *
 * Paper (mixed-precision Adam): fp16 parameters 2P, fp16 gradients 2P, and K bytes per
 * parameter of optimizer state (fp32 master weights, m and v: K = 12):
 *   stage 0 (DDP)  2P + 2P + KP          stage 2  2P + (2 + K)P/N
 *   stage 1        2P + 2P + KP/N        stage 3  (2 + 2 + K)P/N
 * This program in fp32: parameters 4P, gradients 4P, Adam m and v 8P:
 *   stage 0  4P + 4P + 8P    stage 1  4P + 4P + 8P/N    stage 2  4P + (4 + 8)P/N
 *   stage 3  (4 + 4 + 8)P/N
 * and in mixed precision (bf16 / fp16 compute weights, fp32 gradients as Megatron-LM
 * keeps them for bf16, K = 12): the paper's table with 4-byte gradients,
 *   stage 0  2P + 4P + 12P   stage 1  2P + 4P + 12P/N   stage 2  2P + (4 + 12)P/N
 *   stage 3  (2 + 4 + 12)P/N
 * Communication per rank per step, in elements through the collectives: stages 0-2
 * 2P (all-reduce = reduce-scatter + all-gather), stage 3 3P (all-gather in forward,
 * again in backward, reduce-scatter); a ring sends (N-1)/N of that. Reductions move
 * fp32 gradients (16-bit ones with --grad-dtype); in mixed precision the all-gathers
 * move 16-bit weights. */
#ifndef ZERO_FORMULAS_H
#define ZERO_FORMULAS_H

#include "comm.h"
#include "model.h"

#define ZERO_STAGES 4   /* 0 (DDP), 1, 2, 3 (FSDP) */

typedef struct {
    double params, grads, optimizer;
} state_bytes;

static inline double state_total(state_bytes b) { return b.params + b.grads + b.optimizer; }

/* The paper's bytes per device for P parameters on N devices, K bytes of optimizer
 * state per parameter. */
state_bytes zero_paper_bytes(int stage, double P, int N, double K);
/* The same for this program's storage in precision p (fp32 gradients). */
state_bytes zero_stored_bytes(int stage, double P, int N, precision p);
/* ... and with gradients held in gp (--grad-dtype): 16-bit ones make the mixed table
 * the paper's K = 12 column exactly. */
state_bytes zero_stored_bytes_grads(int stage, double P, int N, precision p, precision gp);
/* The largest P whose model state (paper formula) fits in `bytes` per device. */
double zero_largest_model(int stage, double bytes, int N, double K);

/* This program's collectives in one step of a stage: calls and elements per kind
 * (elements = count, twice the count for an all-reduce). */
typedef struct {
    double calls[COMM_NKINDS];
    double elements[COMM_NKINDS];
    double element_bytes[COMM_NKINDS];   /* 4, or 2 for 16-bit weights */
} comm_plan;
comm_plan zero_comm_plan(const gpt_shape *s, int stage, precision p);
/* ... with the reductions (all-reduce, reduce-scatter) moving gradients of gp. */
comm_plan zero_comm_plan_grads(const gpt_shape *s, int stage, precision p, precision gp);
/* Bytes a rank sends for those elements in a ring of N: (N-1)/N x 4 bytes each. */
double ring_bytes(double elements, int N);
/* The same for one kind of a plan, at its element size. */
double plan_ring_bytes(const comm_plan *plan, int kind, int N);

#endif
