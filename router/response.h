/* response.h: the bytes the router sends back: OpenAI completions and chat completions (whole
 * responses and server-sent-event chunks exactly as OpenAI frames them) and Anthropic messages
 * (whole responses and the event stream). Pure formatting: no I/O, no state beyond the context.
 *
 * Streaming, OpenAI: td_resp_delta for each token (the first call of a chat choice also emits the
 * role chunk, so the role goes out together with the first token), td_resp_finish per choice with
 * its finish reason, then td_resp_done (the usage chunk when include_usage was asked, then
 * `data: [DONE]`). Anthropic: the same calls produce message_start, content_block_start, ping,
 * content_block_delta, content_block_stop, message_delta and message_stop events.
 */
#ifndef TD_ROUTER_RESPONSE_H
#define TD_ROUTER_RESPONSE_H

#include "api.h"
#include "td_util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum td_resp_finish {
    TD_RESP_NONE = 0,
    TD_RESP_STOP,     /* EOS, a stop token or a stop string */
    TD_RESP_LENGTH,   /* max_tokens or the context limit */
    TD_RESP_ABORT,    /* canceled or failed */
    TD_RESP_TOOLS,    /* ended with tool calls ("tool_calls" / "tool_use") */
} td_resp_finish_t;

/* One tool call of a response. `arguments` is JSON text: OpenAI sends it as a string as it is;
 * Anthropic's `input` must be an object, so the caller passes one there (docs/api.md). */
typedef struct td_resp_tool {
    const char *id;        /* "call_..." (OpenAI) or "toolu_..." (Anthropic) */
    const char *name;
    const char *arguments; /* NUL-terminated */
} td_resp_tool_t;

/* Anthropic stream state: which content blocks are out (caller-owned, zeroed). */
typedef struct td_resp_blocks {
    bool text_closed; /* content_block_stop of the text block (index 0) sent */
    int n_tools;      /* tool_use blocks sent (indexes 1..n_tools) */
} td_resp_blocks_t;

typedef struct td_resp_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t cached_tokens; /* prompt tokens served from the prefix cache */
} td_resp_usage_t;

/* One alternative in a token's top logprobs. */
typedef struct td_resp_top {
    const char *token; /* token text bytes (may be a partial UTF-8 sequence) */
    size_t token_len;
    double logprob;
    const char *bytes; /* the token's raw bytes for "bytes" (a token may end inside a UTF-8
                          character); NULL: the text's bytes */
    size_t bytes_len;
} td_resp_top_t;

/* The logprob record of one sampled token. */
typedef struct td_resp_logprob {
    const char *token; /* sampled token's text bytes */
    size_t token_len;
    size_t text_offset; /* completions: byte offset of the token in the choice's text */
    double logprob;
    const td_resp_top_t *top; /* [n_top] alternatives, most likely first */
    size_t n_top;
    const char *bytes; /* raw bytes, as td_resp_top_t's; NULL: the text's bytes */
    size_t bytes_len;
} td_resp_logprob_t;

/* Responses API stream state (caller-owned, zeroed; td_resp_rstate_free). */
typedef struct td_resp_rstate {
    int64_t seq;       /* sequence_number of the next event */
    bool started;      /* response.created / in_progress sent */
    bool msg_open;     /* the message item is open (its text part streaming) */
    int n_items;       /* output items so far */
    td_buf_t text;     /* the open message's text so far */
    td_buf_t items;    /* the finished output items' JSON, comma-joined */
    td_resp_finish_t finish;
    const char *msg_id; /* "msg_..." (caller-owned) */
} td_resp_rstate_t;

void td_resp_rstate_free(td_resp_rstate_t *s);

/* What every chunk of one response repeats. */
typedef struct td_resp_ctx {
    td_api_kind_t kind;
    const char *id;        /* "chatcmpl-...", "cmpl-..." or "msg_..." */
    const char *model;
    int64_t created;       /* Unix seconds */
    bool include_usage;    /* OpenAI stream_options.include_usage */
    bool logprobs;         /* the request asked for logprobs */
    int64_t prompt_tokens; /* Anthropic message_start reports input tokens up front */
    bool *role_sent;       /* [n] per choice: chat role chunk already sent (caller-owned,
                            * zeroed); for Anthropic [0] means message_start was sent */
    const char *stop_sequence; /* Anthropic: the stop string that ended the message, or NULL */
    td_resp_blocks_t *blocks;  /* Anthropic streams with tool calls; NULL: text only */
    td_resp_rstate_t *rs;      /* Responses: stream state (also used by td_resp_full) */
    int64_t max_output_tokens; /* Responses: echoed in the response object; <0: null */
    td_buf_t *head; /* OpenAI streams: the opening every chunk repeats (id, object, created,
                     * model), formatted by the first chunk and copied by the others
                     * (caller-owned, initialized; its text must match the fields above); NULL:
                     * formatted for each chunk */
} td_resp_ctx_t;

/* Streaming: one token's text for choice `index` (text may be empty when a token completes no
 * character yet; the chunk is then skipped unless it carries logprobs). */
int td_resp_delta(td_buf_t *out, const td_resp_ctx_t *c, int index, const char *text, size_t len,
                  const td_resp_logprob_t *lp);
/* Streaming: one whole tool call of choice `index`, the `k`-th of the choice (OpenAI: a chunk
 * with index, id, type and name and empty arguments, then one with the arguments; Anthropic: the
 * text block closed if open, then content_block_start tool_use, an input_json_delta with the
 * arguments, content_block_stop). Then td_resp_finish with TD_RESP_TOOLS. */
int td_resp_tool_call(td_buf_t *out, const td_resp_ctx_t *c, int index, int k,
                      const td_resp_tool_t *t);
/* Streaming: choice `index` ended. */
int td_resp_finish(td_buf_t *out, const td_resp_ctx_t *c, int index, td_resp_finish_t why,
                   const td_resp_usage_t *usage);
/* Streaming: the whole response ended. */
int td_resp_done(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_usage_t *usage);
/* Streaming: an error after the stream started (OpenAI: an error event then [DONE]; Anthropic:
 * an `error` event). */
int td_resp_stream_error(td_buf_t *out, const td_resp_ctx_t *c, const char *type,
                         const char *message);

/* One finished choice of a whole (non-streaming) response. */
typedef struct td_resp_choice {
    const char *text; /* full generated text (with the prompt first when echo) */
    size_t len;
    td_resp_finish_t finish;
    const td_resp_logprob_t *lp; /* [n_lp] per generated token, or NULL */
    size_t n_lp;
    const td_resp_tool_t *tools; /* [n_tools] calls (chat and messages), or NULL */
    size_t n_tools;
} td_resp_choice_t;

/* A whole response body (JSON). */
int td_resp_full(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_choice_t *choices,
                 size_t n, const td_resp_usage_t *usage);

/* "stop" / "length" / "abort" / "tool_calls" (OpenAI), "end_turn" / "stop_sequence" /
 * "max_tokens" / "tool_use" (Anthropic). */
const char *td_resp_finish_name(td_api_kind_t kind, td_resp_finish_t why, bool stop_sequence);

#endif
