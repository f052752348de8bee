/* workload.c: the prompts a benchmark sends: random (vLLM's RandomDataset), shared-prefix groups
 * (SGLang's generated-shared-prefix), multi-turn chat sessions, and ShareGPT files with vLLM's
 * filter (Mooncake trace replay: workload_trace.c). With a tokenizer, lengths are token-exact
 * the way vLLM makes them: random ids are decoded, re-encoded and padded or cut until the text
 * encodes to the target length. */
#include "bench.h"
#include "td_error.h"

#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Words for prompts when no tokenizer is given: short, common, each usually one token. */
const char *const td__bench_words[] = {
    "the",   "of",   "and",   "to",   "in",    "is",    "it",    "you",  "that", "he",   "was",
    "for",   "on",   "are",   "with", "as",    "his",   "they",  "be",   "at",   "one",  "have",
    "this",  "from", "or",    "had",  "by",    "hot",   "word",  "but",  "what", "some", "we",
    "can",   "out",  "other", "were", "all",   "there", "when",  "up",   "use",  "your", "how",
    "said",  "an",   "each",  "she",  "which", "do",    "their", "time", "if",   "will", "way",
    "about", "many", "then",  "them", "write", "would", "like",  "so",   "these"};
#define WORDS td__bench_words
const size_t td__bench_n_words = sizeof(td__bench_words) / sizeof(td__bench_words[0]);

typedef struct gen {
    td_rng_t rng;
    const td_tokenizer_t *tok;
    int32_t *allowed; /* [n_allowed] ids that are not special tokens */
    size_t n_allowed;
} gen_t;

static int gen_init(gen_t *g, const td_tokenizer_t *tok, uint64_t seed)
{
    memset(g, 0, sizeof(*g));
    td_rng_seed(&g->rng, seed);
    g->tok = tok;
    if (!tok)
        return 0;
    size_t v = td_tokenizer_vocab_size(tok);
    g->allowed = td_calloc(v ? v : 1, sizeof(int32_t));
    if (!g->allowed)
        return td_err_set(TD_ENOMEM, "out of memory");
    for (size_t i = 0; i < v; i++) {
        size_t len;
        if (!td_tokenizer_is_special(tok, (int32_t)i) &&
            td_tokenizer_id_to_token(tok, (int32_t)i, &len))
            g->allowed[g->n_allowed++] = (int32_t)i;
    }
    if (g->n_allowed == 0)
        return td_err_set(TD_EINVAL, "--tokenizer: the vocabulary has no ordinary tokens");
    return 0;
}

static void gen_free(gen_t *g)
{
    free(g->allowed);
}

/* Count the tokens of `text` (words without a tokenizer); `special`: with the tokenizer's
 * BOS/EOS as HF's tokenizer(text) adds them. */
static int count_tokens_sp(const gen_t *g, const char *text, size_t len, bool special, int64_t *n);

static int count_tokens(const gen_t *g, const char *text, size_t len, int64_t *n)
{
    return count_tokens_sp(g, text, len, false, n);
}

static int count_tokens_sp(const gen_t *g, const char *text, size_t len, bool special, int64_t *n)
{
    if (!g->tok) {
        int64_t k = 0;
        bool in = false;
        for (size_t i = 0; i < len; i++) {
            bool sp = text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r';
            if (!sp && !in)
                k++;
            in = !sp;
        }
        *n = k;
        return 0;
    }
    td_tokens_t t;
    td_tokens_init(&t);
    int rc = td_tokenizer_encode(g->tok, text, len, special, &t);
    *n = (int64_t)t.len;
    td_tokens_free(&t);
    return rc;
}

/* Append text of `n` tokens to `out`: vLLM's gen_prompt_decode_to_target_len with a tokenizer
 * (ids `base[i] + i` modulo the ordinary vocabulary, like RandomDataset's offset sequence),
 * else n words. *got receives the length the text really encodes to. */
static int gen_text_prefixed(gen_t *g, const td_tokens_t *prefix, int64_t n, td_buf_t *out,
                             int64_t *got);

static int gen_text(gen_t *g, int64_t n, td_buf_t *out, int64_t *got)
{
    return gen_text_prefixed(g, NULL, n, out, got);
}

/* As gen_text, but with a tokenizer the sequence starts with the ids `prefix` and `n` counts
 * them too (vLLM decodes prefix and prompt ids together, so their boundary is adjusted as one). */
static int gen_text_prefixed(gen_t *g, const td_tokens_t *prefix, int64_t n, td_buf_t *out,
                             int64_t *got)
{
    if (n <= 0) {
        *got = 0;
        return 0;
    }
    if (!g->tok) {
        for (int64_t i = 0; i < n; i++) {
            const char *w = WORDS[td_rng_next(&g->rng) % td__bench_n_words];
            int rc = td_buf_printf(out, "%s%s", i || out->len ? " " : "", w);
            if (rc)
                return rc;
        }
        *got = n;
        return 0;
    }
    td_tokens_t ids;
    td_tokens_init(&ids);
    td_buf_t text;
    td_buf_init(&text);
    int rc = 0;
    uint64_t off = td_rng_next(&g->rng);
    for (size_t i = 0; prefix && i < prefix->len && rc == 0; i++)
        rc = td_tokens_push(&ids, prefix->ids[i]);
    for (int64_t i = (int64_t)ids.len; i < n && rc == 0; i++)
        rc = td_tokens_push(&ids, g->allowed[(off + (uint64_t)i) % g->n_allowed]);
    for (int attempt = 0; rc == 0; attempt++) {
        td_buf_reset(&text);
        rc = td_tokenizer_decode(g->tok, ids.ids, ids.len, false, &text);
        if (rc)
            break;
        ids.len = 0;
        rc = td_tokenizer_encode(g->tok, text.data ? text.data : "", text.len, false, &ids);
        if (rc || attempt >= 10 || (int64_t)ids.len == n)
            break;
        if ((int64_t)ids.len > n) {
            ids.len = (size_t)n;
        } else {
            while ((int64_t)ids.len < n && rc == 0)
                rc = td_tokens_push(&ids, g->allowed[td_rng_next(&g->rng) % g->n_allowed]);
        }
    }
    if (rc == 0) {
        *got = (int64_t)ids.len;
        rc = td_buf_append(out, text.data ? text.data : "", text.len);
    }
    td_buf_free(&text);
    td_tokens_free(&ids);
    return rc;
}

static int add_prompt(td_bench_workload_t *w, size_t *cap, td_buf_t *text, int64_t plen,
                      int64_t olen, int32_t session, int32_t turn)
{
    if (w->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        td_bench_prompt_t *p = td_reallocarray(w->prompts, nc, sizeof(*p));
        if (!p)
            return td_err_set(TD_ENOMEM, "out of memory");
        w->prompts = p;
        *cap = nc;
    }
    char *s = td_buf_steal(text, NULL);
    if (!s)
        s = td_strdup("");
    if (!s)
        return td_err_set(TD_ENOMEM, "out of memory");
    w->prompts[w->n++] = (td_bench_prompt_t){s, plen, olen, session, turn};
    return 0;
}

static int build_random(const td_bench_workload_opts_t *o, gen_t *g, td_bench_workload_t *w)
{
    if (o->input_len < 1 || o->output_len < 1)
        return td_err_set(TD_EINVAL, "--random-input-len and --random-output-len must be >= 1");
    if (!(o->range_ratio >= 0 && o->range_ratio < 1))
        return td_err_set(TD_EINVAL, "--random-range-ratio must be in [0, 1)");
    if (o->prefix_len < 0)
        return td_err_set(TD_EINVAL, "--random-prefix-len must be >= 0");
    size_t cap = 0;
    td_buf_t prefix, text;
    td_buf_init(&prefix);
    td_buf_init(&text);
    int64_t got;
    td_tokens_t prefix_ids; /* with a tokenizer: the shared prefix as ids */
    td_tokens_init(&prefix_ids);
    int rc = 0;
    if (g->tok) {
        for (int64_t i = 0; i < o->prefix_len && rc == 0; i++)
            rc = td_tokens_push(&prefix_ids, g->allowed[td_rng_next(&g->rng) % g->n_allowed]);
    } else {
        rc = gen_text(g, o->prefix_len, &prefix, &got);
    }
    int64_t in_lo = (int64_t)floor((double)o->input_len * (1 - o->range_ratio));
    int64_t in_hi = (int64_t)floor((double)o->input_len * (1 + o->range_ratio));
    int64_t out_lo = (int64_t)floor((double)o->output_len * (1 - o->range_ratio));
    int64_t out_hi = (int64_t)floor((double)o->output_len * (1 + o->range_ratio));
    for (size_t i = 0; i < o->num_prompts && rc == 0; i++) {
        int64_t in = TD_MAX(td_bench_rng_range(&g->rng, in_lo, in_hi), 1);
        int64_t out = TD_MAX(td_bench_rng_range(&g->rng, out_lo, out_hi), 1);
        td_buf_reset(&text);
        if (g->tok) {
            rc = gen_text_prefixed(g, &prefix_ids, o->prefix_len + in, &text, &got);
        } else {
            rc = td_buf_append(&text, prefix.data ? prefix.data : "", prefix.len);
            if (rc == 0 && prefix.len)
                rc = td_buf_append_char(&text, ' ');
            if (rc == 0)
                rc = gen_text(g, in, &text, &got);
        }
        int64_t plen = 0;
        if (rc == 0)
            rc = count_tokens(g, text.data ? text.data : "", text.len, &plen);
        if (rc == 0)
            rc = add_prompt(w, &cap, &text, plen, out, -1, -1);
    }
    td_buf_free(&prefix);
    td_buf_free(&text);
    td_tokens_free(&prefix_ids);
    return rc;
}

static int build_prefix(const td_bench_workload_opts_t *o, gen_t *g, td_bench_workload_t *w)
{
    if (o->num_groups < 1 || o->prompts_per_group < 1 || o->system_prompt_len < 0 ||
        o->question_len < 1 || o->output_len < 1)
        return td_err_set(TD_EINVAL, "--prefix-groups, --prefix-prompts-per-group, "
                                     "--prefix-question-len and --random-output-len must be >= 1");
    size_t cap = 0;
    td_buf_t sys, text;
    td_buf_init(&sys);
    td_buf_init(&text);
    int rc = 0;
    for (int64_t gi = 0; gi < o->num_groups && rc == 0; gi++) {
        int64_t got;
        td_buf_reset(&sys);
        rc = gen_text(g, o->system_prompt_len, &sys, &got);
        for (int64_t k = 0; k < o->prompts_per_group && rc == 0; k++) {
            td_buf_reset(&text);
            rc = td_buf_append(&text, sys.data ? sys.data : "", sys.len);
            if (rc == 0 && sys.len)
                rc = td_buf_append_str(&text, "\n\n");
            if (rc == 0)
                rc = gen_text(g, o->question_len, &text, &got);
            int64_t plen = 0;
            if (rc == 0)
                rc = count_tokens(g, text.data ? text.data : "", text.len, &plen);
            if (rc == 0)
                rc = add_prompt(w, &cap, &text, plen, o->output_len, (int32_t)gi, -1);
        }
    }
    /* SGLang shuffles the groups' prompts together so that a group's requests interleave */
    for (size_t i = w->n; rc == 0 && i > 1; i--) {
        size_t j = (size_t)(td_rng_next(&g->rng) % i);
        td_bench_prompt_t t = w->prompts[i - 1];
        w->prompts[i - 1] = w->prompts[j];
        w->prompts[j] = t;
    }
    for (size_t i = 0; i < w->n; i++)
        w->prompts[i].session = -1;
    td_buf_free(&sys);
    td_buf_free(&text);
    return rc;
}

static int build_multiturn(const td_bench_workload_opts_t *o, gen_t *g, td_bench_workload_t *w)
{
    if (o->num_sessions < 1 || o->turns_per_session < 1 || o->question_len < 1 || o->output_len < 1)
        return td_err_set(TD_EINVAL, "--sessions, --turns, --prefix-question-len and "
                                     "--random-output-len must be >= 1");
    if (o->num_sessions > INT32_MAX || o->turns_per_session > INT32_MAX)
        return td_err_set(TD_EINVAL, "--sessions/--turns: too many");
    size_t cap = 0;
    td_buf_t text;
    td_buf_init(&text);
    int rc = 0;
    for (int64_t t = 0; t < o->turns_per_session && rc == 0; t++)
        for (int64_t s = 0; s < o->num_sessions && rc == 0; s++) {
            int64_t got;
            td_buf_reset(&text);
            rc = gen_text(g, o->question_len, &text, &got);
            int64_t plen = 0;
            if (rc == 0)
                rc = count_tokens(g, text.data ? text.data : "", text.len, &plen);
            if (rc == 0)
                rc = add_prompt(w, &cap, &text, plen, o->output_len, (int32_t)s, (int32_t)t);
        }
    w->num_sessions = o->num_sessions;
    td_buf_free(&text);
    return rc;
}

static const char *conv_value(json_object *turn)
{
    json_object *v;
    if (!json_object_is_type(turn, json_type_object))
        return NULL;
    if (json_object_object_get_ex(turn, "value", &v) && json_object_is_type(v, json_type_string))
        return json_object_get_string(v);
    if (json_object_object_get_ex(turn, "content", &v) && json_object_is_type(v, json_type_string))
        return json_object_get_string(v);
    return NULL;
}

static int build_sharegpt(const td_bench_workload_opts_t *o, gen_t *g, td_bench_workload_t *w)
{
    if (!o->dataset_path)
        return td_err_set(TD_EINVAL, "--dataset-name sharegpt needs --dataset-path FILE");
    char *data = NULL;
    size_t len = 0;
    int rc = td_file_read_all(o->dataset_path, &data, &len);
    if (rc)
        return rc;
    json_tokener *jt = json_tokener_new_ex(64);
    json_object *root = jt ? json_tokener_parse_ex(jt, data, (int)len) : NULL;
    enum json_tokener_error jerr = jt ? json_tokener_get_error(jt) : json_tokener_error_depth;
    if (jt)
        json_tokener_free(jt);
    free(data);
    if (!root || jerr != json_tokener_success) {
        json_object_put(root);
        return td_err_set(TD_EPARSE, "%s: not valid JSON (%s)", o->dataset_path,
                          json_tokener_error_desc(jerr));
    }
    if (!json_object_is_type(root, json_type_array)) {
        json_object_put(root);
        return td_err_set(TD_EPARSE, "%s: expected a JSON array of conversations", o->dataset_path);
    }
    size_t n = json_object_array_length(root);
    size_t *order = td_calloc(n ? n : 1, sizeof(size_t));
    if (!order) {
        json_object_put(root);
        return td_err_set(TD_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n; i > 1; i--) { /* vLLM shuffles with the seed before filtering */
        size_t j = (size_t)(td_rng_next(&g->rng) % i);
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    size_t cap = 0;
    td_buf_t text;
    td_buf_init(&text);
    for (size_t k = 0; k < n && w->n < o->num_prompts && rc == 0; k++) {
        json_object *e = json_object_array_get_idx(root, order[k]), *conv;
        if (!json_object_is_type(e, json_type_object) ||
            !(json_object_object_get_ex(e, "conversations", &conv) ||
              json_object_object_get_ex(e, "conversation", &conv)) ||
            !json_object_is_type(conv, json_type_array) || json_object_array_length(conv) < 2)
            continue; /* vLLM: keep entries with at least two turns */
        w->sharegpt_seen++;
        const char *prompt = conv_value(json_object_array_get_idx(conv, 0));
        const char *completion = conv_value(json_object_array_get_idx(conv, 1));
        if (!prompt || !completion)
            continue;
        int64_t plen = 0, clen = 0;
        /* vLLM counts both with tokenizer(text).input_ids: special tokens included */
        rc = count_tokens_sp(g, prompt, strlen(prompt), true, &plen);
        if (rc == 0)
            rc = count_tokens_sp(g, completion, strlen(completion), true, &clen);
        if (rc)
            break;
        bool fixed = o->sharegpt_output_len > 0;
        int64_t olen = fixed ? o->sharegpt_output_len : clen;
        /* vLLM's is_valid_sequence */
        if (plen < o->min_len || (!fixed && olen < o->min_len) || plen > o->max_prompt_len ||
            plen + olen > o->max_total_len)
            continue;
        td_buf_reset(&text);
        rc = td_buf_append_str(&text, prompt);
        if (rc == 0)
            rc = add_prompt(w, &cap, &text, plen, olen, -1, -1);
        w->sharegpt_kept++;
    }
    td_buf_free(&text);
    free(order);
    json_object_put(root);
    if (rc == 0 && w->n == 0)
        rc = td_err_set(TD_EINVAL, "%s: no conversation passed the length filter", o->dataset_path);
    return rc;
}

int td_bench_workload_build(const td_bench_workload_opts_t *o, const td_tokenizer_t *tok,
                            td_bench_workload_t *out)
{
    memset(out, 0, sizeof(*out));
    gen_t g;
    int rc = gen_init(&g, tok, o->seed);
    if (rc == 0) {
        switch (o->kind) {
        case TD_BENCH_WL_RANDOM:
            rc = build_random(o, &g, out);
            break;
        case TD_BENCH_WL_PREFIX:
            rc = build_prefix(o, &g, out);
            break;
        case TD_BENCH_WL_MULTITURN:
            rc = build_multiturn(o, &g, out);
            break;
        case TD_BENCH_WL_SHAREGPT:
            rc = build_sharegpt(o, &g, out);
            break;
        case TD_BENCH_WL_MOONCAKE:
            rc = td__bench_build_trace(o, tok, out);
            break;
        default:
            rc = td_err_set(TD_EINVAL, "unknown workload");
        }
    }
    out->exact_lengths = tok != NULL;
    gen_free(&g);
    if (rc)
        td_bench_workload_free(out);
    return rc;
}

void td_bench_workload_free(td_bench_workload_t *w)
{
    for (size_t i = 0; i < w->n; i++)
        free(w->prompts[i].text);
    free(w->prompts);
    free(w->arrivals);
    memset(w, 0, sizeof(*w));
}
