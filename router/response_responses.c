/* response_responses.c: OpenAI Responses API bodies and its typed event stream
 * (response.created ... response.completed, each with its sequence_number). Called by
 * response.c's entry points for TD_API_RESPONSES. */
#include "response.h"
#include "response_impl.h"
#include "td_error.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_)                                                                                   \
            return rc_;                                                                            \
    } while (0)

void td_resp_rstate_free(td_resp_rstate_t *s)
{
    td_buf_free(&s->text);
    td_buf_free(&s->items);
}

static int jstr(td_buf_t *b, const char *s, size_t n)
{
    return td_buf_append_json_string(b, s, n);
}

static int jcstr(td_buf_t *b, const char *s)
{
    return s ? jstr(b, s, strlen(s)) : td_buf_append_str(b, "null");
}

/* `event: NAME\ndata: {"type":"NAME","sequence_number":N,` (the caller closes the object). */
static int ev(td_buf_t *b, td_resp_rstate_t *s, const char *name)
{
    return td_buf_printf(b, "event: %s\ndata: {\"type\":\"%s\",\"sequence_number\":%" PRId64 ",",
                         name, name, s->seq++);
}

/* fc_ id from a call id ("call_X" -> "fc_X"). */
static int fc_id(td_buf_t *b, const char *call_id)
{
    const char *x = call_id && strncmp(call_id, "call_", 5) == 0 ? call_id + 5 : call_id;
    TRY(td_buf_append_str(b, "\"fc_"));
    TRY(td_buf_append_str(b, x ? x : ""));
    return td_buf_append_char(b, '"');
}

static int text_part(td_buf_t *b, const char *text, size_t len)
{
    TRY(td_buf_append_str(b, "{\"type\":\"output_text\",\"text\":"));
    TRY(jstr(b, text, len));
    return td_buf_append_str(b, ",\"annotations\":[]}");
}

static int msg_item(td_buf_t *b, const char *id, const char *status, const char *text, size_t len,
                    bool with_part)
{
    TRY(td_buf_append_str(b, "{\"type\":\"message\",\"id\":"));
    TRY(jcstr(b, id));
    TRY(td_buf_printf(b, ",\"status\":\"%s\",\"role\":\"assistant\",\"content\":[", status));
    if (with_part)
        TRY(text_part(b, text, len));
    return td_buf_append_str(b, "]}");
}

static int fc_item(td_buf_t *b, const td_resp_tool_t *t, const char *status, bool with_args)
{
    TRY(td_buf_append_str(b, "{\"type\":\"function_call\",\"id\":"));
    TRY(fc_id(b, t->id));
    TRY(td_buf_append_str(b, ",\"call_id\":"));
    TRY(jcstr(b, t->id));
    TRY(td_buf_append_str(b, ",\"name\":"));
    TRY(jcstr(b, t->name));
    TRY(td_buf_append_str(b, ",\"arguments\":"));
    TRY(jcstr(b, with_args && t->arguments ? t->arguments : ""));
    return td_buf_printf(b, ",\"status\":\"%s\"}", status);
}

static int usage(td_buf_t *b, const td_resp_usage_t *u)
{
    return td_buf_printf(b,
                         "{\"input_tokens\":%" PRId64 ",\"input_tokens_details\":{\"cached_tokens\":%" PRId64
                         "},\"output_tokens\":%" PRId64
                         ",\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":%" PRId64 "}",
                         u->prompt_tokens, u->cached_tokens, u->completion_tokens,
                         u->prompt_tokens + u->completion_tokens);
}

/* The response object; items: output items' JSON (comma-joined) or NULL; u NULL: usage null. */
static int object(td_buf_t *b, const td_resp_ctx_t *c, const char *status, td_resp_finish_t why,
                  const char *items, size_t items_len, const char *text, size_t text_len,
                  const td_resp_usage_t *u)
{
    TRY(td_buf_append_str(b, "{\"id\":"));
    TRY(jcstr(b, c->id));
    TRY(td_buf_printf(b, ",\"object\":\"response\",\"created_at\":%" PRId64 ",\"status\":\"%s\"",
                      c->created, status));
    TRY(td_buf_append_str(b, ",\"error\":null,\"incomplete_details\":"));
    TRY(td_buf_append_str(b, why == TD_RESP_LENGTH ? "{\"reason\":\"max_output_tokens\"}" : "null"));
    TRY(td_buf_append_str(b, ",\"instructions\":null"));
    if (c->max_output_tokens > 0)
        TRY(td_buf_printf(b, ",\"max_output_tokens\":%" PRId64, c->max_output_tokens));
    else
        TRY(td_buf_append_str(b, ",\"max_output_tokens\":null"));
    TRY(td_buf_append_str(b, ",\"model\":"));
    TRY(jcstr(b, c->model));
    TRY(td_buf_append_str(b, ",\"output\":["));
    if (items)
        TRY(td_buf_append(b, items, items_len));
    TRY(td_buf_append_str(b, "],\"output_text\":"));
    TRY(jstr(b, text ? text : "", text ? text_len : 0));
    TRY(td_buf_append_str(b, ",\"parallel_tool_calls\":true,\"previous_response_id\":null,"
                             "\"text\":{\"format\":{\"type\":\"text\"}},\"tool_choice\":\"auto\","
                             "\"tools\":[],\"metadata\":{},\"usage\":"));
    if (u)
        TRY(usage(b, u));
    else
        TRY(td_buf_append_str(b, "null"));
    return td_buf_append_char(b, '}');
}

static int start(td_buf_t *b, const td_resp_ctx_t *c)
{
    td_resp_rstate_t *s = c->rs;
    if (s->started)
        return 0;
    s->started = true;
    TRY(ev(b, s, "response.created"));
    TRY(td_buf_append_str(b, "\"response\":"));
    TRY(object(b, c, "in_progress", TD_RESP_NONE, NULL, 0, NULL, 0, NULL));
    TRY(td_buf_append_str(b, "}\n\n"));
    TRY(ev(b, s, "response.in_progress"));
    TRY(td_buf_append_str(b, "\"response\":"));
    TRY(object(b, c, "in_progress", TD_RESP_NONE, NULL, 0, NULL, 0, NULL));
    return td_buf_append_str(b, "}\n\n");
}

static int open_msg(td_buf_t *b, const td_resp_ctx_t *c)
{
    td_resp_rstate_t *s = c->rs;
    if (s->msg_open)
        return 0;
    s->msg_open = true;
    TRY(ev(b, s, "response.output_item.added"));
    TRY(td_buf_printf(b, "\"output_index\":%d,\"item\":", s->n_items));
    TRY(msg_item(b, s->msg_id, "in_progress", NULL, 0, false));
    TRY(td_buf_append_str(b, "}\n\n"));
    TRY(ev(b, s, "response.content_part.added"));
    TRY(td_buf_append_str(b, "\"item_id\":"));
    TRY(jcstr(b, s->msg_id));
    TRY(td_buf_printf(b, ",\"output_index\":%d,\"content_index\":0,\"part\":", s->n_items));
    TRY(text_part(b, "", 0));
    return td_buf_append_str(b, "}\n\n");
}

static int item_sep(td_resp_rstate_t *s)
{
    return s->items.len ? td_buf_append_char(&s->items, ',') : 0;
}

static int close_msg(td_buf_t *b, const td_resp_ctx_t *c)
{
    td_resp_rstate_t *s = c->rs;
    if (!s->msg_open)
        return 0;
    s->msg_open = false;
    const char *t = s->text.data ? s->text.data : "";
    TRY(ev(b, s, "response.output_text.done"));
    TRY(td_buf_append_str(b, "\"item_id\":"));
    TRY(jcstr(b, s->msg_id));
    TRY(td_buf_printf(b, ",\"output_index\":%d,\"content_index\":0,\"text\":", s->n_items));
    TRY(jstr(b, t, s->text.len));
    TRY(td_buf_append_str(b, "}\n\n"));
    TRY(ev(b, s, "response.content_part.done"));
    TRY(td_buf_append_str(b, "\"item_id\":"));
    TRY(jcstr(b, s->msg_id));
    TRY(td_buf_printf(b, ",\"output_index\":%d,\"content_index\":0,\"part\":", s->n_items));
    TRY(text_part(b, t, s->text.len));
    TRY(td_buf_append_str(b, "}\n\n"));
    TRY(ev(b, s, "response.output_item.done"));
    TRY(td_buf_printf(b, "\"output_index\":%d,\"item\":", s->n_items));
    TRY(msg_item(b, s->msg_id, "completed", t, s->text.len, true));
    TRY(td_buf_append_str(b, "}\n\n"));
    TRY(item_sep(s));
    TRY(msg_item(&s->items, s->msg_id, "completed", t, s->text.len, true));
    s->n_items++;
    return 0;
}

int td__resp_r_delta(td_buf_t *out, const td_resp_ctx_t *c, const char *text, size_t len)
{
    TRY(start(out, c));
    if (!len)
        return 0;
    TRY(open_msg(out, c));
    TRY(td_buf_append(&c->rs->text, text, len));
    TRY(ev(out, c->rs, "response.output_text.delta"));
    TRY(td_buf_append_str(out, "\"item_id\":"));
    TRY(jcstr(out, c->rs->msg_id));
    TRY(td_buf_printf(out, ",\"output_index\":%d,\"content_index\":0,\"delta\":", c->rs->n_items));
    TRY(jstr(out, text, len));
    return td_buf_append_str(out, "}\n\n");
}

int td__resp_r_tool(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_tool_t *t)
{
    td_resp_rstate_t *s = c->rs;
    TRY(start(out, c));
    TRY(close_msg(out, c));
    const char *args = t->arguments ? t->arguments : "";
    TRY(ev(out, s, "response.output_item.added"));
    TRY(td_buf_printf(out, "\"output_index\":%d,\"item\":", s->n_items));
    TRY(fc_item(out, t, "in_progress", false));
    TRY(td_buf_append_str(out, "}\n\n"));
    TRY(ev(out, s, "response.function_call_arguments.delta"));
    TRY(td_buf_append_str(out, "\"item_id\":"));
    TRY(fc_id(out, t->id));
    TRY(td_buf_printf(out, ",\"output_index\":%d,\"delta\":", s->n_items));
    TRY(jcstr(out, args));
    TRY(td_buf_append_str(out, "}\n\n"));
    TRY(ev(out, s, "response.function_call_arguments.done"));
    TRY(td_buf_append_str(out, "\"item_id\":"));
    TRY(fc_id(out, t->id));
    TRY(td_buf_printf(out, ",\"output_index\":%d,\"arguments\":", s->n_items));
    TRY(jcstr(out, args));
    TRY(td_buf_append_str(out, "}\n\n"));
    TRY(ev(out, s, "response.output_item.done"));
    TRY(td_buf_printf(out, "\"output_index\":%d,\"item\":", s->n_items));
    TRY(fc_item(out, t, "completed", true));
    TRY(td_buf_append_str(out, "}\n\n"));
    TRY(item_sep(s));
    TRY(fc_item(&s->items, t, "completed", true));
    s->n_items++;
    return 0;
}

int td__resp_r_finish(td_buf_t *out, const td_resp_ctx_t *c, td_resp_finish_t why)
{
    TRY(start(out, c));
    if (c->rs->n_items == 0)
        TRY(open_msg(out, c)); /* an empty answer is still one (empty) message */
    TRY(close_msg(out, c));
    c->rs->finish = why;
    return 0;
}

/* output_text: the concatenated text of the message items (here at most one, the first). */
static void first_text(const td_resp_rstate_t *s, const char **t, size_t *n)
{
    *t = s->text.data ? s->text.data : "";
    *n = s->text.len;
}

int td__resp_r_done(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_usage_t *u)
{
    td_resp_rstate_t *s = c->rs;
    TRY(start(out, c));
    bool incomplete = s->finish == TD_RESP_LENGTH;
    TRY(ev(out, s, incomplete ? "response.incomplete" : "response.completed"));
    TRY(td_buf_append_str(out, "\"response\":"));
    const char *t;
    size_t n;
    first_text(s, &t, &n);
    TRY(object(out, c, incomplete ? "incomplete" : "completed", s->finish,
               s->items.data, s->items.len, t, n, u));
    return td_buf_append_str(out, "}\n\n");
}

int td__resp_r_error(td_buf_t *out, const td_resp_ctx_t *c, const char *type, const char *message)
{
    TRY(ev(out, c->rs, "error"));
    TRY(td_buf_append_str(out, "\"code\":"));
    TRY(jcstr(out, type));
    TRY(td_buf_append_str(out, ",\"message\":"));
    TRY(jcstr(out, message));
    return td_buf_append_str(out, ",\"param\":null}\n\n");
}

int td__resp_r_full(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_choice_t *ch,
                    const td_resp_usage_t *u)
{
    td_buf_t items;
    td_buf_init(&items);
    int rc = 0;
    if (ch->len || !ch->n_tools)
        rc = msg_item(&items, c->rs ? c->rs->msg_id : NULL, "completed", ch->text, ch->len, true);
    for (size_t k = 0; !rc && k < ch->n_tools; k++) {
        if (items.len)
            rc = td_buf_append_char(&items, ',');
        if (!rc)
            rc = fc_item(&items, &ch->tools[k], "completed", true);
    }
    bool incomplete = ch->finish == TD_RESP_LENGTH;
    if (!rc)
        rc = object(out, c, incomplete ? "incomplete" : "completed", ch->finish, items.data,
                    items.len, ch->text, ch->len, u);
    td_buf_free(&items);
    return rc;
}
