/* workload_trace.c: replay a Mooncake trace (one JSON object a line: timestamp in ms,
 * input_length, output_length, hash_ids = the prompt's 512-token prefix blocks, equal ids = the
 * same block). Each id's tokens are synthesized from the id alone, so two prompts share exactly
 * the blocks the trace says they share; arrivals follow the timestamps. The parser is the
 * checked reader of an outside file: td_bench_trace_parse names the line and field it rejects. */
#include "bench.h"
#include "td_error.h"

#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IDS (1u << 20)            /* hash ids on one line */
#define MAX_LEN ((int64_t)1 << 40)    /* input_length / output_length */
#define ID_SALT 0x6d6f6f6e63616b65ULL /* "mooncake": block id -> token stream seed */

void td_bench_trace_free(td_bench_trace_t *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->reqs[i].hash_ids);
    free(t->reqs);
    memset(t, 0, sizeof(*t));
}

static int get_int(const char *name, size_t line, json_object *obj, const char *key, int64_t lo,
                   int64_t hi, int64_t *out)
{
    json_object *v;
    if (!json_object_object_get_ex(obj, key, &v))
        return td_err_set(TD_EPARSE, "%s:%zu: field \"%s\" is missing", name, line, key);
    if (!json_object_is_type(v, json_type_int))
        return td_err_set(TD_EPARSE, "%s:%zu: field \"%s\" is not an integer", name, line, key);
    int64_t x = json_object_get_int64(v);
    if (x < lo || x > hi || (x == INT64_MAX && json_object_get_uint64(v) != (uint64_t)INT64_MAX))
        return td_err_set(TD_EPARSE, "%s:%zu: field \"%s\" is %lld, outside [%lld, %lld]", name,
                          line, key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

/* One line's object into r. */
static int parse_req(const char *name, size_t line, json_object *o, td_bench_trace_req_t *r)
{
    if (!json_object_is_type(o, json_type_object))
        return td_err_set(TD_EPARSE, "%s:%zu: not a JSON object", name, line);
    int rc = get_int(name, line, o, "timestamp", 0, INT64_MAX / 2, &r->timestamp_ms);
    if (rc == 0)
        rc = get_int(name, line, o, "input_length", 1, MAX_LEN, &r->input_length);
    if (rc == 0)
        rc = get_int(name, line, o, "output_length", 1, MAX_LEN, &r->output_length);
    if (rc)
        return rc;
    json_object *ids;
    if (!json_object_object_get_ex(o, "hash_ids", &ids))
        return td_err_set(TD_EPARSE, "%s:%zu: field \"hash_ids\" is missing", name, line);
    if (!json_object_is_type(ids, json_type_array))
        return td_err_set(TD_EPARSE, "%s:%zu: field \"hash_ids\" is not an array", name, line);
    size_t n = json_object_array_length(ids);
    int64_t want = (r->input_length + TD_BENCH_TRACE_BLOCK - 1) / TD_BENCH_TRACE_BLOCK;
    if ((int64_t)n != want)
        return td_err_set(TD_EPARSE,
                          "%s:%zu: field \"hash_ids\" has %zu ids, but input_length %lld needs "
                          "ceil(%lld / %d) = %lld",
                          name, line, n, (long long)r->input_length, (long long)r->input_length,
                          TD_BENCH_TRACE_BLOCK, (long long)want);
    if (n > MAX_IDS)
        return td_err_set(TD_EPARSE, "%s:%zu: field \"hash_ids\": more than %u ids", name, line,
                          MAX_IDS);
    r->hash_ids = td_calloc(n ? n : 1, sizeof(int64_t));
    if (!r->hash_ids)
        return td_err_set(TD_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(ids, i);
        if (!json_object_is_type(e, json_type_int) || json_object_get_int64(e) < 0 ||
            json_object_get_int64(e) == INT64_MAX)
            return td_err_set(TD_EPARSE,
                              "%s:%zu: field \"hash_ids\": element %zu is not an integer in "
                              "[0, 2^63 - 2]",
                              name, line, i);
        r->hash_ids[i] = json_object_get_int64(e);
    }
    r->n_ids = n;
    return 0;
}

int td_bench_trace_parse(const char *name, const char *data, size_t len, size_t start, size_t limit,
                         td_bench_trace_t *out)
{
    memset(out, 0, sizeof(*out));
    size_t cap = 0, line = 0, idx = 0;
    int rc = 0;
    json_tokener *jt = json_tokener_new_ex(16);
    if (!jt)
        return td_err_set(TD_ENOMEM, "out of memory");
    int64_t prev_ts = 0;
    for (size_t pos = 0; pos < len && rc == 0 && (limit == 0 || out->n < limit);) {
        const char *nl = memchr(data + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - data) : len, ll = end - pos;
        const char *s = data + pos;
        pos = end + 1;
        line++;
        while (ll > 0 && (s[ll - 1] == '\r' || s[ll - 1] == ' ' || s[ll - 1] == '\t'))
            ll--;
        size_t lead = 0;
        while (lead < ll && (s[lead] == ' ' || s[lead] == '\t'))
            lead++;
        if (lead == ll)
            continue; /* blank lines do not count as requests */
        if (idx++ < start)
            continue;
        if (ll - lead > INT32_MAX) {
            rc = td_err_set(TD_EPARSE, "%s:%zu: line too long", name, line);
            break;
        }
        if (memchr(s + lead, 0, ll - lead)) {
            rc = td_err_set(TD_EPARSE, "%s:%zu: NUL byte in the line", name, line);
            break;
        }
        json_tokener_reset(jt);
        json_object *o = json_tokener_parse_ex(jt, s + lead, (int)(ll - lead));
        enum json_tokener_error jerr = json_tokener_get_error(jt);
        if (!o || jerr != json_tokener_success || json_tokener_get_parse_end(jt) != ll - lead) {
            rc = td_err_set(TD_EPARSE, "%s:%zu: not one JSON object (%s)", name, line,
                            jerr == json_tokener_success    ? "text after it"
                            : jerr == json_tokener_continue ? "unexpected end of line"
                                                            : json_tokener_error_desc(jerr));
            json_object_put(o);
            break;
        }
        if (out->n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            td_bench_trace_req_t *p = td_reallocarray(out->reqs, nc, sizeof(*p));
            if (!p) {
                json_object_put(o);
                rc = td_err_set(TD_ENOMEM, "out of memory");
                break;
            }
            out->reqs = p;
            cap = nc;
        }
        td_bench_trace_req_t *r = &out->reqs[out->n];
        memset(r, 0, sizeof(*r));
        r->line = line;
        rc = parse_req(name, line, o, r);
        json_object_put(o);
        if (rc == 0 && out->n > 0 && r->timestamp_ms < prev_ts)
            rc = td_err_set(TD_EPARSE,
                            "%s:%zu: field \"timestamp\" is %lld, before the previous line's %lld "
                            "(the trace must be in arrival order)",
                            name, line, (long long)r->timestamp_ms, (long long)prev_ts);
        if (rc) {
            free(r->hash_ids);
            break;
        }
        prev_ts = r->timestamp_ms;
        out->n++;
    }
    json_tokener_free(jt);
    if (rc == 0 && out->n == 0)
        rc = td_err_set(TD_EPARSE, "%s: no request %s", name,
                        start ? "at or after --trace-start" : "in the file");
    if (rc)
        td_bench_trace_free(out);
    return rc;
}

/* ---- ideal reuse: the longest run of each id seen so far (open addressing on the id) ---- */

typedef struct seen {
    int64_t *key; /* -1 = empty */
    int64_t *len;
    size_t cap, n;
} seen_t;

static size_t seen_slot(const seen_t *s, int64_t id)
{
    uint64_t h = (uint64_t)id;
    size_t i = (size_t)(td_rng_splitmix64(&h) & (s->cap - 1));
    while (s->key[i] != -1 && s->key[i] != id)
        i = (i + 1) & (s->cap - 1);
    return i;
}

static int seen_grow(seen_t *s)
{
    seen_t b = {td_calloc(s->cap ? s->cap * 2 : 1024, sizeof(int64_t)),
                td_calloc(s->cap ? s->cap * 2 : 1024, sizeof(int64_t)), s->cap ? s->cap * 2 : 1024,
                s->n};
    if (!b.key || !b.len) {
        free(b.key);
        free(b.len);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    memset(b.key, 0xff, b.cap * sizeof(int64_t));
    for (size_t i = 0; i < s->cap; i++)
        if (s->key[i] != -1) {
            size_t j = seen_slot(&b, s->key[i]);
            b.key[j] = s->key[i];
            b.len[j] = s->len[i];
        }
    free(s->key);
    free(s->len);
    *s = b;
    return 0;
}

/* Tokens of a `tokens`-long block `id` that an earlier block with the same id covered; records
 * this one. */
static int seen_add(seen_t *s, int64_t id, int64_t tokens, int64_t *reused)
{
    if ((s->n + 1) * 2 > s->cap) {
        int rc = seen_grow(s);
        if (rc)
            return rc;
    }
    size_t i = seen_slot(s, id);
    if (s->key[i] == -1) {
        s->key[i] = id;
        s->len[i] = 0;
        s->n++;
    }
    *reused = TD_MIN(tokens, s->len[i]);
    s->len[i] = TD_MAX(tokens, s->len[i]);
    return 0;
}

/* ---- prompts ---- */

/* The words that `words` gives: those that, after a space, are one token of `tok` (all of them
 * without a tokenizer), so a block of B words is B tokens and no token spans two words. */
static int pick_words(const td_tokenizer_t *tok, const char **words, size_t *n)
{
    *n = 0;
    td_tokens_t t;
    td_tokens_init(&t);
    int rc = 0;
    for (size_t i = 0; i < td__bench_n_words && i < 64 && rc == 0; i++) {
        if (tok) {
            char buf[64];
            int k = snprintf(buf, sizeof(buf), " %s", td__bench_words[i]);
            t.len = 0;
            rc = td_tokenizer_encode(tok, buf, (size_t)k, false, &t);
            if (rc || t.len != 1)
                continue;
        }
        words[(*n)++] = td__bench_words[i];
    }
    td_tokens_free(&t);
    if (rc == 0 && *n < 8)
        rc = td_err_set(TD_EINVAL, "--tokenizer: fewer than 8 common words are one token each");
    return rc;
}

/* Append the first `tokens` words of block `id` (each with a leading space). */
static int block_text(const char **words, size_t nw, int64_t id, int64_t tokens, td_buf_t *out)
{
    td_rng_t r;
    td_rng_seed(&r, (uint64_t)id ^ ID_SALT);
    for (int64_t i = 0; i < tokens; i++) {
        int rc = td_buf_printf(out, " %s", words[td_rng_next(&r) % nw]);
        if (rc)
            return rc;
    }
    return 0;
}

static int check_opts(const td_bench_workload_opts_t *o)
{
    if (!o->dataset_path)
        return td_err_set(TD_EINVAL, "--dataset-name mooncake needs --dataset-path FILE");
    if (o->trace_block_tokens < 1 || o->trace_block_tokens > TD_BENCH_TRACE_BLOCK)
        return td_err_set(TD_EINVAL, "--trace-block-tokens must be in [1, %d]",
                          TD_BENCH_TRACE_BLOCK);
    if (!(o->trace_time_scale > 0) || !isfinite(o->trace_time_scale))
        return td_err_set(TD_EINVAL, "--trace-time-scale must be > 0");
    if (o->trace_max_input_len != 0 && o->trace_max_input_len < o->trace_block_tokens)
        return td_err_set(TD_EINVAL,
                          "--trace-max-input-len must be at least --trace-block-tokens (%lld)",
                          (long long)o->trace_block_tokens);
    if (o->trace_max_output_len < 0 || o->trace_start < 0 || o->trace_limit < 0)
        return td_err_set(TD_EINVAL, "--trace-max-output-len, --trace-start and --trace-limit "
                                     "must be >= 0");
    return 0;
}

int td__bench_build_trace(const td_bench_workload_opts_t *o, const td_tokenizer_t *tok,
                          td_bench_workload_t *w)
{
    int rc = check_opts(o);
    if (rc)
        return rc;
    char *data = NULL;
    size_t len = 0;
    if ((rc = td_file_read_all(o->dataset_path, &data, &len)) != 0)
        return rc;
    td_bench_trace_t t;
    rc = td_bench_trace_parse(o->dataset_path, data, len, (size_t)o->trace_start,
                              (size_t)o->trace_limit, &t);
    free(data);
    if (rc)
        return rc;
    const char *words[64];
    size_t nw = 0;
    seen_t seen = {0};
    td_buf_t text;
    td_buf_init(&text);
    const int64_t B = o->trace_block_tokens;
    const int64_t max_blocks = o->trace_max_input_len ? o->trace_max_input_len / B : INT64_MAX;
    td_bench_trace_stats_t *st = &w->trace;
    w->prompts = td_calloc(t.n, sizeof(td_bench_prompt_t));
    w->arrivals = td_calloc(t.n, sizeof(double));
    if (!w->prompts || !w->arrivals)
        rc = td_err_set(TD_ENOMEM, "out of memory");
    if (rc == 0)
        rc = pick_words(tok, words, &nw);
    st->first_line = t.reqs[0].line;
    st->last_line = t.reqs[t.n - 1].line;
    for (size_t i = 0; i < t.n && rc == 0; i++) {
        const td_bench_trace_req_t *r = &t.reqs[i];
        size_t nb = r->n_ids;
        /* the last id is the partial block: input_length beyond the full ones, scaled */
        int64_t rem = r->input_length - (int64_t)(nb - 1) * TD_BENCH_TRACE_BLOCK;
        int64_t tail = (rem * B + TD_BENCH_TRACE_BLOCK - 1) / TD_BENCH_TRACE_BLOCK;
        if ((int64_t)nb > max_blocks) { /* else (nb - 1) x B + tail <= nb x B fits */
            st->truncated++;
            st->blocks_cut += (int64_t)nb - max_blocks;
            nb = (size_t)max_blocks;
            tail = B; /* cut by whole blocks: the last one kept is a full one */
        }
        td_buf_reset(&text);
        int64_t plen = 0;
        for (size_t b = 0; b < nb && rc == 0; b++) {
            int64_t n = b + 1 == nb ? tail : B, reused = 0;
            rc = block_text(words, nw, r->hash_ids[b], n, &text);
            if (rc == 0)
                rc = seen_add(&seen, r->hash_ids[b], n, &reused);
            st->reusable_tokens += reused;
            plen += n;
        }
        st->prompt_tokens += plen;
        if (rc == 0 && tok) {
            td_tokens_t ids;
            td_tokens_init(&ids);
            rc = td_tokenizer_encode(tok, text.data ? text.data : "", text.len, false, &ids);
            plen = (int64_t)ids.len;
            td_tokens_free(&ids);
        }
        int64_t olen = r->output_length;
        if (o->trace_max_output_len > 0 && olen > o->trace_max_output_len) {
            olen = o->trace_max_output_len;
            st->outputs_capped++;
        }
        if (rc == 0) {
            char *s = td_buf_steal(&text, NULL);
            if (!s)
                s = td_strdup("");
            if (!s)
                rc = td_err_set(TD_ENOMEM, "out of memory");
            else
                w->prompts[w->n] = (td_bench_prompt_t){s, plen, olen, -1, -1};
        }
        if (rc == 0) {
            w->arrivals[w->n] =
                (double)(r->timestamp_ms - t.reqs[0].timestamp_ms) * 1e-3 * o->trace_time_scale;
            w->n++;
        }
    }
    if (rc == 0)
        st->span_s = w->arrivals[w->n - 1];
    td_buf_free(&text);
    free(seen.key);
    free(seen.len);
    td_bench_trace_free(&t);
    return rc;
}
