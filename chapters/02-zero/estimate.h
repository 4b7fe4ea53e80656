/* --estimate: ZeRO's model-state bytes per device for any model size and world, by the
 * formulas of zero_formulas.h (the paper's and this program's fp32 storage), without
 * training. */
#ifndef ESTIMATE_H
#define ESTIMATE_H

#include "zero_formulas.h"

void estimate_print(double P, int N, double gpu_gb);

#endif
