/* Chapter 4 without --simulate: every chosen schedule trained on real ranks, compared
 * with the baseline, with the measured bubble, activations and bytes per stage next to
 * their formulas, and the last step drawn per rank. */
#ifndef PIPELINE_TRAINING_H
#define PIPELINE_TRAINING_H

#include "cli.h"
#include "simulate.h"
#include "pp_train.h"

/* The compute model's default on real ranks: a forward of one micro-batch through a
 * stage lasts 20 ms, well above the default model's real compute even with four ranks
 * sharing two busy cores, so the measured bubble is the schedule's. */
#define PIPELINE_TRAIN_STAGE_MS 20.0

/* Runs the schedules of c->runs (stage_ms: the compute model, 0: off); returns the
 * exit status (1 when a schedule missed a tolerance). */
int pipeline_train(const pipeline_sim_config *c, const run_config *cfg);

/* The title of a trained schedule's SVG: its name, p, m, v and the measured bubble. */
void pipeline_svg_title(const strategy_outcome *run, char *out, size_t size);

#endif
