/* Host float vectors compared: how far apart two results are. */
#ifndef FLOATS_H
#define FLOATS_H
#include <stddef.h>

/* Largest |a[i] - b[i]| over n floats of host memory (a NaN: infinity). */
double max_abs_diff(const float *a, const float *b, size_t n);

#endif
