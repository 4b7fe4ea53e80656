/* --predict-chapters' output: predicted against measured, as a table or as JSON. */
#ifndef PREDICT_REPORT_H
#define PREDICT_REPORT_H

#include "predict.h"

/* One strategy on one rank count: what the formulas said and what the run measured. */
typedef struct {
    int ranks;
    const chapter_strategy *strategy;
    chapter_figures predicted, measured;
    double gflops;           /* the sgemm rate the prediction used */
} predict_comparison;

/* The table, with the sgemm rates measured for 2 and 4 ranks, the core count and the
 * chapters' precision. */
void predict_print_table(const predict_comparison *rows, int n, double gflops_2,
                         double gflops_4, int cores, precision dtype);
/* {"chapter": "06-choose", "precision": ..., "predict_chapters": [...]  (the caller
 * adds its keys and closes the object) */
void predict_print_json(const predict_comparison *rows, int n, precision dtype);

#endif
