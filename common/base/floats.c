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

double relative_l2_diff(const float *a, const float *ref, size_t n, double *lost) {
    double diff = 0, norm = 0;
    size_t nonzero = 0, zeroed = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        diff += d * d;
        norm += (double)ref[i] * ref[i];
        if (ref[i] != 0) {
            nonzero++;
            zeroed += a[i] == 0;
        }
    }
    if (lost) *lost = nonzero ? (double)zeroed / (double)nonzero : 0;
    return norm > 0 ? sqrt(diff / norm) : 0;
}
