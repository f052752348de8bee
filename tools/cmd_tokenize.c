/* cmd_tokenize.c: `tandem tokenize` and `tandem detokenize`: the model's tokenizer from the
 * command line (tokenizer.json, same ids as Hugging Face tokenizers). */
#include "cli.h"
#include "td_error.h"
#include "td_tokenizer.h"
#include "td_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void tokenize_usage(FILE *out)
{
    fprintf(out, "usage: tandem tokenize --tokenizer PATH [--no-special] [--json] TEXT|-\n\n"
                 "Print the token ids of TEXT (or of standard input with -), separated by spaces.\n"
                 "  --tokenizer PATH  model directory holding tokenizer.json, or the file itself\n"
                 "  --no-special      do not add the BOS/EOS the post-processor adds\n"
                 "  --json            print {\"ids\": [...], \"tokens\": [...]}\n");
}

static void detokenize_usage(FILE *out)
{
    fprintf(out,
            "usage: tandem detokenize --tokenizer PATH [--skip-special] IDS...|-\n\n"
            "Print the text of the token ids (arguments, or standard input with -; ids separated\n"
            "by spaces, commas or newlines; a JSON array works too).\n"
            "  --tokenizer PATH  model directory holding tokenizer.json, or the file itself\n"
            "  --skip-special    leave special tokens out\n");
}

static int read_stdin(td_buf_t *b)
{
    char chunk[65536];
    for (;;) {
        ssize_t n = read(0, chunk, sizeof(chunk));
        if (n == 0)
            return 0;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return td_err_set(td_err_from_errno(errno), "standard input: %s", strerror(errno));
        }
        if (td_buf_append(b, chunk, (size_t)n))
            return TD_ENOMEM;
    }
}

/* Parse "--tokenizer PATH" / "--tokenizer=PATH" and the boolean flags; the rest are positional. */
static int parse_args(int argc, char **argv, const char **path, const char *const *flags,
                      bool *vals, size_t nflags, char ***pos, int *npos, void (*usage)(FILE *))
{
    *pos = calloc((size_t)argc, sizeof(char *));
    if (!*pos)
        return 1;
    *npos = 0;
    bool only_pos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || strcmp(a, "-") == 0 || (a[1] >= '0' && a[1] <= '9')) {
            (*pos)[(*npos)++] = argv[i];
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        if (strcmp(a, "--tokenizer") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: --tokenizer needs a path\n", argv[0]);
                return 2;
            }
            *path = argv[++i];
            continue;
        }
        if (strncmp(a, "--tokenizer=", 12) == 0) {
            *path = a + 12;
            continue;
        }
        size_t k = 0;
        while (k < nflags && strcmp(a, flags[k]) != 0)
            k++;
        if (k == nflags) {
            fprintf(stderr, "tandem %s: unknown option \"%s\"\n\n", argv[0], a);
            usage(stderr);
            return 2;
        }
        vals[k] = true;
    }
    if (!*path) {
        fprintf(stderr, "tandem %s: --tokenizer PATH is required\n\n", argv[0]);
        usage(stderr);
        return 2;
    }
    return 0;
}

static void json_string(FILE *out, const char *s, size_t n)
{
    fputc('"', out);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

int td_cmd_tokenize(int argc, char **argv)
{
    static const char *const flags[] = {"--no-special", "--json"};
    bool vals[2] = {false, false};
    const char *path = NULL;
    char **pos;
    int npos, ret = parse_args(argc, argv, &path, flags, vals, 2, &pos, &npos, tokenize_usage);
    if (ret)
        goto out_pos;
    if (npos != 1) {
        fprintf(stderr,
                "tandem tokenize: give exactly one TEXT argument (or - for standard input)\n\n");
        tokenize_usage(stderr);
        ret = 2;
        goto out_pos;
    }
    td_buf_t text;
    td_buf_init(&text);
    int rc = 0;
    if (strcmp(pos[0], "-") == 0)
        rc = read_stdin(&text);
    else
        rc = td_buf_append_str(&text, pos[0]);
    if (rc) {
        fprintf(stderr, "tandem tokenize: %s\n", td_err_msg());
        ret = 1;
        goto out_text;
    }
    td_tokenizer_t *tok;
    if ((rc = td_tokenizer_load(path, &tok))) {
        fprintf(stderr, "tandem tokenize: %s\n", td_err_msg());
        ret = 1;
        goto out_text;
    }
    td_tokens_t ids;
    td_tokens_init(&ids);
    if ((rc = td_tokenizer_encode(tok, text.data ? text.data : "", text.len, !vals[0], &ids))) {
        fprintf(stderr, "tandem tokenize: %s\n", td_err_msg());
        ret = 1;
        goto out_tok;
    }
    if (vals[1]) {
        printf("{\"ids\": [");
        for (size_t i = 0; i < ids.len; i++)
            printf("%s%d", i ? ", " : "", ids.ids[i]);
        printf("], \"tokens\": [");
        for (size_t i = 0; i < ids.len; i++) {
            size_t l;
            const char *t = td_tokenizer_id_to_token(tok, ids.ids[i], &l);
            if (i)
                printf(", ");
            json_string(stdout, t ? t : "", t ? l : 0);
        }
        printf("]}\n");
    } else {
        for (size_t i = 0; i < ids.len; i++)
            printf("%s%d", i ? " " : "", ids.ids[i]);
        printf("\n");
    }
out_tok:
    td_tokens_free(&ids);
    td_tokenizer_free(tok);
out_text:
    td_buf_free(&text);
out_pos:
    free(pos);
    return ret < 0 ? 0 : ret;
}

/* Append the ids in `s` (separated by spaces, commas, newlines, brackets). */
static int parse_id_list(const char *s, td_tokens_t *ids)
{
    const char *p = s;
    while (*p) {
        if (strchr(" \t\r\n,[]", *p)) {
            p++;
            continue;
        }
        const char *e = p;
        while (*e && !strchr(" \t\r\n,[]", *e))
            e++;
        char tmp[32];
        size_t n = (size_t)(e - p);
        int64_t v;
        if (n >= sizeof(tmp)) {
            fprintf(stderr, "tandem detokenize: invalid token id \"%.*s...\"\n", 20, p);
            return 2;
        }
        memcpy(tmp, p, n);
        tmp[n] = '\0';
        if (td_parse_i64(tmp, &v) || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "tandem detokenize: invalid token id \"%s\"\n", tmp);
            return 2;
        }
        if (td_tokens_push(ids, (int32_t)v))
            return 1;
        p = e;
    }
    return 0;
}

int td_cmd_detokenize(int argc, char **argv)
{
    static const char *const flags[] = {"--skip-special"};
    bool vals[1] = {false};
    const char *path = NULL;
    char **pos;
    int npos, ret = parse_args(argc, argv, &path, flags, vals, 1, &pos, &npos, detokenize_usage);
    if (ret)
        goto out_pos;
    if (npos == 0) {
        fprintf(stderr, "tandem detokenize: give token ids (or - for standard input)\n\n");
        detokenize_usage(stderr);
        ret = 2;
        goto out_pos;
    }
    td_tokens_t ids;
    td_tokens_init(&ids);
    td_buf_t in, out;
    td_buf_init(&in);
    td_buf_init(&out);
    for (int i = 0; i < npos && !ret; i++) {
        if (strcmp(pos[i], "-") == 0) {
            td_buf_reset(&in);
            if (read_stdin(&in)) {
                fprintf(stderr, "tandem detokenize: %s\n", td_err_msg());
                ret = 1;
                break;
            }
            ret = parse_id_list(in.data ? in.data : "", &ids);
        } else {
            ret = parse_id_list(pos[i], &ids);
        }
    }
    if (ret)
        goto out;
    td_tokenizer_t *tok;
    if (td_tokenizer_load(path, &tok)) {
        fprintf(stderr, "tandem detokenize: %s\n", td_err_msg());
        ret = 1;
        goto out;
    }
    if (td_tokenizer_decode(tok, ids.ids, ids.len, vals[0], &out)) {
        fprintf(stderr, "tandem detokenize: %s\n", td_err_msg());
        ret = 1;
    } else {
        fwrite(out.data, 1, out.len, stdout);
        fputc('\n', stdout);
    }
    td_tokenizer_free(tok);
out:
    td_tokens_free(&ids);
    td_buf_free(&in);
    td_buf_free(&out);
out_pos:
    free(pos);
    return ret < 0 ? 0 : ret;
}
