/* What every program prints: progress lines, the comparison table, --json. */
#ifndef REPORT_H
#define REPORT_H
#include <stdint.h>
#include <stdio.h>

#include "alloc.h"
#include "run_config.h"

/* One strategy's run, as the comparison table and the JSON show it. Differences are
 * the largest |a - b| against the baseline; negative means "not measured". */
typedef struct {
    const char *strategy;
    int steps;
    const float *loss;              /* per step, global-batch mean */
    double diff_loss, diff_grads, diff_params;
    double seconds;                 /* wall time of the timed steps */
    int timed_steps;
    double tokens_per_step;         /* global */
    double comm_seconds;            /* per rank, blocked in communication */
    double comm_seconds_least;      /* ... on the rank blocked least (the last to finish
                                       computing); 0 until run_result_take_max */
    double hidden_seconds;          /* per rank, async communication under compute */
    double bytes_sent_per_step;     /* per rank */
    double tier_bytes_per_step[2];  /* ... of them sent inside a node, between nodes
                                       (comm_tier; the largest rank's each) */
    double bytes_formula;           /* the textbook value for the same; < 0: none */
    mem_stats memory;               /* largest rank */
    double sgemm_floor_seconds;     /* --profile: per step, cblas_sgemm alone at the
                                       slowest rank's own shapes; 0: not measured */
    double fastest_step_seconds;    /* this rank's fastest timed step (the floor is a
                                       best time too: on a shared machine the pair
                                       is steadier than the mean and the floor) */
    const char *json_extra;         /* more keys for this run's JSON object, or NULL */
    float loss_scale;               /* fp16's dynamic loss scale after the last step (1:
                                       none), the same on every rank */
    int skipped_steps;              /* steps whose gradients overflowed: no update */
} run_result;

double run_ms_per_step(const run_result *r);
double run_tokens_per_second(const run_result *r);
double run_comm_fraction(const run_result *r);

/* "  step   3/10  loss 5.1234  12.3 ms  41k tok/s" unless --quiet or --json. */
void report_step(const run_config *cfg, const char *strategy, int step, float loss,
                 double seconds, double tokens);
/* The run's header: title, model, ranks with the backend launch() will really use
 * (launches = 0: the program runs one process without a communicator, as the
 * baseline and DataParallel do), data, device and communicator. */
void report_header(const run_config *cfg, const char *title, int world, int launches);
/* The same, for a model whose parameters the dense shape does not count (a MoE's). */
void report_header_counting(const run_config *cfg, const char *title, int world,
                            int launches, double params);
void report_table(const run_config *cfg, const run_result *runs, int n);
/* One JSON object as docs/json.md defines it; extra (may be NULL) is inserted as more
 * keys of the top-level object, e.g. "\"bubble\": 0.2". */
void report_json(const run_config *cfg, const char *chapter, int world,
                 const char *backend, const run_result *runs, int n, const char *extra);

/* "1.23 MB" style sizes for tables. */
const char *report_bytes(double bytes, char buf[32]);

/* Per-rank measurements -> the row of the table: the largest rank's time,
 * communication, bytes sent and memory (each maximum taken over ranks on its own), and
 * the least time any rank was blocked (comm_seconds_least).
 * Collective over `group`; every rank gets the result. */
void run_result_take_max(comm *group, run_result *r);

/* Fills r's comm_seconds, hidden_seconds and bytes_sent_per_step from this rank's
 * communicator statistics over `steps` steps (call comm_stats_reset before them). */
void run_result_add_comm(run_result *r, comm *world, int steps);

#endif
