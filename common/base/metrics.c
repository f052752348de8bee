/* metrics.c: a small Prometheus registry: families, series, histograms, text rendering. */
#include "td_metrics.h"
#include "td_error.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double td_buckets_ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                  0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                  20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const size_t td_buckets_ttft_n = TD_ARRAY_LEN(td_buckets_ttft);
const double td_buckets_tpot[] = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
                                  0.75, 1.0,   2.5,  5.0,   7.5,  10.0, 20.0, 40.0, 80.0};
const size_t td_buckets_tpot_n = TD_ARRAY_LEN(td_buckets_tpot);
const double td_buckets_request[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,
                                     5.0,  10.0, 15.0, 20.0, 30.0,  40.0,  50.0,
                                     60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const size_t td_buckets_request_n = TD_ARRAY_LEN(td_buckets_request);

typedef struct family family_t;

struct td_metric {
    family_t *fam;
    char *labels;        /* this series' own labels, "" when none */
    double value;        /* counter / gauge value */
    double sum;          /* histogram: sum of observations */
    uint64_t count;      /* histogram: number of observations */
    uint64_t *buckets;   /* histogram: [n_bounds] non-cumulative counts per bucket */
    td_metric_t *next;
};

struct family {
    char *name;          /* full name, prefix included */
    const char *const_labels; /* the registry's const_labels or vllm_labels */
    char *help;
    td_metric_type_t type;
    double *bounds;      /* histogram: [n_bounds] upper bounds, increasing */
    size_t n_bounds;
    td_metric_t *series; /* in creation order */
    td_metric_t *last;
    family_t *next;
};

struct td_metrics {
    pthread_mutex_t lock;
    char *prefix;
    char *const_labels;  /* "" when none */
    const char *const *vllm_series; /* td_metrics_opts_t.vllm_series; NULL: none */
    char *vllm_labels;   /* "" when none */
    family_t *families;  /* in creation order */
    family_t *last;
};

td_metrics_t *td_metrics_new(const char *prefix, const char *const_labels)
{
    td_metrics_opts_t o = {.prefix = prefix, .const_labels = const_labels};
    return td_metrics_new_opts(&o);
}

td_metrics_t *td_metrics_new_opts(const td_metrics_opts_t *o)
{
    td_metrics_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->prefix = td_strdup(o->prefix ? o->prefix : "");
    r->const_labels = td_strdup(o->const_labels ? o->const_labels : "");
    r->vllm_labels = td_strdup(o->vllm_labels ? o->vllm_labels : "");
    r->vllm_series = o->vllm_series;
    if (!r->prefix || !r->const_labels || !r->vllm_labels) {
        free(r->prefix);
        free(r->const_labels);
        free(r->vllm_labels);
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

void td_metrics_free(td_metrics_t *r)
{
    if (!r)
        return;
    for (family_t *f = r->families, *fn; f; f = fn) {
        fn = f->next;
        for (td_metric_t *m = f->series, *mn; m; m = mn) {
            mn = m->next;
            free(m->labels);
            free(m->buckets);
            free(m);
        }
        free(f->name);
        free(f->help);
        free(f->bounds);
        free(f);
    }
    pthread_mutex_destroy(&r->lock);
    free(r->prefix);
    free(r->const_labels);
    free(r->vllm_labels);
    free(r);
}

/* Whether series (name, labels) is listed in vllm_series; *own_listed: the entry named its labels
 * (the series is then exported without them). */
static bool vllm_listed(const td_metrics_t *r, const char *name, const char *labels,
                        bool *own_listed)
{
    for (const char *const *e = r->vllm_series; e && *e; e++) {
        size_t n = strcspn(*e, "{");
        if (strlen(name) != n || strncmp(*e, name, n) != 0)
            continue;
        if (!(*e)[n]) {
            *own_listed = false;
            return true;
        }
        size_t ln = strlen(*e + n + 1);
        if (ln && (*e)[n + ln] == '}' && strlen(labels) == ln - 1 &&
            strncmp(*e + n + 1, labels, ln - 1) == 0) {
            *own_listed = true;
            return true;
        }
    }
    return false;
}

static family_t *family_get(td_metrics_t *r, const char *name, bool vllm, const char *help,
                            td_metric_type_t type, const double *bounds, size_t n_bounds)
{
    char full[256];
    snprintf(full, sizeof(full), "%s%s", vllm ? "vllm:" : r->prefix, name);
    for (family_t *f = r->families; f; f = f->next) {
        if (strcmp(f->name, full) != 0)
            continue;
        TD_ASSERT(f->type == type);
        TD_ASSERT(f->n_bounds == n_bounds);
        for (size_t i = 0; i < n_bounds; i++)
            TD_ASSERT(f->bounds[i] == bounds[i]);
        return f;
    }
    family_t *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->name = td_strdup(full);
    f->help = td_strdup(help ? help : "");
    f->const_labels = vllm ? r->vllm_labels : r->const_labels;
    f->type = type;
    if (n_bounds) {
        for (size_t i = 1; i < n_bounds; i++)
            TD_ASSERT(bounds[i] > bounds[i - 1]);
        f->bounds = malloc(n_bounds * sizeof(double));
        if (f->bounds)
            memcpy(f->bounds, bounds, n_bounds * sizeof(double));
        f->n_bounds = n_bounds;
    }
    if (!f->name || !f->help || (n_bounds && !f->bounds)) {
        free(f->name);
        free(f->help);
        free(f->bounds);
        free(f);
        return NULL;
    }
    if (r->last)
        r->last->next = f;
    else
        r->families = f;
    r->last = f;
    return f;
}

static td_metric_t *series_get(td_metrics_t *r, const char *name, const char *help,
                               td_metric_type_t type, const char *labels, const double *bounds,
                               size_t n_bounds)
{
    pthread_mutex_lock(&r->lock);
    td_metric_t *m = NULL;
    const char *l = labels ? labels : "";
    bool own_listed = false, vllm = vllm_listed(r, name, l, &own_listed);
    if (own_listed)
        l = "";
    family_t *f = family_get(r, name, vllm, help, type, bounds, n_bounds);
    if (!f)
        goto out;
    for (m = f->series; m; m = m->next)
        if (strcmp(m->labels, l) == 0)
            goto out;
    m = calloc(1, sizeof(*m));
    if (!m)
        goto out;
    m->fam = f;
    m->labels = td_strdup(l);
    if (n_bounds)
        m->buckets = calloc(n_bounds, sizeof(uint64_t));
    if (!m->labels || (n_bounds && !m->buckets)) {
        free(m->labels);
        free(m->buckets);
        free(m);
        m = NULL;
        goto out;
    }
    if (f->last)
        f->last->next = m;
    else
        f->series = m;
    f->last = m;
out:
    pthread_mutex_unlock(&r->lock);
    return m;
}

td_metric_t *td_metrics_counter(td_metrics_t *r, const char *name, const char *help,
                                const char *labels)
{
    return series_get(r, name, help, TD_METRIC_COUNTER, labels, NULL, 0);
}

td_metric_t *td_metrics_gauge(td_metrics_t *r, const char *name, const char *help,
                              const char *labels)
{
    return series_get(r, name, help, TD_METRIC_GAUGE, labels, NULL, 0);
}

td_metric_t *td_metrics_histogram(td_metrics_t *r, const char *name, const char *help,
                                  const char *labels, const double *bounds, size_t n_bounds)
{
    TD_ASSERT(n_bounds > 0);
    return series_get(r, name, help, TD_METRIC_HISTOGRAM, labels, bounds, n_bounds);
}

/* The registry a series belongs to is not stored per series; one global lock per process would
 * serialise unrelated registries, so updates use a striped set of locks keyed by address. */
static pthread_mutex_t stripes[16] = {
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER,
};

static pthread_mutex_t *stripe(const td_metric_t *m)
{
    return &stripes[((uintptr_t)m >> 6) & 15];
}

void td_metric_add(td_metric_t *m, double v)
{
    if (!m || (m->fam->type == TD_METRIC_COUNTER && !(v >= 0)))
        return;
    TD_ASSERT(m->fam->type != TD_METRIC_HISTOGRAM);
    pthread_mutex_lock(stripe(m));
    m->value += v;
    pthread_mutex_unlock(stripe(m));
}

void td_metric_set(td_metric_t *m, double v)
{
    if (!m)
        return;
    TD_ASSERT(m->fam->type == TD_METRIC_GAUGE);
    pthread_mutex_lock(stripe(m));
    m->value = v;
    pthread_mutex_unlock(stripe(m));
}

void td_metric_observe(td_metric_t *m, double v)
{
    if (!m || isnan(v))
        return;
    TD_ASSERT(m->fam->type == TD_METRIC_HISTOGRAM);
    const family_t *f = m->fam;
    /* first bucket whose upper bound is >= v (le semantics); past the last: only +Inf */
    size_t lo = 0, hi = f->n_bounds;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (f->bounds[mid] >= v)
            hi = mid;
        else
            lo = mid + 1;
    }
    pthread_mutex_lock(stripe(m));
    if (lo < f->n_bounds)
        m->buckets[lo]++;
    m->count++;
    m->sum += v;
    pthread_mutex_unlock(stripe(m));
}

double td_metric_value(td_metric_t *m)
{
    pthread_mutex_lock(stripe(m));
    double v = m->fam->type == TD_METRIC_HISTOGRAM ? (double)m->count : m->value;
    pthread_mutex_unlock(stripe(m));
    return v;
}

double td_metric_sum(td_metric_t *m)
{
    pthread_mutex_lock(stripe(m));
    double v = m->sum;
    pthread_mutex_unlock(stripe(m));
    return v;
}

int td_metrics_escape(const char *value, td_buf_t *out)
{
    int rc = 0;
    for (const char *p = value; *p && !rc; p++) {
        if (*p == '\\')
            rc = td_buf_append_str(out, "\\\\");
        else if (*p == '"')
            rc = td_buf_append_str(out, "\\\"");
        else if (*p == '\n')
            rc = td_buf_append_str(out, "\\n");
        else
            rc = td_buf_append_char(out, *p);
    }
    return rc;
}

/* Shortest text that reads back as the same double; integers keep a ".0" as prometheus_client
 * writes them, infinities as +Inf / -Inf. */
static void fmt_double(char *out, size_t n, double v)
{
    if (isinf(v)) {
        snprintf(out, n, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (isnan(v)) {
        snprintf(out, n, "NaN");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, n, "%.1f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

/* name{const,own,extra} value */
static int sample(td_buf_t *b, const char *name, const char *suffix, const char *const_labels,
                  const char *own, const char *extra, double v)
{
    char num[40];
    fmt_double(num, sizeof(num), v);
    bool any = *const_labels || *own || (extra && *extra);
    int rc = td_buf_printf(b, "%s%s", name, suffix);
    if (!rc && any) {
        rc = td_buf_printf(b, "{%s%s%s%s%s}", const_labels, *const_labels && *own ? "," : "",
                           own, (*const_labels || *own) && extra && *extra ? "," : "",
                           extra ? extra : "");
    }
    return rc ? rc : td_buf_printf(b, " %s\n", num);
}

int td_metrics_render(td_metrics_t *r, td_buf_t *out)
{
    static const char *type_names[] = {"counter", "gauge", "histogram"};
    int rc = 0;
    pthread_mutex_lock(&r->lock);
    for (family_t *f = r->families; f && !rc; f = f->next) {
        rc = td_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name,
                           type_names[f->type]);
        for (td_metric_t *m = f->series; m && !rc; m = m->next) {
            pthread_mutex_lock(stripe(m));
            if (f->type != TD_METRIC_HISTOGRAM) {
                rc = sample(out, f->name, "", f->const_labels, m->labels, NULL, m->value);
            } else {
                uint64_t cum = 0;
                char le[64], num[40];
                for (size_t i = 0; i < f->n_bounds && !rc; i++) {
                    cum += m->buckets[i];
                    fmt_double(num, sizeof(num), f->bounds[i]);
                    snprintf(le, sizeof(le), "le=\"%s\"", num);
                    rc = sample(out, f->name, "_bucket", f->const_labels, m->labels, le,
                                (double)cum);
                }
                if (!rc)
                    rc = sample(out, f->name, "_bucket", f->const_labels, m->labels,
                                "le=\"+Inf\"", (double)m->count);
                if (!rc)
                    rc = sample(out, f->name, "_sum", f->const_labels, m->labels, NULL, m->sum);
                if (!rc)
                    rc = sample(out, f->name, "_count", f->const_labels, m->labels, NULL,
                                (double)m->count);
            }
            pthread_mutex_unlock(stripe(m));
        }
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}
