/* api.h: the router's request model: OpenAI completions and chat completions, and Anthropic
 * messages, parsed from JSON bodies into one td_api_request_t, validated the way the public APIs
 * (and vLLM) validate them.
 *
 * Every rejection returns TD_EINVAL (or TD_EPARSE for bodies that are not JSON, TD_ENOTSUP for
 * features that are recognised but not served) with td_err_msg saying what is wrong and
 * `*param` naming the offending parameter (for the error body's "param"), or NULL.
 * Unknown fields are ignored, as OpenAI's and vLLM's servers ignore them.
 */
#ifndef TD_ROUTER_API_H
#define TD_ROUTER_API_H

#include "td_chat.h"
#include "td_sampler.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum td_api_kind {
    TD_API_COMPLETIONS,      /* POST /v1/completions */
    TD_API_CHAT,             /* POST /v1/chat/completions */
    TD_API_MESSAGES,         /* POST /v1/messages (Anthropic) */
    TD_API_RESPONSES,        /* POST /v1/responses (OpenAI Responses) */
} td_api_kind_t;

/* What `tool_choice` asks (OpenAI auto/none/required/{function}; Anthropic auto/none/any/tool). */
typedef enum td_api_tool_choice {
    TD_API_TOOLS_AUTO = 0, /* the model may call tools (the default when tools are given) */
    TD_API_TOOLS_NONE,     /* tools are rendered but the output is never parsed for calls */
    TD_API_TOOLS_REQUIRED, /* a call is forced (the first tool's, see docs/api.md) */
    TD_API_TOOLS_NAMED,    /* a call of tool_name is forced */
} td_api_tool_choice_t;

#define TD_API_MAX_STOP 16      /* stop strings per request */
#define TD_API_MAX_N 16         /* choices per request */
#define TD_API_MAX_LOGPROBS TD_SAMPLER_MAX_LOGPROBS /* top logprobs per token */
#define TD_API_MAX_STOP_IDS TD_SAMPLER_MAX_STOP      /* stop_token_ids per request */

/* One prompt given as text or as token ids (completions accept either, several at once). */
typedef struct td_api_prompt {
    char *text;        /* UTF-8, NUL-terminated; NULL when given as ids */
    int32_t *ids;      /* [n_ids] token ids; NULL when given as text */
    size_t n_ids;
} td_api_prompt_t;

typedef struct td_api_request {
    td_api_kind_t kind;
    char *model;                 /* NULL when absent (the served model is used) */
    /* input: completions fill prompts; chat and messages fill msgs */
    td_api_prompt_t *prompts;    /* [n_prompts] */
    size_t n_prompts;
    td_chat_msgs_t msgs;
    /* sampling */
    int64_t max_tokens;          /* -1 when absent: up to the context limit */
    double temperature;          /* 1.0 when absent; 0 = greedy */
    double top_p;                /* 1.0 when absent */
    int64_t top_k;               /* 0 when absent or -1: disabled */
    double min_p;                /* 0 when absent */
    double presence_penalty;     /* [-2, 2]; 0 when absent */
    double frequency_penalty;    /* [-2, 2]; 0 when absent */
    double repetition_penalty;   /* vLLM extension, (0, 100]; 1.0 when absent */
    int32_t *logit_bias_ids;     /* [n_logit_bias] logit_bias (OpenAI): token id -> bias */
    float *logit_bias_values;    /* [n_logit_bias] in [-100, 100] */
    size_t n_logit_bias;         /* at most TD_SAMPLER_MAX_BIAS */
    int64_t min_tokens;          /* vLLM extension: EOS and stop ids masked before this many */
    char **bad_words;            /* [n_bad_words] vLLM's bad_words: strings, tokenized by */
    size_t n_bad_words;          /* td_api_tokenize_bad_words into: */
    int32_t *bad_word_ids;       /*   the banned sequences' tokens, one after another */
    uint32_t *bad_word_lens;     /*   [n_bad_seqs] each sequence's length */
    size_t n_bad_seqs;
    int json_mode;               /* structured outputs: 0 off, 1 json_object, 2 json_schema */
    char *json_schema;           /* json_mode 2: the schema, compact JSON text (it compiles) */
    bool has_seed;
    int64_t seed;
    char **stop;                 /* [n_stop] stop strings */
    size_t n_stop;
    int32_t *stop_token_ids;     /* [n_stop_token_ids], at most TD_API_MAX_STOP_IDS */
    size_t n_stop_token_ids;
    bool ignore_eos;
    int64_t n;                   /* choices, >= 1 */
    bool logprobs;               /* return logprobs of sampled tokens */
    int64_t top_logprobs;        /* alternatives per token, 0..TD_API_MAX_LOGPROBS */
    bool echo;                   /* completions: prepend the prompt to the text */
    /* output */
    bool stream;
    bool include_usage;          /* stream_options.include_usage */
    bool add_generation_prompt;  /* chat: default true */
    bool disable_thinking;       /* chat_template_kwargs.enable_thinking == false */
    struct json_object *template_kwargs; /* chat_template_kwargs (an object), or NULL; owned */
    /* tools, in OpenAI's form whatever the API ({"type":"function","function":{name,
     * description, parameters}}); NULL when the request has none */
    struct json_object *tools;   /* owned */
    td_api_tool_choice_t tool_choice;
    char *tool_name;             /* TD_API_TOOLS_NAMED: the function; REQUIRED: the first tool */
    char *user;                  /* OpenAI `user`, or Anthropic metadata.user_id; may be NULL */
} td_api_request_t;

/* api_sampling.c: logit_bias and min_tokens of request object `o` into r (0, or TD_EINVAL with
 * *param naming the field); the checks across fields after parsing (min_tokens <= max_tokens). */
struct json_object;
int td_api_parse_adjust(struct json_object *o, td_api_request_t *r, const char **param);
int td_api_check_adjust(const td_api_request_t *r, const char **param);
/* Tokenize r's bad_words as vLLM does: each word as given and with a leading space (both
 * without special tokens; a sequence given twice is kept once). 0, TD_EINVAL (*param
 * "bad_words": more tokens than the sampler holds) or TD_ENOMEM. */
struct td_tokenizer;
int td_api_tokenize_bad_words(td_api_request_t *r, const struct td_tokenizer *tok,
                              const char **param);
/* response_format (Chat, Completions) or Anthropic's output_format (Messages) into json_mode
 * and json_schema; the schema is compiled here so a bad one gets its 400 before any worker. */
int td_api_parse_response_format(struct json_object *o, td_api_request_t *r, const char **param);

/* Parse and validate a request body of the given kind into `out` (zeroed first). On error `out`
 * is left empty and *param names the parameter (static string) or is NULL. */
int td_api_parse(td_api_kind_t kind, const char *body, size_t len, td_api_request_t *out,
                 const char **param);

/* Parse a request body as one JSON object, strictly (json-c strict mode, UTF-8 validated,
 * nothing but whitespace after it), as every endpoint that takes JSON must. 0 with *out the
 * caller's (json_object_put), TD_EPARSE (not JSON, or trailing data) or TD_EINVAL (not an
 * object) with td_err_msg saying which, TD_ENOMEM. */
struct json_object;
int td_api_parse_object(const char *body, size_t len, struct json_object **out);

/* Whether a call is forced (tool_choice required or named). */
bool td_api_tool_forced(const td_api_request_t *r);

/* The engine's sampling settings a parsed request asks for (td_sampling_defaults, then
 * temperature, top_k, top_p, min_p, stop_token_ids, ignore_eos, and logprobs: -1 unless asked,
 * else top_logprobs). max_tokens and the seed depend on the prompt and the choice: the caller
 * sets them. */
void td_api_sampling(const td_api_request_t *r, td_sampling_t *out);

/* Release what a request owns and zero it. */
void td_api_request_free(td_api_request_t *r);

#endif
