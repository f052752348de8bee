/* cmd_kvhash.c: `tandem kvhash`: print a prompt's hash version 1 block hashes (td_kvhash.h), the
 * keys of the KV cache tiers and of the cluster KV index, for a layout fingerprint or a model. */
#include "cli.h"
#include "sampling_flags.h"
#include "td_error.h"
#include "td_kv.h"
#include "td_kvhash.h"
#include "td_model.h"
#include "td_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void kvhash_usage(FILE *out)
{
    fprintf(
        out,
        "usage: tandem kvhash (--fingerprint HEX | --model DIR) --block-size N\n"
        "                     [--tenant SALT | --tenant-hex HEX] --ids ID,ID,...\n\n"
        "Print the block hashes (hash version %d, docs/kv-cache.md) of a prompt's token ids:\n"
        "the keys under which workers cache its KV blocks (pool, host and disk tiers) and\n"
        "publish them to the cluster index (Redis <ns>:set:<worker>). An operator can\n"
        "check whether a prompt's prefix is cached, or find a disk-tier block file:\n"
        "<dir>/<fingerprint>/<first 2 hex of the hash>/<hash>.\n\n"
        "  --fingerprint HEX  the layout fingerprint (32 hex digits), as workers log it\n"
        "  --model DIR        compute the fingerprint from a model (with --block-size)\n"
        "  --block-size N     tokens per KV block (the workers' kv block size)\n"
        "  --tenant SALT      the tenant salt, as bytes of this text (default: none)\n"
        "  --tenant-hex HEX   the tenant salt as hex bytes\n"
        "  --ids LIST         the prompt's token ids, comma-separated int32 (tandem tokenize)\n\n"
        "Output: `version 1`, `fingerprint HEX`, `root HEX`, then `block I HEX` per full block\n"
        "(a trailing partial block has no hash). The same input prints the same hashes in\n"
        "any process, on any machine, after any restart.\n",
        TD_KVHASH_VERSION);
}

/* Parse "1,2,-3" strictly into a new array (*out, caller frees): the shared id parser with raw
 * int32 ids (hashes cover any id); "" is no ids. 0, or TD_EINVAL / TD_ENOMEM naming --ids. */
static int parse_ids(const char *s, int32_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    return *s ? td_sampling_flags_parse_ids("--ids", s, true, out, n) : 0;
}

typedef struct kvhash_args {
    const char *fingerprint, *model, *block_size, *tenant, *tenant_hex, *ids;
} kvhash_args_t;

/* Flags as "--flag VALUE" or "--flag=VALUE". 0, -1 after --help, or 2 (usage error, printed). */
static int parse_args(int argc, char **argv, kvhash_args_t *a)
{
    static const char *const names[] = {"--fingerprint", "--model",      "--block-size",
                                        "--tenant",      "--tenant-hex", "--ids"};
    const char **slots[] = {&a->fingerprint, &a->model,      &a->block_size,
                            &a->tenant,      &a->tenant_hex, &a->ids};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            kvhash_usage(stdout);
            return -1;
        }
        size_t k = 0, nl = 0;
        for (; k < TD_ARRAY_LEN(names); k++) {
            nl = strlen(names[k]);
            if (strncmp(arg, names[k], nl) == 0 && (arg[nl] == '\0' || arg[nl] == '='))
                break;
        }
        if (k == TD_ARRAY_LEN(names)) {
            fprintf(stderr, "tandem kvhash: unknown option \"%s\"\n\n", arg);
            kvhash_usage(stderr);
            return 2;
        }
        if (arg[nl] == '=') {
            *slots[k] = arg + nl + 1;
        } else if (i + 1 < argc) {
            *slots[k] = argv[++i];
        } else {
            fprintf(stderr, "tandem kvhash: %s needs a value\n", names[k]);
            return 2;
        }
    }
    const char *missing = !a->block_size ? "--block-size" : !a->ids ? "--ids" : NULL;
    if (missing || (!a->fingerprint == !a->model) || (a->tenant && a->tenant_hex)) {
        if (missing)
            fprintf(stderr, "tandem kvhash: %s is required\n\n", missing);
        else if (a->tenant && a->tenant_hex)
            fprintf(stderr, "tandem kvhash: give --tenant or --tenant-hex, not both\n\n");
        else
            fprintf(stderr, "tandem kvhash: give exactly one of --fingerprint and --model\n\n");
        kvhash_usage(stderr);
        return 2;
    }
    return 0;
}

/* The layout fingerprint from --fingerprint or from --model and the block size. 0 or a TD_E*
 * code with td_err_msg naming the flag or the model file. */
static int fingerprint_of(const kvhash_args_t *a, int64_t block_size, uint8_t fp[16])
{
    if (a->fingerprint) {
        if (strlen(a->fingerprint) != 32 || td_hex_decode(a->fingerprint, 32, fp) != 0)
            return td_err_set(TD_EINVAL, "--fingerprint: \"%s\" is not 32 hex digits",
                              a->fingerprint);
        return 0;
    }
    td_model_t *m;
    int rc = td_model_load(a->model, &m);
    if (rc)
        return rc;
    td_kv_layout_t l;
    rc = td_kv_layout_init(&l, m, (int)block_size);
    td_model_free(m);
    if (rc)
        return rc;
    memcpy(fp, l.fingerprint, 16);
    return 0;
}

int td_cmd_kvhash(int argc, char **argv)
{
    kvhash_args_t a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;
    int64_t bs;
    if (td_parse_i64(a.block_size, &bs) != 0 || bs < 1 || bs > 4096) {
        fprintf(stderr, "tandem kvhash: --block-size: \"%s\" is not an integer in 1..4096\n",
                a.block_size);
        return 2;
    }
    uint8_t salt_hex[256];
    const void *salt = a.tenant;
    size_t salt_len = a.tenant ? strlen(a.tenant) : 0;
    if (a.tenant_hex) {
        salt_len = strlen(a.tenant_hex) / 2;
        if (salt_len > sizeof(salt_hex) || strlen(a.tenant_hex) % 2 ||
            td_hex_decode(a.tenant_hex, 2 * salt_len, salt_hex) != 0) {
            fprintf(stderr, "tandem kvhash: --tenant-hex: \"%s\" is not hex bytes (at most %zu)\n",
                    a.tenant_hex, sizeof(salt_hex));
            return 2;
        }
        salt = salt_hex;
    }
    int32_t *ids;
    size_t n_ids;
    if ((rc = parse_ids(a.ids, &ids, &n_ids))) {
        fprintf(stderr, "tandem kvhash: %s\n", td_err_msg());
        return 2;
    }
    uint8_t fp[16];
    td_kvhash_t root;
    td_kvhash_t *hs = NULL;
    size_t n_blocks = n_ids / (size_t)bs;
    if ((rc = fingerprint_of(&a, bs, fp)) || (rc = td_kvhash_root(fp, salt, salt_len, &root)))
        goto err;
    if (n_blocks && !(hs = td_calloc(n_blocks, sizeof(*hs)))) {
        rc = td_err_set(TD_ENOMEM, "no memory for %zu hashes", n_blocks);
        goto err;
    }
    td_kvhash_blocks(ids, n_ids, (size_t)bs, &root, hs, n_blocks);
    char hex[33];
    td_hex_encode(fp, 16, hex);
    printf("version %d\nfingerprint %s\n", TD_KVHASH_VERSION, hex);
    td_kvhash_hex(&root, hex);
    printf("root %s\n", hex);
    for (size_t i = 0; i < n_blocks; i++) {
        td_kvhash_hex(&hs[i], hex);
        printf("block %zu %s\n", i, hex);
    }
    free(hs);
    free(ids);
    return fflush(stdout) == 0 ? 0 : 1;
err:
    fprintf(stderr, "tandem kvhash: %s\n", td_err_msg());
    free(hs);
    free(ids);
    return 1;
}
