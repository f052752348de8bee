/* fuzz_replay.c: main() for a libFuzzer target built without libFuzzer: runs
 * LLVMFuzzerTestOneInput once per file given (files, or directories of files), so `meson test`
 * exercises every fuzz target over its seed corpus. */
#include "td_util.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    char *data;
    size_t len;
    if (td_file_read_all(path, &data, &len)) {
        fprintf(stderr, "fuzz replay: cannot read %s\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput((const uint8_t *)data, len);
    free(data);
    return 0;
}

int main(int argc, char **argv)
{
    size_t n = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st)) {
            fprintf(stderr, "fuzz replay: %s: no such file or directory\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]))
                return 1;
            n++;
            continue;
        }
        struct dirent **ents;
        int k = scandir(argv[i], &ents, NULL, alphasort);
        if (k < 0)
            return 1;
        for (int j = 0; j < k; j++) {
            if (ents[j]->d_name[0] != '.') {
                char p[4096];
                snprintf(p, sizeof(p), "%s/%s", argv[i], ents[j]->d_name);
                if (run_file(p))
                    return 1;
                n++;
            }
            free(ents[j]);
        }
        free(ents);
    }
    printf("fuzz replay: %zu inputs, no crash\n", n);
    return n ? 0 : 1;
}
