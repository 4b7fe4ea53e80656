/* Chapter 7, communication: what the parts and the tests share.
 *
 *   links.c       the wires: bandwidth, latency, their ratios, one gradient all-reduce
 *   algorithms.c  ring, naive and recursive doubling, measured against alpha-beta
 *   ladder.c      DDP's efficiency, rung by rung: overlap, accumulation, compression
 *   on_links.c    DDP, FSDP (ZeRO-3) and TP on every link
 *   plot.c        --svg: efficiency against link bandwidth
 *   main.c        flags, the parts in order, the printed report and --json
 *
 * Every time here is wall time on the threads backend with the modelled wire
 * (comm.h: comm_link); every prediction is plan_time.c's alpha-beta arithmetic. */
#ifndef COMMUNICATION_H
#define COMMUNICATION_H
#include <stddef.h>

#include "cli.h"
#include "comm.h"
#include "data.h"
#include "plan_time.h"

enum { ALGORITHMS = 3 };   /* ring, naive, doubling: comm_allreduce_algo's order */
const char *algorithm_name(comm_allreduce_algo algo);

/* The alpha-beta time of one all-reduce of `bytes` per rank (plan_time.c). */
double predict_allreduce(comm_allreduce_algo algo, plan_link link, int ranks, double bytes);

/* ---- all-reduce measurements --------------------------------------------------------- */
typedef struct {
    comm_allreduce_algo algo;
    int ranks;
    size_t bytes;
    double measured_s;    /* median over repetitions, first entry to last exit */
    double predicted_s;
} algo_point;

/* Times one all-reduce of each size in bytes[0..nsizes) on `ranks` thread ranks with
 * the wire of `wire` (its link and link_scale), fp32 sums; measured_s[i] per size. */
int measure_allreduces(const comm_options *wire, comm_allreduce_algo algo, int ranks,
                       const size_t *bytes, int nsizes, double *measured_s);

/* ---- part 1: the links ---------------------------------------------------------------- */
typedef struct {
    comm_link link;
    double bandwidth, latency;        /* bytes/s, s */
    double measured_s, predicted_s;   /* ring all-reduce of the gradients, scale 1 */
} link_row;
enum { LINKS = 3 };                   /* nvlink, ib, ethernet */
int links_measure(const run_config *cfg, size_t gradient_bytes, link_row rows[LINKS]);
void links_print(const link_row rows[LINKS], int ranks, size_t gradient_bytes);

/* ---- part 2: algorithms side by side ---------------------------------------------------- */
typedef struct {
    algo_point *points;
    int count;
    comm_link link;
    double link_scale;
} algo_sweep;
/* Sizes 1 KiB, 4 KiB, ... up to max_bytes, for every algorithm and rank count. */
int algorithms_sweep(const comm_options *wire, const int *ranks, int nranks,
                     size_t max_bytes, algo_sweep *out);
void algorithms_print(const algo_sweep *s);
void algo_sweep_free(algo_sweep *s);

/* ---- part 3: the efficiency ladder -------------------------------------------------------- */
typedef struct {
    const char *name;         /* "basic", "+overlap", "+accum 2", ... */
    int overlap, grad_accum;
    comm_dtype wire;
    int batch;                /* global, sequences: the base batch x grad_accum */
    double tokens_per_s;
    double compute_ms;        /* per step: time not blocked in communication */
    double efficiency;        /* compute_ms / step, the same run's: at most 1 */
    double predicted_efficiency;   /* the model on that same compute time */
    double comm_fraction;     /* blocked share of a step, on the rank blocked least:
                                 1 - efficiency */
    float loss;               /* after the last step */
    double diff_loss;         /* largest per-step |loss - reference| */
    const char *reference;    /* "baseline" (fp32) or the fp32 rung compared with */
    double exposed_ms, predicted_exposed_ms;   /* per step: blocked, not computing */
} ladder_rung;

enum { LADDER_RUNGS = 6 };

typedef struct {
    ladder_rung rungs[LADDER_RUNGS];
    int count;
    double link_scale;        /* the ethernet slow-down used */
    int scale_capped;         /* the calibrated slow-down passed LINK_SCALE_MAX */
    double target_start;      /* efficiency the basic rung was calibrated to (0: the
                                 slow-down was given) */
    double compute_ms;        /* the compute time the slow-down was chosen on: the
                                 basic rung's with no wire */
    double baseline_tokens_per_s;   /* one rank alone, the whole base batch */
    size_t gradient_bytes;    /* in the run's gradient type */
    precision grad_precision; /* 16 bits: no compressed rung (they travel as they are) */
} ladder_report;

/* Ethernet slowed down by link_scale; link_scale <= 0: chosen so the basic rung's
 * predicted efficiency is target_start. max_rungs cuts the ladder short (tests).
 * Every run is repeated `repeats` times and the fastest kept: other programs on the
 * machine only ever slow a run down. */
int ladder_run(const run_config *cfg, const dataset *data, double link_scale,
               double target_start, int max_rungs, int repeats, ladder_report *out);
void ladder_print(const ladder_report *r, int ranks);

/* The model of a rung: step = compute + the wire time not hidden under backward.
 *   buckets: all-reduces of bucket_bytes[i] (launch order), ring on `ranks`, one
 *            after the other
 *   overlapped: under the last micro-step's backward, 2/3 of its compute (backward
 *               is twice the forward's GEMMs); bucket i can start once backward has
 *               produced the gradients up to it (in proportion to their bytes)
 *   not overlapped: all of them after backward
 * (the loss's all-reduce follows the timed step, so it is not part of it) */
double ladder_predicted_exposed(plan_link link, int ranks, const double *bucket_bytes,
                                int buckets, int overlapped, double compute_s,
                                int grad_accum);

/* ---- part 4: DDP, FSDP and TP on each link --------------------------------------------- */
enum { LINK_STRATEGIES = 3 };         /* ddp, fsdp, tp */
typedef struct {
    const char *strategy;
    double ms_per_step[LINKS + 1];    /* [0]: no wire, then nvlink, ib, ethernet */
    double comm_fraction[LINKS + 1];
    double ideal_ms;                  /* the reference: the fastest of the row's runs */
    double efficiency[LINKS + 1];     /* ideal_ms / ms on the link, at most 1 */
    double compute_alone_ms;          /* for scale: DDP with no all-reduce, no wire */
    /* alpha-beta inputs measured per step: sequential messages and bytes per rank */
    double messages_per_step, bytes_per_step;
} link_strategy_row;

/* Each run repeated `repeats` times, the fastest kept (as the ladder does); a row's
 * reference is its fastest run on any wire, none included. */
int on_links_run(const run_config *cfg, const dataset *data, double link_scale, int repeats,
                 link_strategy_row rows[LINK_STRATEGIES]);
void on_links_print(const link_strategy_row rows[LINK_STRATEGIES], double link_scale);
/* Predicted efficiency of a row on a wire: ideal / (ideal + messages alpha +
 * bytes / beta), no overlap assumed. */
double on_links_predicted_efficiency(const link_strategy_row *row, plan_link link);

/* ---- the plot --------------------------------------------------------------------------- */
int plot_write_svg(const char *path, const link_strategy_row rows[LINK_STRATEGIES],
                   double link_scale);

#endif
