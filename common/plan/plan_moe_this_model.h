/* The planner's mixture of experts by THIS model's count (plan_moe.h counts the papers'):
 * what chapter 11's MoE mesh holds and sends, so that --predict-chapters can hold it
 * against a run to the byte.
 *
 * Parameters on a rank (l_e MoE layers of its stage, E experts of f hidden, top-k, ep):
 *   dense     this model's (plan_mesh_params_per_gpu, PLAN_TP_THIS_MODEL) without the
 *             MLP of each MoE layer (8 h^2 / t + 4 h / t + h on a tp rank: the model keeps
 *             no MLP weights in its MoE blocks), ZeRO-sharded over dp_shard x cp in the
 *             run's precision
 *   routers   h E a MoE layer, whole on every rank, fp32 (4 + 4 + 8 B), sharded and
 *             reduced with the dense part over dp_shard x cp, their gradient fp32 on the wire
 *   experts   E / ep of each MoE layer, 2 h f + f + h each, whole on every tp rank, fp32,
 *             sharded and reduced over expert_dp = dp x cp / ep (no replicas); in 16 bits
 *             also their 16-bit copy, 2 B each and the one byte its allocation adds
 * Activations: this model's dense count (plan_this_model_activations) less the MLP
 * buffers an MoE block does not hold (its fc and GELU outputs, 8 N h / t elements a MoE
 * block per micro-batch slot, and their gradients' 8 N h / t where the stage has no
 * dense block), plus the MoE layer's buffers (moe.c), on N = b s / cp tokens
 * a micro-batch and rows = min(ep N k, capacity E / ep) an expert rank may receive
 * (capacity ceil(c N dp cp k / E), c the capacity factor; 0: no dropping, ep N k):
 *   every MoE block of the model, per micro-batch slot: probabilities N E, choices,
 *   gates, positions and order 4 N k, the outputs N k C and the experts' inputs, fc and
 *   GELU outputs rows (C + 2 f), fp32; counts E + ep E / ep and statistics 3 E doubles
 *   once: the send N k C, receive, rows and their gradient rows C each, the hidden
 *   gradient rows f, the gates' and probabilities' gradients N k + N E, the router's
 *   input gradient N C, fp32; the exchange's counts 4 ep, the gathered statistics
 *   (2 + dp cp) E and each MoE layer's load E doubles
 *   16 bits: the input and output widened (2 N C fp32) and the experts' rows in 16 bits
 *   (2 rows C + rows f)
 * Bytes: dp as plan_bytes_sent's, the routers' fp32 gradient added; expert_dp the
 * experts' (plan_dp_bytes over expert_dp). The all-to-alls on ep carry the rows the
 * routing sends, which the data decides: they are measured, not planned here (plan_moe.h
 * has the uniform-routing estimate).
 * Held to the byte against chapter 11 for one stage (pp 1) at ZeRO 0-2; with stages the
 * first stage's MoE layers are counted. */
#ifndef PLAN_MOE_THIS_MODEL_H
#define PLAN_MOE_THIS_MODEL_H

#include "plan_moe.h"
#include "plan_time.h"

/* Parameters of the first stage's rank: the dense part with the routers, and its experts. */
double plan_moe_this_model_dense_params(const plan_model *m, const plan_moe *moe,
                                        const plan_mesh *mesh);
double plan_moe_this_model_expert_params(const plan_model *m, const plan_moe *moe,
                                         const plan_mesh *mesh, int ep);
/* Model states at their peak and activations on that rank. */
plan_bytes plan_moe_this_model_memory(const plan_model *m, const plan_moe *moe,
                                      const plan_mesh *mesh, int ep, plan_precision precision);
/* plan_bytes_sent with the MoE model's dp and its expert_dp. */
plan_group_bytes plan_moe_this_model_bytes(const plan_model *m, const plan_moe *moe,
                                           const plan_mesh *mesh, int ep,
                                           plan_precision precision);

#endif
