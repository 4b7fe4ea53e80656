/* --predict-chapters' measured side: a chapter's --json report (docs/json.md) parsed,
 * and one run's largest-rank bytes and step time taken from it. */
#include "predict.h"

#include <stdio.h>
#include <string.h>

#include "json.h"

/* {"runs": [{"strategy": ..., "ms_per_step": ms,
 *            "memory_per_rank": {"params": B, "grads": B, "optimizer": B,
 *                                "activations": B, ...}, ...}, ...], ...} */
static int figures_of_run(const json_value *run, chapter_figures *out) {
    const json_value *memory = json_get(run, "memory_per_rank");
    return json_double(json_get(run, "ms_per_step"), &out->ms_per_step) &&
           json_double(json_get(memory, "params"), &out->params) &&
           json_double(json_get(memory, "grads"), &out->grads) &&
           json_double(json_get(memory, "optimizer"), &out->optimizer) &&
           json_double(json_get(memory, "activations"), &out->activations);
}

int chapter_json_figures(const char *json, const char *strategy, chapter_figures *out) {
    char err[256];
    json_doc *doc = json_parse(json, strlen(json), err, sizeof err);
    if (!doc) {
        fprintf(stderr, "predict: a chapter's --json does not parse: %s\n", err);
        return 0;
    }
    const json_value *runs = json_get(json_root(doc), "runs");
    const json_value *run = json_find(runs, "strategy", strategy);
    const int found = run && figures_of_run(run, out);
    json_free(doc);
    return found;
}
