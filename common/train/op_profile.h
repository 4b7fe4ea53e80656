/* Where a training step's time goes (--profile): every op this thread runs, timed by
 * kind through the ops observer, the matrix products inside the ops by shape, and the
 * floor of the step: the time the products' own kernel alone takes at exactly those
 * shapes. In fp32 every product is a cblas_sgemm; in bf16 and fp16 the linears'
 * products run through matmul16 (oneDNN, or sgemm on widened copies for fp16 where
 * oneDNN has none) and the attention's through sgemm (ops_mixed.c), and each is floored
 * by its own kernel, so that "step / floor" means the same in every precision.
 *
 *   op_profile_start (before the loop) ... op_profile_clear (after the warm-up step)
 *   ... op_profile_stop ... op_profile_report (collective: every rank of the group)
 *
 * On a GPU each op is followed by a device synchronisation, so that it is the op's
 * time and not its launch's that is counted (the step slows down a little). */
#ifndef OP_PROFILE_H
#define OP_PROFILE_H
#include <stdio.h>

#include "comm.h"
#include "ops.h"
#include "precision.h"

#define PROFILE_MAX_SHAPES 128

/* One shape of matrix product, op(A)[M,K] @ op(B)[K,N], and how often it ran. */
typedef struct {
    int trans_a, trans_b, M, N, K;
    op_kind kind;   /* the op it ran in */
    int in_16_bits; /* through matmul16 (16-bit inputs), not cblas_sgemm */
    double calls;
} gemm_shape;

typedef struct {
    double seconds[OP_KINDS], calls[OP_KINDS], bytes[OP_KINDS];
    double gemm_seconds[OP_KINDS], gemm_flops[OP_KINDS];   /* the sgemms inside */
    gemm_shape shapes[PROFILE_MAX_SHAPES];
    int num_shapes;
    double unlisted_gemm_flops;   /* shapes beyond the table: counted, not floored */
    op_kind kind_in_flight;
    double op_start, gemm_start;  /* of the op and the product in flight */
    int on_gpu;
    precision compute;   /* the run's precision: which products are matmul16's */
    ops_observer observer;
} op_profile;

/* Clears p and watches this thread's ops, which compute in `compute` precision. */
void op_profile_start(op_profile *p, precision compute);
void op_profile_clear(op_profile *p);   /* forgets what it saw, keeps watching */
void op_profile_stop(op_profile *p);

/* The OpenBLAS kernel set the sgemms run on ("SkylakeX", or "Haswell" where
 * OPENBLAS_CORETYPE forces it; "Prescott" on a CPU OpenBLAS does not know, which
 * tools/blas-kernel.sh corrects), for the profile and make bench: the same CPU runs AVX2
 * kernels at about half the AVX-512 rate, so a figure means little without it. */
const char *op_profile_blas_kernel(void);

/* The matmul16 implementations the linears' products ran on in the last 16-bit profile
 * reported in this process ("brg:avx512_core_bf16", or the fp16 fallback's fp32
 * kernel; more than one joined by ", "), for --json; "" when there was none. */
const char *op_profile_matmul16_kernel(void);

/* The table, on `out` of world rank 0: per timed step, rank 0 and the group's slowest
 * rank side by side, the product floor of each rank's own shapes beside its times.
 * steps: the timed steps; step_seconds and comm_seconds: this rank's over them;
 * fastest_step: this rank's fastest of them (the floor is a best time too, and on a
 * shared machine the two are steadier together than the mean step and the floor).
 * Collective over group (NULL: a run of one rank). Returns, on every rank, the
 * slowest rank's floor per step in seconds. */
double op_profile_report(const op_profile *p, comm *group, const char *strategy,
                         int steps, double step_seconds, double fastest_step,
                         double comm_seconds, FILE *out);

/* The floor of what p saw: the sum over its shapes of calls x one product's best time
 * at that shape on the kernel it ran on (cblas_sgemm, or matmul16 in a 16-bit run's
 * linears; packed operands, one thread), in seconds; by_kind gets each op kind's part
 * (may be NULL). */
double op_profile_sgemm_floor(const op_profile *p, double by_kind[OP_KINDS]);

#endif
