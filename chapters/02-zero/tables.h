/* The chapter's own tables: memory per rank next to the formulas, and communication
 * per rank per step next to theory; and the same as extra --json keys. */
#ifndef TABLES_H
#define TABLES_H

#include "estimate.h"
#include "zero_train.h"

void print_memory_table(const run_config *cfg, const strategy_outcome *runs, int n);
void print_comm_table(const run_config *cfg, const char *backend, int bytes_modelled,
                      const strategy_outcome *runs, int n);
/* The extra top-level JSON keys (malloc'd string). */
char *tables_json(const run_config *cfg, const strategy_outcome *runs, int n);

/* Bytes the largest rank holds beyond the formula because shards are uneven: one
 * element per slab for each sharded vector of the stage. */
double stage_padding_bytes(const strategy_outcome *o, size_t num_params);
/* The model state this program's formula gives for the stage (fp32, 16 bytes/param). */
double stage_stored_formula(int stage, size_t num_params, int N, precision p);
/* ... with gradients held in gp (--grad-dtype) */
double stage_stored_formula_grads(int stage, size_t num_params, int N, precision p,
                                  precision gp);

#endif
