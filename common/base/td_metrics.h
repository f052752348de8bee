/* td_metrics.h: Prometheus metrics (text exposition format 0.0.4) for every daemon's /metrics.
 *
 * A registry holds metric families (one name, type, help text and, for histograms, one bucket
 * layout) and their series (one label set each). Every series also carries the registry's
 * constant labels (the daemon's `role`; no `instance`: Prometheus adds that label itself from the
 * scrape target). Names follow vLLM's metric names and suffixes under a `tandem_` prefix, and the
 * bucket layouts below are vLLM's. A registry can also export chosen series under vLLM's exact
 * names (`vllm:` prefix, a `model_name` label: td_metrics_opts_t.vllm_series), so dashboards
 * built for vLLM read them unchanged.
 *
 * Updates are thread-safe (compute threads and the loop may both record). Series pointers stay
 * valid until td_metrics_free.
 */
#ifndef TD_METRICS_H
#define TD_METRICS_H

#include "td_util.h"

#include <stddef.h>

typedef struct td_metrics td_metrics_t;
typedef struct td_metric td_metric_t;

typedef enum td_metric_type {
    TD_METRIC_COUNTER,
    TD_METRIC_GAUGE,
    TD_METRIC_HISTOGRAM,
} td_metric_type_t;

/* vLLM's bucket layouts, in seconds. */
extern const double td_buckets_ttft[];    /* time_to_first_token_seconds */
extern const size_t td_buckets_ttft_n;
extern const double td_buckets_tpot[];    /* time_per_output_token / inter_token_latency */
extern const size_t td_buckets_tpot_n;
extern const double td_buckets_request[]; /* e2e, queue, prefill, decode, inference time */
extern const size_t td_buckets_request_n;

/* A new registry. `prefix` is prepended to every name ("tandem_"); `const_labels` is a label
 * list added to every series, already formatted (`role="decode"`, or NULL).
 * NULL on allocation failure. */
td_metrics_t *td_metrics_new(const char *prefix, const char *const_labels);

/* A registry whose listed series take vLLM's names instead (metrics.vllm_names). */
typedef struct td_metrics_opts {
    const char *prefix;       /* before every other name ("tandem_") */
    const char *const_labels; /* on every other series (`role="decode"`), or NULL */
    /* NULL-terminated list of the series exported as "vllm:" + name with vllm_labels instead of
     * prefix and const_labels; NULL: none. An entry is a name ("kv_cache_usage_perc": every
     * series of it), or a name with one series' own labels ("prefix_cache_hits_total{tier=\"pool\"}":
     * that series only, exported without those labels). The strings must outlive the registry. */
    const char *const *vllm_series;
    const char *vllm_labels; /* constant labels of those (`role="router",model_name="m"`) */
} td_metrics_opts_t;
td_metrics_t *td_metrics_new_opts(const td_metrics_opts_t *o);
void td_metrics_free(td_metrics_t *r);

/* Get or create a series. `labels` is this series' own formatted label list (`reason="stop"`) or
 * NULL; label values must already be escaped (td_metrics_escape). Asking for an existing name
 * with another type, or a histogram with other buckets, is a programming error (TD_ASSERT).
 * Histogram bounds must be strictly increasing. NULL on allocation failure. */
td_metric_t *td_metrics_counter(td_metrics_t *r, const char *name, const char *help,
                                const char *labels);
td_metric_t *td_metrics_gauge(td_metrics_t *r, const char *name, const char *help,
                              const char *labels);
td_metric_t *td_metrics_histogram(td_metrics_t *r, const char *name, const char *help,
                                  const char *labels, const double *bounds, size_t n_bounds);

/* Counter and gauge updates (a counter only goes up: negative increments are ignored). */
void td_metric_add(td_metric_t *m, double v);
void td_metric_set(td_metric_t *m, double v); /* gauges only */
void td_metric_observe(td_metric_t *m, double v); /* histograms only */
/* Current value (counter/gauge), or the observation count (histogram). */
double td_metric_value(td_metric_t *m);
/* Histogram: sum of observations. */
double td_metric_sum(td_metric_t *m);

/* Append the whole registry in Prometheus text format. 0 or TD_ENOMEM. */
int td_metrics_render(td_metrics_t *r, td_buf_t *out);

/* Escape a label value (backslash, double quote, newline) into `out`. 0 or TD_ENOMEM. */
int td_metrics_escape(const char *value, td_buf_t *out);

#endif
