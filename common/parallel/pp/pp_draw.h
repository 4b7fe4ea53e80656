/* Pictures of a pipeline schedule from its spans (pp_span: simulated by pp_sim, or
 * measured on real ranks), one row per rank over time, like the course text's diagram.
 *
 * Terminal, one chunk per rank: each pass is a run of columns in proportion to its
 * time, starting with its letter and micro-batch number ("F3--", "B3------", "W3"),
 * idle time blank:
 *     rank 0 |F0F1F2F3      B0--B1--B2--B3--|
 *     rank 1 |  F0F1F2F3  B0--B1--B2--B3--  |
 * A pass narrower than its label shows its letter only.
 * Terminal, several chunks per rank (interleaved): time in fixed-width cells, each as
 * long as a chunk's forward; a pass starts with a cell naming letter, micro-batch and
 * chunk ("F3.1", zero-padded to the widest), its other cells are "----"; a row longer
 * than `width` goes on in another band below; a key line ends the picture:
 *     rank 0 |F0.0F1.0F0.1F1.1    B0.1----B1.1----B0.0----B1.0----|
 * SVG: one row per rank, a colour per pass (F, B, Bi, W) in one shade per chunk, each
 * box labelled with its micro-batch (and ".chunk" for several chunks), a time axis in ms
 * (or in the simulator's units) and a legend. */
#ifndef PP_DRAW_H
#define PP_DRAW_H
#include <stdio.h>

#include "pp_schedule.h"

/* width: columns for the time axis (>= 10); with several chunks, the widest band.
 * ms_per_unit > 0 labels the axis in ms (span times x ms_per_unit), else in the spans'
 * own units. */
void pp_draw_text(FILE *out, const pp_span *spans, int nspans, int ranks, int width,
                  double ms_per_unit);

/* Writes the SVG to path; returns 0, or prints why not and returns -1. */
int pp_draw_svg(const char *path, const pp_span *spans, int nspans, int ranks,
                double ms_per_unit, const char *title);

/* What both pictures share: the spans' first start and last end, and the chunks per
 * rank (the highest chunk of a pass, plus one). */
void pp_draw_time_range(const pp_span *spans, int n, double *t0, double *t1);
int pp_draw_chunks(const pp_span *spans, int n);
/* A pass's cell in the text picture: "F3.1", micro-batch and chunk zero-padded to the
 * digits given. */
void pp_draw_cell_label(const pp_span *s, int micro_digits, int chunk_digits, char *out,
                        size_t size);

#endif
