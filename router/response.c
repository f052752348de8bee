/* response.c: OpenAI and Anthropic response bodies and SSE framing, hand-formatted (one token per
 * chunk makes this a hot path; json-c objects per token would dominate it). */
#include "response.h"
#include "response_impl.h"
#include "td_error.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

const char *td_resp_finish_name(td_api_kind_t kind, td_resp_finish_t why, bool stop_sequence)
{
    if (kind == TD_API_MESSAGES) {
        if (why == TD_RESP_LENGTH)
            return "max_tokens";
        if (why == TD_RESP_TOOLS)
            return "tool_use";
        return stop_sequence ? "stop_sequence" : "end_turn";
    }
    switch (why) {
    case TD_RESP_STOP: return "stop";
    case TD_RESP_LENGTH: return "length";
    case TD_RESP_ABORT: return "abort";
    case TD_RESP_TOOLS: return "tool_calls";
    default: return NULL;
    }
}

static int json_str(td_buf_t *b, const char *s, size_t n)
{
    return td_buf_append_json_string(b, s, n);
}

static int json_cstr(td_buf_t *b, const char *s)
{
    return s ? json_str(b, s, strlen(s)) : td_buf_append_str(b, "null");
}

static int json_double(td_buf_t *b, double v)
{
    if (v != v || v == -1.0 / 0.0)
        v = -9999.0; /* JSON has no -inf: OpenAI reports impossible tokens as -9999 */
    return td_buf_printf(b, "%.9g", v);
}

static int json_bytes(td_buf_t *b, const char *s, size_t n)
{
    TRY(td_buf_append_char(b, '['));
    for (size_t i = 0; i < n; i++)
        TRY(td_buf_printf(b, i ? ",%u" : "%u", (unsigned char)s[i]));
    return td_buf_append_char(b, ']');
}

static int usage_json(td_buf_t *b, td_api_kind_t kind, const td_resp_usage_t *u)
{
    if (kind == TD_API_MESSAGES) /* Anthropic counts input_tokens without the cache reads */
        return td_buf_printf(b,
                             "{\"input_tokens\":%" PRId64 ",\"output_tokens\":%" PRId64
                             ",\"cache_read_input_tokens\":%" PRId64 "}",
                             u->prompt_tokens - u->cached_tokens, u->completion_tokens,
                             u->cached_tokens);
    /* every OpenAI stream ends with this: appended, not printf'd */
    TRY(td_buf_append_str(b, "{\"prompt_tokens\":"));
    TRY(td_buf_append_i64(b, u->prompt_tokens));
    TRY(td_buf_append_str(b, ",\"completion_tokens\":"));
    TRY(td_buf_append_i64(b, u->completion_tokens));
    TRY(td_buf_append_str(b, ",\"total_tokens\":"));
    TRY(td_buf_append_i64(b, u->prompt_tokens + u->completion_tokens));
    TRY(td_buf_append_str(b, ",\"prompt_tokens_details\":{\"cached_tokens\":"));
    TRY(td_buf_append_i64(b, u->cached_tokens));
    return td_buf_append_str(b, "}}");
}

/* Chat: {"content":[{token, logprob, bytes, top_logprobs}, ...]} for n records. */
static int chat_logprobs(td_buf_t *b, const td_resp_logprob_t *lp, size_t n)
{
    TRY(td_buf_append_str(b, "{\"content\":["));
    for (size_t i = 0; i < n; i++) {
        TRY(td_buf_append_str(b, i ? ",{\"token\":" : "{\"token\":"));
        TRY(json_str(b, lp[i].token, lp[i].token_len));
        TRY(td_buf_append_str(b, ",\"logprob\":"));
        TRY(json_double(b, lp[i].logprob));
        TRY(td_buf_append_str(b, ",\"bytes\":"));
        TRY(lp[i].bytes ? json_bytes(b, lp[i].bytes, lp[i].bytes_len)
                        : json_bytes(b, lp[i].token, lp[i].token_len));
        TRY(td_buf_append_str(b, ",\"top_logprobs\":["));
        for (size_t k = 0; k < lp[i].n_top; k++) {
            const td_resp_top_t *t = &lp[i].top[k];
            TRY(td_buf_append_str(b, k ? ",{\"token\":" : "{\"token\":"));
            TRY(json_str(b, t->token, t->token_len));
            TRY(td_buf_append_str(b, ",\"logprob\":"));
            TRY(json_double(b, t->logprob));
            TRY(td_buf_append_str(b, ",\"bytes\":"));
            TRY(t->bytes ? json_bytes(b, t->bytes, t->bytes_len)
                         : json_bytes(b, t->token, t->token_len));
            TRY(td_buf_append_char(b, '}'));
        }
        TRY(td_buf_append_str(b, "]}"));
    }
    return td_buf_append_str(b, "]}");
}

/* Completions: {"tokens":[..],"token_logprobs":[..],"top_logprobs":[{tok:lp}],"text_offset":[..]} */
static int completion_logprobs(td_buf_t *b, const td_resp_logprob_t *lp, size_t n)
{
    TRY(td_buf_append_str(b, "{\"tokens\":["));
    for (size_t i = 0; i < n; i++) {
        if (i)
            TRY(td_buf_append_char(b, ','));
        TRY(json_str(b, lp[i].token, lp[i].token_len));
    }
    TRY(td_buf_append_str(b, "],\"token_logprobs\":["));
    for (size_t i = 0; i < n; i++) {
        if (i)
            TRY(td_buf_append_char(b, ','));
        TRY(json_double(b, lp[i].logprob));
    }
    TRY(td_buf_append_str(b, "],\"top_logprobs\":["));
    for (size_t i = 0; i < n; i++) {
        TRY(td_buf_append_str(b, i ? ",{" : "{"));
        for (size_t k = 0; k < lp[i].n_top; k++) {
            if (k)
                TRY(td_buf_append_char(b, ','));
            TRY(json_str(b, lp[i].top[k].token, lp[i].top[k].token_len));
            TRY(td_buf_append_char(b, ':'));
            TRY(json_double(b, lp[i].top[k].logprob));
        }
        TRY(td_buf_append_char(b, '}'));
    }
    TRY(td_buf_append_str(b, "],\"text_offset\":["));
    for (size_t i = 0; i < n; i++)
        TRY(td_buf_printf(b, i ? ",%zu" : "%zu", lp[i].text_offset));
    return td_buf_append_str(b, "]}");
}

/* A string literal appended without strlen. */
#define APPEND_LIT(b, lit) td_buf_append((b), (lit), sizeof(lit) - 1)

/* `data: {"id":..,"object":..,"created":..,"model":..,"choices":[` */
static int chunk_head_format(td_buf_t *b, const td_resp_ctx_t *c)
{
    /* room for the literals, the number and both strings as they are: one allocation when
     * nothing needs escaping */
    TRY(td_buf_reserve(b, 128 + (c->id ? strlen(c->id) : 4) + (c->model ? strlen(c->model) : 4)));
    TRY(APPEND_LIT(b, "data: {\"id\":"));
    TRY(json_cstr(b, c->id));
    TRY(c->kind == TD_API_CHAT
            ? APPEND_LIT(b, ",\"object\":\"chat.completion.chunk\",\"created\":")
            : APPEND_LIT(b, ",\"object\":\"text_completion\",\"created\":"));
    TRY(td_buf_append_i64(b, c->created));
    TRY(APPEND_LIT(b, ",\"model\":"));
    TRY(json_cstr(b, c->model));
    return APPEND_LIT(b, ",\"choices\":[");
}

/* The opening, formatted once per response when the caller keeps it (c->head). */
static int chunk_head(td_buf_t *b, const td_resp_ctx_t *c)
{
    if (!c->head)
        return chunk_head_format(b, c);
    if (!c->head->len)
        TRY(chunk_head_format(c->head, c));
    return td_buf_append(b, c->head->data, c->head->len);
}

static int chunk_tail(td_buf_t *b, const td_resp_ctx_t *c)
{
    return c->include_usage ? APPEND_LIT(b, "],\"usage\":null}\n\n") : APPEND_LIT(b, "]}\n\n");
}

/* One OpenAI chunk for one choice. Chat: `delta_json` is the delta object, or NULL for a
 * content delta of `text`; completions: `text`. */
static int openai_chunk(td_buf_t *b, const td_resp_ctx_t *c, int index, const char *delta_json,
                        const char *text, size_t len, const td_resp_logprob_t *lp,
                        const char *finish)
{
    TRY(chunk_head(b, c));
    TRY(APPEND_LIT(b, "{\"index\":"));
    TRY(td_buf_append_i64(b, index));
    if (c->kind == TD_API_CHAT && delta_json) {
        TRY(APPEND_LIT(b, ",\"delta\":"));
        TRY(td_buf_append_str(b, delta_json));
    } else {
        TRY(c->kind == TD_API_CHAT ? APPEND_LIT(b, ",\"delta\":{\"content\":")
                                   : APPEND_LIT(b, ",\"text\":"));
        TRY(json_str(b, text, len));
        if (c->kind == TD_API_CHAT)
            TRY(td_buf_append_char(b, '}'));
    }
    TRY(APPEND_LIT(b, ",\"logprobs\":"));
    if (lp)
        TRY(c->kind == TD_API_CHAT ? chat_logprobs(b, lp, 1) : completion_logprobs(b, lp, 1));
    else
        TRY(APPEND_LIT(b, "null"));
    TRY(APPEND_LIT(b, ",\"finish_reason\":"));
    TRY(json_cstr(b, finish));
    TRY(td_buf_append_char(b, '}'));
    return chunk_tail(b, c);
}

static int anthropic_event(td_buf_t *b, const char *name)
{
    return td_buf_printf(b, "event: %s\ndata: ", name);
}

static int anthropic_start(td_buf_t *b, const td_resp_ctx_t *c)
{
    if (c->role_sent[0])
        return 0;
    c->role_sent[0] = true;
    TRY(anthropic_event(b, "message_start"));
    TRY(td_buf_append_str(b, "{\"type\":\"message_start\",\"message\":{\"id\":"));
    TRY(json_cstr(b, c->id));
    TRY(td_buf_append_str(b, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":"));
    TRY(json_cstr(b, c->model));
    TRY(td_buf_printf(b,
                      ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{"
                      "\"input_tokens\":%" PRId64 ",\"output_tokens\":0}}}\n\n",
                      c->prompt_tokens));
    TRY(anthropic_event(b, "content_block_start"));
    TRY(td_buf_append_str(b, "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":"
                             "{\"type\":\"text\",\"text\":\"\"}}\n\n"));
    TRY(anthropic_event(b, "ping"));
    return td_buf_append_str(b, "{\"type\":\"ping\"}\n\n");
}

int td_resp_delta(td_buf_t *out, const td_resp_ctx_t *c, int index, const char *text, size_t len,
                  const td_resp_logprob_t *lp)
{
    if (c->kind == TD_API_RESPONSES)
        return td__resp_r_delta(out, c, text, len);
    if (c->kind == TD_API_MESSAGES) {
        TRY(anthropic_start(out, c));
        if (!len)
            return 0;
        TRY(anthropic_event(out, "content_block_delta"));
        TRY(td_buf_append_str(out, "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":"
                                   "{\"type\":\"text_delta\",\"text\":"));
        TRY(json_str(out, text, len));
        return td_buf_append_str(out, "}}\n\n");
    }
    if (c->kind == TD_API_CHAT && !c->role_sent[index]) {
        c->role_sent[index] = true;
        TRY(openai_chunk(out, c, index, "{\"role\":\"assistant\",\"content\":\"\"}", NULL, 0,
                         NULL, NULL));
    }
    if (!len && !lp)
        return 0;
    return openai_chunk(out, c, index, NULL, text, len, lp, NULL);
}

static int role_chunk(td_buf_t *out, const td_resp_ctx_t *c, int index)
{
    if (c->kind != TD_API_CHAT || c->role_sent[index])
        return 0;
    c->role_sent[index] = true;
    return openai_chunk(out, c, index, "{\"role\":\"assistant\",\"content\":\"\"}", NULL, 0, NULL,
                        NULL);
}

int td_resp_tool_call(td_buf_t *out, const td_resp_ctx_t *c, int index, int k,
                      const td_resp_tool_t *t)
{
    const char *args = t->arguments ? t->arguments : "";
    if (c->kind == TD_API_RESPONSES)
        return td__resp_r_tool(out, c, t);
    if (c->kind == TD_API_MESSAGES) {
        TRY(anthropic_start(out, c));
        if (c->blocks && !c->blocks->text_closed) {
            c->blocks->text_closed = true;
            TRY(anthropic_event(out, "content_block_stop"));
            TRY(td_buf_append_str(out, "{\"type\":\"content_block_stop\",\"index\":0}\n\n"));
        }
        int bi = c->blocks ? ++c->blocks->n_tools : k + 1;
        TRY(anthropic_event(out, "content_block_start"));
        TRY(td_buf_printf(out, "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":"
                               "{\"type\":\"tool_use\",\"id\":", bi));
        TRY(json_cstr(out, t->id));
        TRY(td_buf_append_str(out, ",\"name\":"));
        TRY(json_cstr(out, t->name));
        TRY(td_buf_append_str(out, ",\"input\":{}}}\n\n"));
        TRY(anthropic_event(out, "content_block_delta"));
        TRY(td_buf_printf(out, "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":"
                               "{\"type\":\"input_json_delta\",\"partial_json\":", bi));
        TRY(json_cstr(out, args));
        TRY(td_buf_append_str(out, "}}\n\n"));
        TRY(anthropic_event(out, "content_block_stop"));
        return td_buf_printf(out, "{\"type\":\"content_block_stop\",\"index\":%d}\n\n", bi);
    }
    TRY(role_chunk(out, c, index));
    td_buf_t d;
    td_buf_init(&d);
    int rc = td_buf_printf(&d, "{\"tool_calls\":[{\"index\":%d,\"id\":", k);
    if (!rc)
        rc = json_cstr(&d, t->id);
    if (!rc)
        rc = td_buf_append_str(&d, ",\"type\":\"function\",\"function\":{\"name\":");
    if (!rc)
        rc = json_cstr(&d, t->name);
    if (!rc)
        rc = td_buf_append_str(&d, ",\"arguments\":\"\"}}]}");
    if (!rc)
        rc = openai_chunk(out, c, index, d.data, NULL, 0, NULL, NULL);
    td_buf_reset(&d);
    if (!rc && *args) {
        rc = td_buf_printf(&d, "{\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", k);
        if (!rc)
            rc = json_cstr(&d, args);
        if (!rc)
            rc = td_buf_append_str(&d, "}}]}");
        if (!rc)
            rc = openai_chunk(out, c, index, d.data, NULL, 0, NULL, NULL);
    }
    td_buf_free(&d);
    return rc;
}

int td_resp_finish(td_buf_t *out, const td_resp_ctx_t *c, int index, td_resp_finish_t why,
                   const td_resp_usage_t *usage)
{
    if (c->kind == TD_API_RESPONSES)
        return td__resp_r_finish(out, c, why);
    if (c->kind == TD_API_MESSAGES) {
        TRY(anthropic_start(out, c));
        if (!c->blocks || !c->blocks->text_closed) {
            if (c->blocks)
                c->blocks->text_closed = true;
            TRY(anthropic_event(out, "content_block_stop"));
            TRY(td_buf_append_str(out, "{\"type\":\"content_block_stop\",\"index\":0}\n\n"));
        }
        TRY(anthropic_event(out, "message_delta"));
        TRY(td_buf_append_str(out, "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"));
        TRY(json_cstr(out, td_resp_finish_name(c->kind, why, c->stop_sequence != NULL)));
        TRY(td_buf_append_str(out, ",\"stop_sequence\":"));
        TRY(json_cstr(out, c->stop_sequence));
        return td_buf_printf(out, "},\"usage\":{\"output_tokens\":%" PRId64 "}}\n\n",
                             usage ? usage->completion_tokens : 0);
    }
    if (c->kind == TD_API_CHAT && !c->role_sent[index]) {
        c->role_sent[index] = true;
        TRY(openai_chunk(out, c, index, "{\"role\":\"assistant\",\"content\":\"\"}", NULL, 0,
                         NULL, NULL));
    }
    return openai_chunk(out, c, index, "{}", "", 0, NULL, td_resp_finish_name(c->kind, why, false));
}

int td_resp_done(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_usage_t *usage)
{
    if (c->kind == TD_API_RESPONSES)
        return td__resp_r_done(out, c, usage);
    if (c->kind == TD_API_MESSAGES) {
        TRY(anthropic_event(out, "message_stop"));
        return td_buf_append_str(out, "{\"type\":\"message_stop\"}\n\n");
    }
    if (c->include_usage && usage) {
        TRY(chunk_head(out, c));
        TRY(td_buf_append_str(out, "],\"usage\":"));
        TRY(usage_json(out, c->kind, usage));
        TRY(td_buf_append_str(out, "}\n\n"));
    }
    return td_buf_append_str(out, "data: [DONE]\n\n");
}

int td_resp_stream_error(td_buf_t *out, const td_resp_ctx_t *c, const char *type,
                         const char *message)
{
    if (c->kind == TD_API_RESPONSES)
        return td__resp_r_error(out, c, type, message);
    if (c->kind == TD_API_MESSAGES) {
        TRY(anthropic_event(out, "error"));
        TRY(td_buf_append_str(out, "{\"type\":\"error\",\"error\":{\"type\":"));
        TRY(json_cstr(out, type));
        TRY(td_buf_append_str(out, ",\"message\":"));
        TRY(json_cstr(out, message));
        return td_buf_append_str(out, "}}\n\n");
    }
    TRY(td_buf_append_str(out, "data: {\"error\":{\"message\":"));
    TRY(json_cstr(out, message));
    TRY(td_buf_append_str(out, ",\"type\":"));
    TRY(json_cstr(out, type));
    TRY(td_buf_append_str(out, ",\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n"));
    return 0;
}

int td_resp_full(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_choice_t *choices,
                 size_t n, const td_resp_usage_t *usage)
{
    static const td_resp_usage_t zero;
    if (!usage)
        usage = &zero;
    if (c->kind == TD_API_RESPONSES)
        return n ? td__resp_r_full(out, c, &choices[0], usage) : TD_EINVAL;
    if (c->kind == TD_API_MESSAGES) {
        TRY(td_buf_append_str(out, "{\"id\":"));
        TRY(json_cstr(out, c->id));
        TRY(td_buf_append_str(out, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":"));
        TRY(json_cstr(out, c->model));
        size_t nt = n ? choices[0].n_tools : 0;
        size_t tl = n ? choices[0].len : 0;
        TRY(td_buf_append_str(out, ",\"content\":["));
        if (tl || !nt) {
            TRY(td_buf_append_str(out, "{\"type\":\"text\",\"text\":"));
            TRY(json_str(out, n ? choices[0].text : "", tl));
            TRY(td_buf_append_char(out, '}'));
        }
        for (size_t k = 0; k < nt; k++) {
            const td_resp_tool_t *t = &choices[0].tools[k];
            TRY(td_buf_append_str(out, k || tl ? ",{\"type\":\"tool_use\",\"id\":"
                                               : "{\"type\":\"tool_use\",\"id\":"));
            TRY(json_cstr(out, t->id));
            TRY(td_buf_append_str(out, ",\"name\":"));
            TRY(json_cstr(out, t->name));
            TRY(td_buf_append_str(out, ",\"input\":"));
            TRY(td_buf_append_str(out, t->arguments && *t->arguments ? t->arguments : "{}"));
            TRY(td_buf_append_char(out, '}'));
        }
        TRY(td_buf_append_str(out, "],\"stop_reason\":"));
        TRY(json_cstr(out, td_resp_finish_name(c->kind, n ? choices[0].finish : TD_RESP_STOP,
                                          c->stop_sequence != NULL)));
        TRY(td_buf_append_str(out, ",\"stop_sequence\":"));
        TRY(json_cstr(out, c->stop_sequence));
        TRY(td_buf_append_str(out, ",\"usage\":"));
        TRY(usage_json(out, c->kind, usage));
        return td_buf_append_char(out, '}');
    }
    bool chat = c->kind == TD_API_CHAT;
    TRY(td_buf_append_str(out, "{\"id\":"));
    TRY(json_cstr(out, c->id));
    TRY(td_buf_printf(out, ",\"object\":\"%s\",\"created\":%" PRId64 ",\"model\":",
                      chat ? "chat.completion" : "text_completion", c->created));
    TRY(json_cstr(out, c->model));
    TRY(td_buf_append_str(out, ",\"choices\":["));
    for (size_t i = 0; i < n; i++) {
        const td_resp_choice_t *ch = &choices[i];
        TRY(td_buf_printf(out, "%s{\"index\":%zu,", i ? "," : "", i));
        if (chat) {
            TRY(td_buf_append_str(out, "\"message\":{\"role\":\"assistant\",\"content\":"));
            if (ch->n_tools && !ch->len)
                TRY(td_buf_append_str(out, "null"));
            else
                TRY(json_str(out, ch->text, ch->len));
            if (ch->n_tools) {
                TRY(td_buf_append_str(out, ",\"tool_calls\":["));
                for (size_t k = 0; k < ch->n_tools; k++) {
                    TRY(td_buf_append_str(out, k ? ",{\"id\":" : "{\"id\":"));
                    TRY(json_cstr(out, ch->tools[k].id));
                    TRY(td_buf_append_str(out, ",\"type\":\"function\",\"function\":{\"name\":"));
                    TRY(json_cstr(out, ch->tools[k].name));
                    TRY(td_buf_append_str(out, ",\"arguments\":"));
                    TRY(json_cstr(out, ch->tools[k].arguments ? ch->tools[k].arguments : ""));
                    TRY(td_buf_append_str(out, "}}"));
                }
                TRY(td_buf_append_char(out, ']'));
            }
            TRY(td_buf_append_str(out, "},"));
        } else {
            TRY(td_buf_append_str(out, "\"text\":"));
            TRY(json_str(out, ch->text, ch->len));
            TRY(td_buf_append_char(out, ','));
        }
        TRY(td_buf_append_str(out, "\"logprobs\":"));
        if (c->logprobs && ch->lp)
            TRY(chat ? chat_logprobs(out, ch->lp, ch->n_lp)
                     : completion_logprobs(out, ch->lp, ch->n_lp));
        else
            TRY(td_buf_append_str(out, "null"));
        TRY(td_buf_append_str(out, ",\"finish_reason\":"));
        TRY(json_cstr(out, td_resp_finish_name(c->kind, ch->finish, false)));
        TRY(td_buf_append_char(out, '}'));
    }
    TRY(td_buf_append_str(out, "],\"usage\":"));
    TRY(usage_json(out, c->kind, usage));
    return td_buf_append_char(out, '}');
}
