/* golden_fixture.h: what the tests that read the shared golden fixtures (shared/golden/) share:
 * where the folder is and the log-softmax the fixtures' logprobs are compared with. */
#ifndef TD_TEST_GOLDEN_FIXTURE_H
#define TD_TEST_GOLDEN_FIXTURE_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char golden_dir[4096];

/* Put the golden folder's path in golden_dir: $TD_GOLDEN_DIR, else
 * $TD_SOURCE_ROOT/../shared/golden (meson sets TD_SOURCE_ROOT). True when it can be read. */
static bool have_golden(void)
{
    const char *g = getenv("TD_GOLDEN_DIR");
    const char *src = getenv("TD_SOURCE_ROOT");
    if (g)
        snprintf(golden_dir, sizeof(golden_dir), "%s", g);
    else
        snprintf(golden_dir, sizeof(golden_dir), "%s/../shared/golden", src ? src : ".");
    return access(golden_dir, R_OK) == 0;
}

/* log softmax(logits)[id] over V values, in double. */
static double log_softmax_at(const float *logits, int V, int id)
{
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++)
        mx = fmax(mx, logits[i]);
    for (int i = 0; i < V; i++)
        sum += exp((double)logits[i] - mx);
    return (double)logits[id] - mx - log(sum);
}

#endif
