/* td_jsonfsm.h: structured outputs: a JSON schema (or "any JSON object") compiled into a
 * pushdown automaton over bytes, and the token mask it gives over a vocabulary.
 *
 * The automaton accepts exactly the compact JSON texts (no whitespace outside strings) that
 * validate against the compiled schema, so every complete output parses and validates. The
 * schema subset (docs/sampling.md, Structured outputs):
 *   type        "object" | "array" | "string" | "integer" | "number" | "boolean" | "null"
 *               (absent, with no enum/const: any JSON value)
 *   object      properties, required, additionalProperties (false, or absent/true: extra
 *               properties are never generated, which cannot make an output invalid)
 *   array       items, minItems, maxItems
 *   string      minLength, maxLength (characters)
 *   enum, const any JSON values (matched as their compact JSON text)
 *   ignored     title, description, $schema, default, examples, strict, $comment
 * Anything else (anyOf, $ref, pattern, format, minimum, ...) is refused with TD_ENOTSUP and the
 * keyword named, rather than ignored into outputs that might not validate. Numbers are limited
 * to 16 digits before the point and 16 after, strings to what maxLength allows, nesting to
 * TD_JSONFSM_MAX_DEPTH: limits that only narrow what can be generated.
 *
 * The state is a small value (td_jsonfsm_state_t) copied freely: the mask walks every token's
 * bytes from a copy.
 */
#ifndef TD_JSONFSM_H
#define TD_JSONFSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TD_JSONFSM_MAX_DEPTH 12  /* nesting of objects and arrays */
#define TD_JSONFSM_MAX_NODES 4096
#define TD_JSONFSM_MAX_PROPS 64  /* per object; enum values likewise */

typedef struct td_jsonfsm td_jsonfsm_t; /* the compiled schema (immutable, shareable) */

/* Compile `schema` (JSON text; NULL: any JSON object, response_format json_object).
 * 0, TD_EPARSE (not JSON), TD_EINVAL (not a valid schema) or TD_ENOTSUP (a keyword outside the
 * subset) with td_err_msg naming the keyword and where it is ("schema.properties.a.pattern"). */
int td_jsonfsm_compile(const char *schema, size_t len, td_jsonfsm_t **out);
void td_jsonfsm_free(td_jsonfsm_t *f);

typedef struct td_jsonfsm_frame {
    uint16_t node;
    uint8_t mode, sub;
    uint16_t pos;   /* bytes matched of a literal or key */
    uint8_t u8;     /* UTF-8 continuation bytes still due */
    uint8_t prop;   /* the object's property being read */
    uint32_t count; /* array items, string characters, number digits */
    uint64_t cand;  /* literal / key candidates */
    uint64_t seen;  /* an object's properties already given */
} td_jsonfsm_frame_t;

typedef struct td_jsonfsm_state {
    uint8_t depth; /* frames in use; 0 with done: the value is complete */
    bool done, dead;
    td_jsonfsm_frame_t f[TD_JSONFSM_MAX_DEPTH + 2];
} td_jsonfsm_state_t;

void td_jsonfsm_start(const td_jsonfsm_t *f, td_jsonfsm_state_t *s);
/* Feed one byte: false (and s->dead) when no valid output continues with it. */
bool td_jsonfsm_byte(const td_jsonfsm_t *f, td_jsonfsm_state_t *s, uint8_t c);
/* Feed n bytes: false as soon as one is rejected. */
bool td_jsonfsm_feed(const td_jsonfsm_t *f, td_jsonfsm_state_t *s, const void *p, size_t n);
/* Whether the bytes so far are a complete valid output (EOS may follow). */
bool td_jsonfsm_complete(const td_jsonfsm_t *f, const td_jsonfsm_state_t *s);
/* Whether s is inside a string that any run of plain characters (no quote, backslash or control
 * byte; whole UTF-8 characters) leaves exactly as it is: no maxLength, minLength reached. */
bool td_jsonfsm_plain_string(const td_jsonfsm_t *f, const td_jsonfsm_state_t *s);
/* Bytes of s that matter (for hashing and comparing states). */
size_t td_jsonfsm_state_size(const td_jsonfsm_state_t *s);

/* ---- the token mask over a vocabulary ------------------------------------------------------ */

typedef struct td_vocab_trie td_vocab_trie_t;

/* A byte trie of the tokens' bytes: bytes[ids i] of lens[i] bytes (len 0: a token that never
 * matches text, such as a special token). It also sets apart the tokens of plain string
 * characters (td_jsonfsm_plain_string): inside such a string they are all allowed at once, and
 * only the others (a second, much smaller trie) are walked. 0 or TD_ENOMEM. */
int td_vocab_trie_build(const uint8_t *const *bytes, const uint32_t *lens, int vocab,
                        td_vocab_trie_t **out);
void td_vocab_trie_free(td_vocab_trie_t *t);
int td_vocab_trie_size(const td_vocab_trie_t *t);

/* Per-request mask state: the automaton's position and a bounded cache of masks by state. */
typedef struct td_jsonmask td_jsonmask_t;

/* A mask for one sequence over trie `t` (borrowed) with `eos_id` (-1: none) allowed exactly when
 * the output is complete; automaton `f` borrowed, or owned (freed with the mask) when `own_f`.
 * 0 or TD_ENOMEM. */
int td_jsonmask_new(td_jsonfsm_t *f, const td_vocab_trie_t *t, int32_t eos_id, bool own_f,
                    td_jsonmask_t **out);
void td_jsonmask_free(td_jsonmask_t *m);
/* The allowed tokens from the current state: a bitmap of ceil(vocab / 64) words (owned by m,
 * valid until the next call). Never empty while the output is incomplete and unbroken. */
const uint64_t *td_jsonmask_allowed(td_jsonmask_t *m);
/* Advance by token `id` (its bytes). false when the token breaks the output (not from the mask). */
bool td_jsonmask_advance(td_jsonmask_t *m, int32_t id);
bool td_jsonmask_complete(const td_jsonmask_t *m);
/* Reset to the start (then advance through a resumed sequence's generated tokens). */
void td_jsonmask_reset(td_jsonmask_t *m);

#endif
