/* Runs a pipeline schedule's op lists (pp_schedule.h) on real ranks: the passes on this
 * rank's stages (pp_stage.h), the sends and receives between them, in the list's order.
 *
 * Micro-batch slots: a micro-batch takes a free activation slot of its chunk when it
 * first arrives (its receive or its forward) and gives it back once its activations
 * are no longer needed (after its backward, or its W). So a stage's slots, hence its
 * measured activation memory, are the micro-batches it really holds at once: m for
 * GPipe, p - r on rank r for 1F1B. Activations received before their forward, and an
 * input gradient waiting to be sent, stay in boxes of their own (tagged comm).
 *
 * The compute model (stage_seconds > 0): a forward of one micro-batch through a whole
 * stage lasts stage_seconds, a backward twice that (zero-bubble: B and W once each);
 * a chunk of an interleaved rank holds 1/v of the stage and takes 1/v of those. The
 * rank computes, then sleeps out the rest, so idle time means the same on any machine
 * (several ranks share a core here). */
#ifndef PP_EXECUTE_H
#define PP_EXECUTE_H

#include "pp_schedule.h"
#include "pp_stage.h"

typedef struct {
    const pp_schedule *schedule;
    int rank;                 /* in the pipeline group */
    pp_stage *chunks;         /* [v] this rank's stages, chunk c = virtual stage c*p + rank */
    const run_config *cfg;
    const dataset *data;
    int first_sequence;       /* this pipeline's first sequence of the global batch */
    int micro_stride;         /* sequences from one of its micro-batches to the next */
    float dloss;              /* d(objective)/d(one token's loss) */
    double stage_seconds;     /* the compute model; 0: off */
    int drop_weight_pass;     /* negative control: the step's first W not computed */
    /* one stage: called with each slab of the step's last backward as it is done (DDP's
     * buckets start there), or NULL */
    gpt_slab_ready_fn last_backward_slab_ready;
    void *slab_ctx;
    int weight_passes;        /* W passes run this step */
    /* slots */
    int *slot_of;             /* [v x m]: the slot micro-batch i holds on chunk c, or -1 */
    int *slot_busy;           /* [v x m]: which slots are taken */
    /* boxes hold boundary tensors in the model's precision */
    void **inbox;             /* [v x m]: input activations received, until the forward */
    void **outbox;            /* [v x m]: d(input) of micro-batch i of chunk c, until sent */
    int *grad_sent;           /* [v x m]: its d(input) has gone */
    void **spare;             /* in- and outbox buffers not in use (at most 2 v m) */
    int spares;
    int in_flight, in_flight_peak;   /* micro-batches held now / at most, all chunks */
    /* the last step, measured (seconds from its start) */
    pp_span *spans;           /* [ops of this rank] */
    int nspans;
    double busy_seconds, finish_seconds;
    double overrun_seconds;   /* compute model: passes that ended later than modelled
                                 (computing longer, or the sleep woke late) */
} pp_executor;

void pp_executor_init(pp_executor *e, const pp_schedule *schedule, int rank, pp_stage *chunks,
                      const run_config *cfg, const dataset *data, int first_sequence,
                      int micro_stride, float dloss, double stage_seconds);
void pp_executor_free(pp_executor *e);

/* Runs one step's lists from time `start` (comm_now(), the same moment on every rank of
 * the pipeline: after a barrier). Gradients accumulate in the chunks' replicas. Returns
 * the mean loss of this pipeline's micro-batches on the rank of the last stage, 0 on
 * the others. */
float pp_execute_step(pp_executor *e, int step, double start);

/* The compute model's wait: sleeps until `until` (comm_now() seconds) in short slices,
 * with comm_progress(c) between, so that messages this rank sent keep moving (under
 * Open MPI a large one otherwise waits for the sender's next MPI call). */
void pp_compute_model_wait(comm *c, double until);

#endif
