/* What any strategy's run produced, for the tables, the JSON and the tests, and one way
 * to launch a strategy and get it back.
 *
 *   caller:   strategy_outcome_alloc (host buffers, before any rank starts)
 *   ranks:    the strategy's rank function trains with train_loop, then
 *             strategy_outcome_take_run / _measure_comm / _measure_state fill `out`
 *   caller:   reads world rank 0's outcome; strategy_outcome_free
 *
 * The buffers that outlive the ranks (loss, step times, first gradients, final
 * parameters) exist only in the caller's outcome, which only world rank 0 writes; the
 * other ranks get an outcome without buffers. A rank stopped half-way (a failure, a
 * diverging loss) thus holds nothing of them, and the caller frees them whatever the
 * launch's status. */
#ifndef STRATEGY_OUTCOME_H
#define STRATEGY_OUTCOME_H
#include <stddef.h>

#include "baseline.h"
#include "comm.h"
#include "report.h"
#include "run_config.h"
#include "train_loop.h"

typedef struct {
    run_result result;     /* the comparison row; time, comm and peaks of the largest rank */
    int world_size;
    size_t num_params;     /* of the whole model: the length of first_grads, final_params */
    /* world rank 0 only (NULL on the other ranks): */
    float *loss;           /* [cfg->steps] global-batch mean per step run */
    double *step_seconds;  /* [cfg->steps] world rank 0's */
    float *first_grads;    /* [num_params] step 1's reduced gradients, before the update */
    float *final_params;   /* [num_params] the parameters after the last step */
    /* per timed step, largest rank (strategy_outcome_measure_comm) */
    double comm_calls[COMM_NKINDS], comm_bytes[COMM_NKINDS], comm_seconds[COMM_NKINDS];
    double async_seconds, hidden_seconds;
    /* model-state bytes held between steps by tag, largest rank: params, grads,
     * optimizer (strategy_outcome_measure_state) */
    double state[3];
    /* the strategy's own numbers (its header names the type), owned by the caller, filled
     * by world rank 0; NULL: not wanted */
    void *extra;
} strategy_outcome;

/* Host buffers for a run of cfg's model and steps; zeroes everything else but `extra`. */
void strategy_outcome_alloc(strategy_outcome *o, const run_config *cfg);
void strategy_outcome_free(strategy_outcome *o);
/* Whether this outcome is the one with the buffers (world rank 0's). */
int strategy_outcome_keeps(const strategy_outcome *o);

/* The loop's row, loss and step times into `out` (buffers where it has them); frees run. */
void strategy_outcome_take_run(strategy_outcome *out, train_outcome *run);
/* train_loop of strategy over cfg's global batch, then strategy_outcome_take_run: the
 * rank's whole training, as every strategy runs it. */
void strategy_outcome_train(comm *world, const run_config *cfg, const train_strategy *strategy,
                            strategy_outcome *out);
/* The differences of world rank 0's outcome against the baseline, into out->result. */
void strategy_outcome_compare(strategy_outcome *out, const baseline_run *baseline);
/* Per timed step from stats (the strategy's own groups' traffic), maximum over world's
 * ranks (collective over `metrics`, a group of world's ranks kept apart from the
 * strategy's traffic). */
void strategy_outcome_measure_comm(strategy_outcome *out, comm *metrics, const comm_stats *stats);
/* The model-state bytes held at `at_end` less those at `at_start`, by tag, maximum over
 * the ranks of `metrics`. */
void strategy_outcome_measure_state(strategy_outcome *out, comm *metrics,
                                    const mem_stats *at_start, const mem_stats *at_end);

/* One rank of a strategy: `out` is the caller's outcome on world rank 0, a rank-local
 * one without buffers elsewhere (same extra pointer: write it on world rank 0 only). */
typedef void (*strategy_rank_fn)(comm *world, void *args, strategy_outcome *out);

/* strategy_outcome_alloc(rank0_out, cfg), then launch() on cfg->comm's ranks running
 * rank_fn. rank0_out->extra is kept. Returns launch's status; the caller frees
 * rank0_out whatever it is. In an MPI process without world rank 0 the outcome keeps
 * its buffers unwritten. */
int strategy_launch(const run_config *cfg, strategy_rank_fn rank_fn, void *args,
                    strategy_outcome *rank0_out);
/* The same on this process's threads alone, whatever launched it (under mpirun: a
 * one-device run on world rank 0's process, cfg->comm.ranks 1). */
int strategy_launch_threads(const run_config *cfg, strategy_rank_fn rank_fn, void *args,
                            strategy_outcome *rank0_out);
/* Either of them (threads_only) for a model whose whole vector holds num_params, not
 * cfg's dense model's (the MoE model's, its MoE blocks without their MLPs). */
int strategy_launch_sized(const run_config *cfg, size_t num_params, int threads_only,
                          strategy_rank_fn rank_fn, void *args, strategy_outcome *rank0_out);
/* Inside a rank_main that runs several strategies one after the other: the outcome
 * this rank writes to (the caller's on world rank 0, else `local`, cleared). */
strategy_outcome *strategy_outcome_for_rank(comm *world, strategy_outcome *callers,
                                            strategy_outcome *local);

#endif
