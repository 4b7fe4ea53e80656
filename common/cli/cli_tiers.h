/* The two-tier network's flags (cli_tiers.c). */
#ifndef CLI_TIERS_H
#define CLI_TIERS_H
#include "run_config.h"

/* After parsing: the three flags (their values: comm_link indices and K) into cfg's
 * comm options, or one line and exit 2. */
void cli_take_tiers(run_config *cfg, int intra, int inter, int ranks_per_node);
/* Once the ranks are known (mpirun's): K divides them, or one line and exit 2. */
void cli_check_tiers(const run_config *cfg);

#endif
