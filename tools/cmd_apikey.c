/* cmd_apikey.c: `tandem apikey`: make an API key and the line the router's key file stores for
 * it (http.api_keys_file: the key's SHA-256, never the key), or hash an existing key. */
#include "cli.h"
#include "td_frame.h"
#include "td_util.h"

#include <stdio.h>
#include <string.h>

static void apikey_usage(FILE *out)
{
    fprintf(out,
            "usage: tandem apikey new --tenant NAME [--rpm N] [--tpm N] [--name LABEL]\n"
            "       tandem apikey hash [--tenant NAME ...]   (reads the key from stdin)\n\n"
            "new prints a fresh random key (line 1: give it to the client) and its key file\n"
            "line (line 2). hash prints the key file line of the key read from stdin (its\n"
            "trailing newline dropped). Append the line to the router's http.api_keys_file\n"
            "and send the router SIGHUP.\n");
}

int td_cmd_apikey(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        apikey_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    bool make = strcmp(argv[1], "new") == 0;
    if (!make && strcmp(argv[1], "hash") != 0) {
        fprintf(stderr, "tandem apikey: unknown action \"%s\" (new or hash)\n\n", argv[1]);
        apikey_usage(stderr);
        return 2;
    }
    const char *tenant = NULL, *rpm = NULL, *tpm = NULL, *name = NULL;
    for (int i = 2; i < argc; i++) {
        const char **dst = strcmp(argv[i], "--tenant") == 0 ? &tenant
                           : strcmp(argv[i], "--rpm") == 0  ? &rpm
                           : strcmp(argv[i], "--tpm") == 0  ? &tpm
                           : strcmp(argv[i], "--name") == 0 ? &name
                                                            : NULL;
        if (!dst || i + 1 >= argc) {
            fprintf(stderr, "tandem apikey: %s \"%s\"\n\n", dst ? "no value for" : "unknown option",
                    argv[i]);
            apikey_usage(stderr);
            return 2;
        }
        *dst = argv[++i];
    }
    if (make && !tenant) {
        fprintf(stderr, "tandem apikey new: --tenant is required (every key names its tenant)\n");
        return 2;
    }
    char key[256];
    size_t len;
    if (make) {
        uint8_t raw[24];
        char hex[49];
        if (td_random_bytes(raw, sizeof(raw)) != 0) {
            fprintf(stderr, "tandem apikey: no random bytes\n");
            return 1;
        }
        td_hex_encode(raw, sizeof(raw), hex);
        len = (size_t)snprintf(key, sizeof(key), "tdk-%s", hex);
    } else {
        if (!fgets(key, sizeof(key), stdin)) {
            fprintf(stderr, "tandem apikey hash: give the key on stdin\n");
            return 2;
        }
        len = strlen(key);
        while (len && (key[len - 1] == '\n' || key[len - 1] == '\r'))
            key[--len] = '\0';
        if (!len) {
            fprintf(stderr, "tandem apikey hash: the key is empty\n");
            return 2;
        }
    }
    uint8_t h[32];
    char hex[65];
    if (td_sha256(key, len, h) != 0) {
        fprintf(stderr, "tandem apikey: SHA-256 failed\n");
        return 1;
    }
    td_hex_encode(h, 32, hex);
    if (make)
        printf("%s\n", key);
    printf("sha256:%s", hex);
    if (tenant)
        printf(" tenant=%s", tenant);
    if (rpm)
        printf(" rpm=%s", rpm);
    if (tpm)
        printf(" tpm=%s", tpm);
    if (name)
        printf(" name=%s", name);
    printf("\n");
    return 0;
}
