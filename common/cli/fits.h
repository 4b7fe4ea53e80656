/* Whether a training run fits this machine, decided before any rank (or the baseline)
 * starts: a size product that overflows, or a run whose memory would exceed what the
 * machine has, is one clear line and exit status 2 instead of an allocation failing
 * minutes later.
 *
 * The estimate is a lower bound, on purpose (refuse only what cannot work): the
 * baseline's whole model state (parameters, gradients, two AdamW moments: 16 bytes a
 * parameter) and activations for the whole batch, plus the ranks on this machine, who
 * hold `model_share_per_rank` of the model state each (DDP 1, TP 1/t, PP 1/p) and
 * their part of the batch's activations. For the baseline the estimate is within 1%
 * below what the allocator then holds (tests/test_model.c). */
#ifndef FITS_H
#define FITS_H

#include "cli.h"

/* Bytes of activations and backward scratch gpt_model_create holds for B sequences of
 * ctx tokens of the whole model (the same buffers, counted in double: no overflow). */
double fits_activation_bytes(const gpt_config *m, double sequences);

/* The estimate above, in bytes, for ranks_here ranks on this machine (0: the baseline
 * alone) out of cfg->comm.ranks. */
double fits_estimate_bytes(const run_config *cfg, int ranks_here, double model_share_per_rank);

/* Memory this process may use: physical memory, or the cgroup's limit if lower. */
double fits_machine_bytes(void);

/* Exits 2 with one line when the run cannot fit (see above); ranks here: every rank
 * on the threads backend, this node's processes under mpirun. */
void fits_check_or_exit(const run_config *cfg, double model_share_per_rank);

/* The same for a model with more than the dense GPT's parameters (a mixture of experts:
 * routers and experts too): the baseline holds `params`, each rank `params_per_rank`. */
void fits_check_params_or_exit(const run_config *cfg, double params, double params_per_rank);

#endif
