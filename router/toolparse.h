/* toolparse.h: tool calls in a model's output. Each model family writes its calls in its own
 * syntax; this module knows four (the formats the families' chat templates render tool calls
 * in), picks one for a model, parses a finished output into text plus calls, and gives the
 * opening a router prefills when a request forces a call (tool_choice required or named).
 *
 * Formats:
 *   DeepSeek-V3   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n
 *                 ARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (V3.1's
 *                 <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜> too)
 *   Llama 3.1     [<|python_tag|>]{"name": NAME, "parameters": ARGS} (several joined by ';'):
 *                 the whole output must be such objects, else it is text
 *   Qwen3/Hermes  <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call> (any number)
 *   gpt-oss       <|channel|>commentary to=functions.NAME [<|constrain|>json]<|message|>ARGS
 *                 <|call|> (harmony; the text is the final channel's message)
 */
#ifndef TD_ROUTER_TOOLPARSE_H
#define TD_ROUTER_TOOLPARSE_H

#include "td_util.h"

#include <stdbool.h>
#include <stddef.h>

struct td_tokenizer;

typedef enum td_tool_fmt {
    TD_TOOL_FMT_NONE = 0, /* the model has no known tool-call syntax: outputs are text */
    TD_TOOL_FMT_DEEPSEEK,
    TD_TOOL_FMT_LLAMA3,
    TD_TOOL_FMT_QWEN3,
    TD_TOOL_FMT_HARMONY,
} td_tool_fmt_t;

/* "none", "deepseek_v3", "llama3_json", "qwen3", "harmony" <-> the enum. from_name: 0 or
 * TD_EINVAL for an unknown name (td_err_msg lists the names). */
const char *td_tool_fmt_name(td_tool_fmt_t f);
int td_tool_fmt_from_name(const char *name, td_tool_fmt_t *out);

/* The format a model writes, from its vocabulary (the first that matches):
 * a token "<｜tool▁calls▁begin｜>" -> DeepSeek-V3; "<|call|>" with "<|channel|>" -> gpt-oss;
 * "<tool_call>" -> Qwen3/Hermes; "<|python_tag|>" -> Llama 3.1 JSON; else NONE. */
td_tool_fmt_t td_tool_fmt_detect(const struct td_tokenizer *tok);

/* Whether the format's markers are special tokens the output text must keep to be parsed
 * (gpt-oss' harmony markers are; the others' are plain added tokens). */
bool td_tool_fmt_needs_special(td_tool_fmt_t f);

/* One parsed call: name and arguments (JSON text as the model wrote it, trimmed; may be invalid
 * JSON when nothing constrained the model). */
typedef struct td_tool_call {
    char *name;
    char *arguments;
} td_tool_call_t;

typedef struct td_tool_parsed {
    char *text;           /* the output without the calls (NUL-terminated) */
    size_t text_len;
    td_tool_call_t *calls; /* [n_calls] */
    size_t n_calls;
} td_tool_parsed_t;

/* Parse a finished output `s` of `len` bytes. Never fails on the text itself: what does not
 * form a call stays text (an unterminated call at the end, as a length-cut output has, is
 * still a call with what arguments it got). 0 or TD_ENOMEM (out is then empty). */
int td_tool_parse(td_tool_fmt_t f, const char *s, size_t len, td_tool_parsed_t *out);

void td_tool_parsed_free(td_tool_parsed_t *p);

/* Append to `out` what the router prefills after the generation prompt to force a call of
 * `name` (the model then writes the arguments): the format's call opening up to where the
 * arguments begin. TD_ENOTSUP for NONE, 0, TD_ENOMEM. */
int td_tool_prefill(td_tool_fmt_t f, const char *name, td_buf_t *out);

/* Longest suffix of s[0..len) that is a proper prefix of the format's call opening marker: the
 * bytes a stream must hold back until it knows whether a call starts there. */
size_t td_tool_holdback(td_tool_fmt_t f, const char *s, size_t len);

/* Offset of the first call opening marker in s, or len when there is none. */
size_t td_tool_find_start(td_tool_fmt_t f, const char *s, size_t len);



/* Streaming: what part of a choice's text can go out as content while calls may follow. Text
 * before a call's opening marker is released; from the marker on (or from the start, for a
 * forced call, which begins with the prefill, and for gpt-oss, whose text is a channel's) it is
 * held and parsed at the end. */
typedef struct td_tool_stream {
    td_tool_fmt_t fmt;
    td_buf_t held;  /* text not released yet */
    bool in_call;   /* held text begins a call (everything from here on is held) */
} td_tool_stream_t;

/* prefill: the forced call's opening (td_tool_prefill), or NULL. 0 or TD_ENOMEM. */
int td_tool_stream_init(td_tool_stream_t *s, td_tool_fmt_t f, const char *prefill);
/* Feed generated text; append to `release` what is now safe to send as content. */
int td_tool_stream_feed(td_tool_stream_t *s, const char *text, size_t len, td_buf_t *release);
/* End: parse what was held into `out` (its text is the rest of the content to send). */
int td_tool_stream_end(td_tool_stream_t *s, td_tool_parsed_t *out);
void td_tool_stream_free(td_tool_stream_t *s);
#endif
