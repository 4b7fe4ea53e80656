/* Chapter 12: hiding communication under compute and shrinking it, on a two-tier
 * network (comm.h's comm_tier: fast links inside a node, slow ones between).
 *   exposed.c  TP's collective matmul layer by layer: exposed communication per layer
 *              with and without chunks, against alpha-beta (one chunk of n exposed)
 *   runs.c     whole training runs (TP + SP with and without overlap, FSDP across two
 *              nodes and inside one, HSDP, ZeRO++) on nvlink + ib and nvlink +
 *              ethernet: tokens/s, exposed communication, bytes per tier, each next to
 *              its prediction
 *   plot.c     time per step against the inter-node bandwidth (--svg), the crossings */
#ifndef OVERLAP_H
#define OVERLAP_H

#include "cli.h"
#include "data.h"

/* ---- exposed communication per layer (exposed.c) --------------------------------- */
typedef struct {
    int t;              /* the TP (and SP) group: world ranks 0 .. t-1 */
    int chunks;         /* the collective matmul's */
    int B, T, C;        /* rows B T, a rank's B T / t of them in the SP region */
    int layers;         /* timed, the best kept; one more before them is not */
    precision p;
    comm_options comm;  /* t ranks on its tiers */
    double model_flops; /* the compute model (tp_overlap.h): FLOP/s of a rank */
} exposed_setup;

typedef struct {
    double plain_ms, overlap_ms;                 /* measured, best layer, rank blocked least */
    double plain_formula_ms, overlap_formula_ms; /* alpha-beta */
    double layer_ms[2];                          /* a layer's time: plain, overlapped */
} exposed_times;

typedef struct {
    exposed_times forward, backward;
    comm_tier tier;                              /* the slowest link of the group's ring */
} exposed_result;

/* A layer's four edges of the SP region (qkv and fc column-parallel after an
 * all-gather, proj and fc2 row-parallel before a reduce-scatter), forward and backward,
 * timed without and with chunks. Returns launch's status. */
int exposed_measure(const exposed_setup *s, exposed_result *out);
/* Alpha-beta of one layer's four collectives of B T / t x C elements per rank, each in
 * `chunks` pieces of which one is exposed (chunks 1: all of it): 4 (t-1) x the tier's
 * alpha + piece / beta, on the slowest tier of the group's ring. */
double exposed_formula_seconds(const exposed_setup *s, int chunks);
/* Backward's: without chunks its six collectives of that size (fc's and qkv's input
 * gathered again and dX reduce-scattered, fc2's and proj's dY gathered); with them one
 * chunk of each row layer's dY gather, the column layers' hidden under dX and dW. */
double exposed_backward_formula_seconds(const exposed_setup *s, int chunks);
/* The compute model's rate at which the smallest of a layer's products takes `ratio`
 * times its chunk's collective, chunk by chunk (ratio >= 1: the formula's condition). */
double exposed_rate_for(const exposed_setup *s, double ratio);
/* Sets s->comm.link_scale so that a ring step of a collective without chunks takes
 * step_seconds: threads on a shared machine time a step to about a millisecond. */
void exposed_slow_links(exposed_setup *s, double step_seconds);
/* Within `band` (0.2: 20%) of the formula, both runs and both passes: a wall-clock figure, which a
 * busy machine pushes up (a late wake-up, a peer without a core), so the chapter and
 * make test report it and only make bench (TIMING_CHECKS=1) holds it. */
int exposed_within(const exposed_result *r, double band);
/* No run faster than `band` below its formula: the modelled wire's own time, which no
 * load shortens (what make test holds). */
int exposed_at_least(const exposed_result *r, double band);
void exposed_print(const exposed_setup *s, const exposed_result *r);

/* ---- training runs on two tiers (runs.c) ----------------------------------------- */
enum { ROW_TP, ROW_TP_OVERLAP, ROW_FSDP, ROW_FSDP_NODE, ROW_HSDP, ROW_QWZ, ROW_HPZ, ROW_QGZ,
       ROW_ZEROPP, ROWS };

typedef struct {
    const char *name;
    int ranks;
    double tokens_per_s, exposed_ms;             /* measured: comm blocked per step */
    double wire_ms;                              /* predicted: alpha-beta of the bytes */
    double predicted_tokens_per_s;               /* reference compute + predicted wire */
    double reference_ms;                         /* the same run with no link model */
    double tier_bytes[COMM_NTIERS], tier_formula[COMM_NTIERS];   /* per step, largest rank */
    double worst;                                /* of its tolerance against the baseline */
    int lossy;                                   /* qwZ, qgZ: worst is of the loss band */
    double state_params;                         /* parameter bytes at rest, largest rank */
} tier_row;

typedef struct {
    comm_link inter;
    tier_row rows[ROWS];
} tier_table;

/* The four rows on cfg's ranks as nodes of cfg->comm.ranks_per_node, inter-node link
 * `inter`; TP of one node's size with `chunks` for the overlapped row. */
int tier_table_run(const run_config *cfg, const dataset *data, int chunks, comm_link inter,
                   tier_table *out);
void tier_table_print(const run_config *cfg, const tier_table *t);
/* Every run within its tolerance (the lossy ZeRO++ rows: the loss band) and on its
 * formula's bytes per tier (TP's within 1e-3, ZeRO-3's to the byte), hpZ's memory on its
 * formula. */
int tier_table_passed(const run_config *cfg, const tier_table *t);

/* ---- time per step against the inter-node bandwidth (plot.c) --------------------- */
/* FSDP across both nodes (0), HSDP (1), ZeRO++ all three (2): predicted ms per step at
 * inter-node bandwidth beta (bytes/s), compute_ms plus zeropp_step_predict's wire. */
double plot_step_ms(const run_config *cfg, double compute_ms, int curve, double beta);
/* Where curves a and b cross between 1e6 and 1e11 B/s: 1 and *beta, or 0 (none). */
int plot_crossing(const run_config *cfg, double compute_ms, int a, int b, double *beta);
/* The crossings in one line, and the three times at both ends. */
void plot_print_crossings(const run_config *cfg, const tier_table *table);
/* The SVG: the three lines, the measured steps of `count` tables as dots, the crossings. */
int plot_write_svg(const char *path, const run_config *cfg, const tier_table *tables, int count);

#endif
