/* Host float vectors compared: how far apart two results are. */
#ifndef FLOATS_H
#define FLOATS_H
#include <stddef.h>

/* Largest |a[i] - b[i]| over n floats of host memory (a NaN: infinity). */
double max_abs_diff(const float *a, const float *b, size_t n);
/* ||a - ref|| / ||ref|| over n floats, summed in double (0 when ref is all zero), and,
 * when lost is not NULL, the share of ref's non-zero elements that a holds as 0. */
double relative_l2_diff(const float *a, const float *ref, size_t n, double *lost);

#endif
