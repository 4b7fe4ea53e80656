/* Chapter 4's --simulate: the schedules' real op lists on the event simulator, with
 * the bubble next to its formula, the pictures, and --json. */
#ifndef PIPELINE_SIMULATE_H
#define PIPELINE_SIMULATE_H
#include "pp_schedule.h"

typedef struct {
    int pp, micro, chunks;              /* chunks: v, for the interleaved schedule */
    int replicas;                       /* training: pipelines side by side (ranks / pp) */
    int runs[PP_NSCHEDULES];            /* 1: simulate this schedule */
    const char *skipped[PP_NSCHEDULES]; /* why a chosen schedule does not run, or NULL */
    double stage_ms;                    /* forward of one micro-batch on a stage */
    double time_f, time_b, time_w;      /* --simulate: F, B (input), W of a stage, ms */
    double fb_overlap;                  /* dualpipev's F&B on GPU streams (pp_sim.h) */
    double message_bytes;               /* one micro-batch's activations (and gradients) */
    double link_alpha_ms, link_ms_per_byte;   /* the modelled wire; 0: free */
    const char *link_name;
    pp_comm_order order;
    int with_dualpipe;                  /* --schedule all: DualPipe itself too, beside
                                           dualpipev (simulated only: pp_dualpipe_make) */
    const char *svg_path;               /* NULL: no SVG */
    int json;
} pipeline_sim_config;

/* The micro-batches and chunks a schedule runs with: naive takes the whole batch. */
int pipeline_micro_for(const pipeline_sim_config *c, pp_schedule_kind kind);
int pipeline_chunks_for(const pipeline_sim_config *c, pp_schedule_kind kind);

/* FILE as given for one schedule; FILE-<schedule>.svg (before its .svg) for several. */
void pipeline_svg_path(const char *path, const char *name, int several, char *out,
                       size_t size);

/* Simulates every schedule in c->runs and prints the table and pictures (or one JSON
 * object). Returns the exit status: 0, or 1 when a schedule deadlocked or an SVG could
 * not be written. */
int pipeline_simulate(const pipeline_sim_config *c);

#endif
