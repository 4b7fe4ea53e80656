/* Completing a partly given mesh (mesh.h: mesh_complete). */
#include "mesh.h"

#include <stdio.h>

/* The sizes given, by flag: "--tp 3" or "--tp 2 x --pp 3 = 6". */
static const char *given_sizes(const mesh_shape *m, char *out, size_t size) {
    const char *names[3] = {"tp", "pp", "dp"};
    const int values[3] = {m->tp, m->pp, m->dp};
    int used = 0, count = 0;
    long product = 1;
    out[0] = 0;
    for (int i = 0; i < 3; i++) {
        if (!values[i]) continue;
        used += snprintf(out + used, size - (size_t)used, "%s--%s %d", count ? " x " : "",
                         names[i], values[i]);
        product *= values[i];
        count++;
    }
    if (count > 1) snprintf(out + used, size - (size_t)used, " = %ld", product);
    return out;
}

int mesh_complete(mesh_shape *m, int world, int heads, int layers, char *err, size_t err_len) {
    const int given = (m->tp > 0) + (m->pp > 0) + (m->dp > 0);
    const long known = (long)(m->tp ? m->tp : 1) * (m->pp ? m->pp : 1) * (m->dp ? m->dp : 1);
    if (given == 3) return 1;
    if (world % known) {
        char sizes[96];
        snprintf(err, err_len, "%s does not divide the %d ranks",
                 given_sizes(m, sizes, sizeof sizes), world);
        return 0;
    }
    int left = (int)(world / known);
    if (given == 2) {   /* the one missing is what the world leaves */
        if (!m->tp) m->tp = left;
        else if (!m->pp) m->pp = left;
        else m->dp = left;
        return 1;
    }
    if (!m->tp) m->tp = left % 2 == 0 && heads % 2 == 0 ? 2 : 1, left /= m->tp;
    if (!m->pp) {   /* with dp given, what is left is the pipeline */
        m->pp = m->dp ? left : left % 2 == 0 && layers >= 2 ? 2 : 1;
        left /= m->pp;
    }
    if (!m->dp) m->dp = left;
    return 1;
}
