/* td_chat.h: chat templates. Turns an OpenAI-style message list into the exact prompt text a
 * model family's `chat_template` (from its tokenizer_config.json) renders, before tokenizing.
 *
 * This is not a Jinja engine: each supported family has a small hand-written renderer whose
 * output is byte-for-byte what the real template renders (checked by tests/unit/test_chat.c
 * against Python Jinja2, as transformers runs it, and against @huggingface/jinja). Supported:
 *
 *   TD_CHAT_DEEPSEEK_V3  DeepSeek-V3 (system prompts joined at the top, tool outputs)
 *   TD_CHAT_LLAMA3       Llama 3 (the original template: content trimmed, no date block,
 *                        the assistant header always appended)
 *   TD_CHAT_QWEN         Qwen3's template, also used for Qwen2.5 (<think> blocks, enable_thinking)
 *
 * Tool calls inside assistant messages and tool definitions are not supported (TD_ENOTSUP).
 */
#ifndef TD_CHAT_H
#define TD_CHAT_H

#include "td_util.h"

#include <stdbool.h>
#include <stddef.h>

struct json_object;

typedef enum td_chat_family {
    TD_CHAT_UNKNOWN = 0,
    TD_CHAT_DEEPSEEK_V3,
    TD_CHAT_LLAMA3,
    TD_CHAT_QWEN,
} td_chat_family_t;

typedef enum td_chat_role {
    TD_CHAT_ROLE_SYSTEM,
    TD_CHAT_ROLE_USER,
    TD_CHAT_ROLE_ASSISTANT,
    TD_CHAT_ROLE_TOOL,
} td_chat_role_t;

/* One message. Strings are UTF-8 with an explicit length (they may contain NUL bytes) and need
 * not be NUL-terminated; the caller owns them for the duration of td_chat_render. */
typedef struct td_chat_msg {
    td_chat_role_t role;
    const char *content;   /* message text, content_len bytes; never NULL (use "" for empty) */
    size_t content_len;    /* bytes */
    const char *reasoning; /* assistant only: `reasoning_content`, reasoning_len bytes; NULL when
                            * absent (Qwen then takes it from a <think>...</think> in content) */
    size_t reasoning_len;  /* bytes */
} td_chat_msg_t;

/* A parsed message list that owns its strings (td_chat_msgs_parse / td_chat_msgs_free). */
typedef struct td_chat_msgs {
    td_chat_msg_t *v; /* [n] messages; each string is a NUL-terminated copy owned here */
    size_t n;         /* number of messages */
} td_chat_msgs_t;

/* Rendering options. Zero-initialised means the template's defaults. */
typedef struct td_chat_opts {
    bool add_generation_prompt; /* end with the header that opens the assistant's turn (Llama 3's
                                 * template appends it whatever this says) */
    bool disable_thinking;      /* Qwen: render with enable_thinking=false (an empty <think>
                                 * block after the generation prompt); ignored by other families */
} td_chat_opts_t;

/* A family's renderer plus the special tokens its tokenizer_config.json names. */
typedef struct td_chat_template {
    td_chat_family_t family;
    char *bos; /* bos_token text ("" when the config has none); owned */
    char *eos; /* eos_token text ("" when the config has none); owned, for callers' stop tokens */
} td_chat_template_t;

/* Family from an explicit name: "deepseek_v3"/"deepseek-v3", "llama3"/"llama-3",
 * "qwen"/"qwen2.5"/"qwen3" (case-insensitive). 0 or TD_EINVAL (td_err_msg lists the names). */
int td_chat_family_from_name(const char *name, td_chat_family_t *out);

/* Family from the text of a `chat_template`, by markers only that family's template contains
 * (<｜Assistant｜>, <|start_header_id|>, <|im_start|>). TD_ENOTSUP when no family or more than one
 * matches, or for a known variant these renderers do not reproduce (a DeepSeek template that
 * strips </think>, a Llama 3.1+ template with the "Cutting Knowledge" date block, a Llama 3
 * template whose generation prompt depends on add_generation_prompt). */
int td_chat_family_detect(const char *chat_template, td_chat_family_t *out);

/* Short stable name of a family ("deepseek_v3", "llama3", "qwen", "unknown"). Never NULL. */
const char *td_chat_family_name(td_chat_family_t f);

/* Load a template from a tokenizer_config.json file. `family_name` NULL detects the family from
 * its `chat_template`; otherwise it names the family (and the file need not have a template).
 * bos_token/eos_token may be a string, {"content": string} or null/absent. On error `t` is left
 * empty and td_err_msg names the file and field: TD_EIO/TD_ENOENT (read), TD_EPARSE (JSON),
 * TD_EINVAL (a field of the wrong type, an unknown name), TD_ENOTSUP (undetectable template). */
int td_chat_template_load(td_chat_template_t *t, const char *tokenizer_config_path,
                          const char *family_name);

/* As td_chat_template_load, from the file's text; `what` names it in error messages. */
int td_chat_template_load_json(td_chat_template_t *t, const char *json, size_t len,
                               const char *what, const char *family_name);

/* Release what a template owns and zero it. Safe on a zeroed or already freed template. */
void td_chat_template_free(td_chat_template_t *t);

/* Parse an OpenAI-style `messages` JSON array into `out`. Each element needs a `role` (system,
 * user, assistant, tool) and a `content` that is a string or an array of {"type": "text",
 * "text": string} parts (concatenated with nothing between them); assistant messages may carry
 * `reasoning_content` (string or null). Other keys are ignored; an empty or null `tool_calls` is
 * accepted. Errors leave `out` empty and name the field in td_err_msg (e.g.
 * `messages[2].role: missing`): TD_EPARSE (not JSON), TD_EINVAL (wrong shape, unknown role,
 * invalid UTF-8), TD_ENOTSUP (tool_calls, non-text content parts), TD_ENOMEM. */
int td_chat_msgs_parse(td_chat_msgs_t *out, const char *json, size_t len);

/* As td_chat_msgs_parse, from an already parsed json-c array (not modified or retained). */
int td_chat_msgs_from_json(td_chat_msgs_t *out, const struct json_object *messages);

/* Release a parsed message list and zero it. Safe on a zeroed or already freed list. */
void td_chat_msgs_free(td_chat_msgs_t *m);

/* Append to `out` the prompt that `t`'s chat template renders for msgs[0..n) with `opts` (NULL =
 * defaults). On error nothing useful is appended (out->len is restored) and td_err_msg says why:
 * TD_EINVAL where the reference template raises (Qwen with no messages), for invalid arguments
 * or invalid UTF-8; TD_ENOMEM. */
int td_chat_render(const td_chat_template_t *t, const td_chat_msg_t *msgs, size_t n,
                   const td_chat_opts_t *opts, td_buf_t *out);

#endif
