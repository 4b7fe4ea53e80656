#include "floats.h"

#include <math.h>

double max_abs_diff(const float *a, const float *b, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}
