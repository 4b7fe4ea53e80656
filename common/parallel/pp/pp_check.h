/* The dependency check of a schedule as it ran (simulated or measured): whatever the
 * order of the lists, every pass must come after what it needs, and every message must
 * have its one receive. The simulator runs lists in order and so cannot tell a list
 * that skips a W or puts a backward before its forward; this says so, with the pass.
 *
 *   for every micro-batch i and virtual stage k of S = p x v:
 *     one F, and either one B or one B (input) and one W
 *     F(i, k)   starts after F(i, k-1) ends               (k > 0)
 *     B(i, k)   starts after F(i, k) and B(i, k+1) end      (k < S-1 for the second)
 *     W(i, k)   starts after B(i, k) ends
 *   every send on a rank has one receive of the same message on its peer. */
#ifndef PP_CHECK_H
#define PP_CHECK_H
#include <stddef.h>

#include "pp_schedule.h"

/* 1 when spans (every pass of one step, any order; sends and receives are skipped)
 * and s's lists pass; else 0 with the first broken rule in err. */
int pp_check_dependencies(const pp_schedule *s, const pp_span *spans, int nspans, char *err,
                          size_t size);

#endif
