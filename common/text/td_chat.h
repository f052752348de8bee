/* td_chat.h: chat templates. Turns an OpenAI-style message list (with tool calls and tool
 * results) and tool definitions into the exact prompt text a model's `chat_template` renders,
 * before tokenizing.
 *
 * The template is the model's own Jinja source (tokenizer_config.json `chat_template`, or
 * chat_template.jinja beside it, or a file named by the operator), run by the engine of
 * td_jinja.h with the variables transformers' apply_chat_template passes: messages, tools,
 * documents (None), add_generation_prompt, the special tokens (bos_token, eos_token, unk_token,
 * sep_token, pad_token, cls_token, mask_token, additional_special_tokens: those the config sets)
 * and the request's extra template kwargs (enable_thinking, ...). Output equals Python Jinja2's
 * byte for byte on the real templates (docs/chat-templates.md has the figures).
 */
#ifndef TD_CHAT_H
#define TD_CHAT_H

#include "td_jinja.h"
#include "td_util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_object;

typedef enum td_chat_role {
    TD_CHAT_ROLE_SYSTEM, /* also "developer" (the JSON keeps the name the client sent) */
    TD_CHAT_ROLE_USER,
    TD_CHAT_ROLE_ASSISTANT,
    TD_CHAT_ROLE_TOOL,
} td_chat_role_t;

/* One message, a read-only view of what the template sees. Strings are UTF-8 with an explicit
 * length, NUL-terminated, owned by the td_chat_msgs_t. */
typedef struct td_chat_msg {
    td_chat_role_t role;
    const char *content;   /* message text ("" when the message has none, e.g. tool calls only) */
    size_t content_len;    /* bytes */
    const char *reasoning; /* assistant `reasoning_content`, NULL when absent */
    size_t reasoning_len;  /* bytes */
    size_t n_tool_calls;   /* assistant: entries of tool_calls */
} td_chat_msg_t;

/* A parsed message list. `json` is what templates render: the messages as the client sent them,
 * normalized as vLLM does (text parts joined into one string, tool call arguments parsed from
 * their JSON string into objects). */
typedef struct td_chat_msgs {
    td_chat_msg_t *v;          /* [n] views */
    size_t n;                  /* number of messages */
    struct json_object *json;  /* array of n message objects; owned (one reference) */
} td_chat_msgs_t;

/* Rendering options. Zero-initialised means the template's defaults. */
typedef struct td_chat_opts {
    bool add_generation_prompt;       /* end with the header that opens the assistant's turn */
    bool disable_thinking;            /* render with enable_thinking=false (unless kwargs set it) */
    const struct json_object *tools;  /* OpenAI `tools` array, or NULL (templates see None) */
    const struct json_object *kwargs; /* extra template variables (chat_template_kwargs), or NULL;
                                       * messages, tools, documents and add_generation_prompt
                                       * cannot be overridden (TD_EINVAL) */
    int64_t now_s;                    /* strftime_now's clock (0: the wall clock) */
} td_chat_opts_t;

/* A compiled template plus the special tokens its tokenizer_config.json names. */
typedef struct td_chat_template {
    td_jinja_t *tpl;                 /* the default template */
    td_jinja_t *tpl_tools;           /* the "tool_use" one of a named list, or NULL */
    struct json_object *tokens;      /* special tokens map (see above); owned */
    char *bos;                       /* bos_token text ("" when unset); owned */
    char *eos;                       /* eos_token text ("" when unset); owned */
} td_chat_template_t;

/* Load the template for a model from its tokenizer_config.json. The source is, in order:
 * `template_path` when not NULL (a file holding the Jinja text), the config's `chat_template`
 * (a string, or a list of {"name", "template"} with "default" and optionally "tool_use"), or
 * chat_template.jinja in the same directory. Errors leave `t` empty; td_err_msg names the file:
 * TD_ENOENT when there is no template at all, TD_EIO (read), TD_EPARSE (config JSON, or the
 * template's syntax with "FILE: chat_template:LINE:COL: message"), TD_ENOTSUP (a Jinja construct
 * outside the engine's subset, with its position), TD_EINVAL (a field of the wrong type). */
int td_chat_template_load(td_chat_template_t *t, const char *tokenizer_config_path,
                          const char *template_path);

/* As td_chat_template_load, from the config's text; `what` names it in messages. `template_src`
 * (NUL-terminated), when not NULL, replaces the config's template. No chat_template.jinja
 * lookup. */
int td_chat_template_load_json(td_chat_template_t *t, const char *json, size_t len,
                               const char *what, const char *template_src);

/* Release what a template owns and zero it. Safe on a zeroed or already freed template. */
void td_chat_template_free(td_chat_template_t *t);

/* Parse an OpenAI-style `messages` JSON array into `out`. Each element needs a `role` (system,
 * developer, user, assistant, tool) and a `content` that is a string or an array of
 * {"type": "text", "text": string} parts (joined with nothing between them); an assistant
 * message may have null or no content when it carries `tool_calls` (an array of
 * {"id", "type": "function", "function": {"name": string, "arguments": JSON text or object}});
 * templates then see content "" as under vLLM. Assistant messages may carry
 * `reasoning_content`. Other keys (name, tool_call_id, ...) pass to the template
 * as they are. Errors leave `out` empty and name the field in td_err_msg (e.g.
 * `messages[2].role: missing`, `messages[1].tool_calls[0].function.arguments: not valid JSON`):
 * TD_EPARSE (not JSON), TD_EINVAL (wrong shape, unknown role, invalid UTF-8), TD_ENOTSUP
 * (non-text content parts), TD_ENOMEM. */
int td_chat_msgs_parse(td_chat_msgs_t *out, const char *json, size_t len);

/* As td_chat_msgs_parse, from an already parsed json-c array (not modified or retained). */
int td_chat_msgs_from_json(td_chat_msgs_t *out, const struct json_object *messages);

/* Release a parsed message list and zero it. Safe on a zeroed or already freed list. */
void td_chat_msgs_free(td_chat_msgs_t *m);

/* Append to `out` the prompt `t`'s template renders for `msgs` with `opts` (NULL = defaults).
 * On error nothing is appended and td_err_msg says why: TD_EINVAL with
 * "raise_exception: MESSAGE" when the template raised (td_jinja_raised() is then true), or a
 * runtime error with the template's line; TD_ERANGE when a render limit is hit; TD_EINVAL for
 * reserved kwargs; TD_ENOMEM. */
int td_chat_render(const td_chat_template_t *t, const td_chat_msgs_t *msgs,
                   const td_chat_opts_t *opts, td_buf_t *out);

#endif
