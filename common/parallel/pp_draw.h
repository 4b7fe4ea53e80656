/* Pictures of a pipeline schedule from its spans (pp_span: simulated by pp_sim, or
 * measured on real ranks), one row per rank over time, like the course text's diagram.
 *
 * Terminal: each pass is a run of cells starting with its letter and micro-batch
 * number ("F3--", "B3------", "W3"), chunk 1 of an interleaved rank in lower case
 * ("f3"), idle time blank:
 *     rank 0 |F0F1F2F3      B0--B1--B2--B3--|
 *     rank 1 |  F0F1F2F3  B0--B1--B2--B3--  |
 * A pass narrower than its label shows its letter only.
 * SVG: one row per rank, a colour per pass (F, B, Bi, W), the micro-batch number in
 * each box wide enough for it, a time axis in ms (or in the simulator's units). */
#ifndef PP_DRAW_H
#define PP_DRAW_H
#include <stdio.h>

#include "pp_schedule.h"

/* width: columns for the time axis (>= 10). ms_per_unit > 0 labels the axis in ms
 * (span times x ms_per_unit), else in the spans' own units. */
void pp_draw_text(FILE *out, const pp_span *spans, int nspans, int ranks, int width,
                  double ms_per_unit);

/* Writes the SVG to path; returns 0, or prints why not and returns -1. */
int pp_draw_svg(const char *path, const pp_span *spans, int nspans, int ranks,
                double ms_per_unit, const char *title);

#endif
