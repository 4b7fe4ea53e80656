/* Context parallelism (CP) in the planner: the memory and the traffic of a mesh whose
 * cp ranks each hold s / cp positions of every sequence (chapter 9 runs it:
 * common/parallel/cp/cp_attention.h).
 *
 * Memory. Everything but attention works token by token, so a rank keeps Korthikanti's
 * per-layer activations of its chunk: the s b h terms divided by cp. What attention
 * keeps on top (16-bit elements, 2 bytes; t-way TP splits the heads):
 *   ring     no s x s probabilities: blockwise, an online softmax keeps one fp32
 *            log-sum-exp per query and head (4 a s b / (t cp) bytes), and one K/V block
 *            of another rank in flight (2 s b h / (t cp) elements: 4 s b h / (t cp) B)
 *   ulysses  after the all-to-all a rank holds the whole sequence for a / (t cp) heads:
 *            their Q, K, V and output beside the chunk's (4 s b h / (t cp) elements:
 *            8 s b h / (t cp) B) and their probabilities, Korthikanti's 5 a s^2 b / t
 *            divided by cp (dropped by selective recomputation)
 * Full recomputation keeps the layer input of the chunk, 2 s b h / cp (/ t with SP).
 *
 * Traffic per layer per micro-batch, bytes one rank sends; a chunk is b x s/cp x h/t
 * elements of precision.activation bytes (a rank's heads only):
 *   ring     forward: cp-1 K/V blocks (2 chunks each); backward: cp-1 K/V blocks again
 *            and cp dK/dV blocks (the last hop takes them home): (6 cp - 4) chunks, the
 *            2 cp of dK/dV in fp32 (sums that grow on every hop, not rounded on the way);
 *            full recomputation sends the forward's blocks once more: + 2 (cp-1)
 *   ulysses  4 all-to-alls forward (Q, K, V to heads; the output back) and 4 backward
 *            (dO; dQ, dK, dV), each sending (cp-1)/cp of a chunk: 8 (cp-1)/cp chunks;
 *            full recomputation: 4 more
 * (chapter 9's formulas, cp_attention_bytes_formula).
 * Time: the ring's 3 cp - 2 (forward and backward) sends as point-to-point messages, the
 * all-to-alls as (cp-1) alpha + (cp-1)/cp chunk / beta each, on the CP group's link (tp
 * ranks apart: Megatron orders tp, cp, dp, pp). Counted as not overlapped with the
 * attention's compute, as every other collective here (ring attention can hide a block's
 * send behind the previous block's compute when the chunk is long enough). */
#ifndef PLAN_CP_H
#define PLAN_CP_H

#include "plan_mesh.h"

/* Bytes of a chunk: b x s/cp x h/t elements. */
double plan_cp_chunk_bytes(const plan_model *m, const plan_mesh *mesh, double element_bytes);
/* Chunks one rank sends per layer per micro-batch (see above); 0 without CP. */
double plan_cp_chunks_per_layer(const plan_mesh *mesh);
/* Bytes one rank sends per layer per micro-batch. */
double plan_cp_bytes_per_layer(const plan_model *m, const plan_mesh *mesh,
                               double element_bytes);
/* Korthikanti's activation bytes of one layer (2-byte elements) on a rank of the mesh:
 * plan_layer_activations for cp 1, the chunk's and attention's as above else. */
double plan_layer_activations_cp(const plan_model *m, const plan_mesh *mesh);
/* Seconds of one layer's CP messages for one micro-batch on `link`. */
double plan_cp_seconds_per_layer(const plan_model *m, const plan_mesh *mesh,
                                 double element_bytes, double latency, double bandwidth);

#endif
