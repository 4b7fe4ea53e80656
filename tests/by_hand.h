/* The planner's suites (test_chapter6_cp, _failures, _moe): a formula's value against
 * its hand computation. EXACT(value, expected) asserts they agree within TOLERANCE,
 * relative to max(|expected|, 1), and keeps the largest difference in `worst` for the
 * line each suite prints. */
#ifndef BY_HAND_H
#define BY_HAND_H
#include <check.h>
#include <math.h>

#define TOLERANCE 1e-12

static double worst;   /* largest relative difference seen by the suite */

static inline int agrees(double value, double expected) {
    return fabs(value - expected) <= TOLERANCE * fmax(fabs(expected), 1);
}

#define EXACT(value, expected)                                                           \
    do {                                                                                 \
        const double v_ = (value), e_ = (expected);                                      \
        const double d_ = fabs(v_ - e_) / fmax(fabs(e_), 1);                             \
        if (d_ > worst) worst = d_;                                                      \
        ck_assert_msg(agrees(v_, e_), "%s = %.17g, by hand %.17g", #value, v_, e_);      \
    } while (0)

#endif
