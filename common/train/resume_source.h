/* Which checkpoint a strategy resumes from, when a program saves or resumes several. */
#ifndef RESUME_SOURCE_H
#define RESUME_SOURCE_H
#include <stddef.h>

#include "run_config.h"

/* The checkpoint `strategy` resumes from, into path (resume_source.c has the order).
 * Returns 1, 0 (none: it starts at step 0), or -1 with why in err. */
int resume_source(const run_config *cfg, const char *strategy, char *path, size_t path_len,
                  char *err, size_t err_len);

#endif
