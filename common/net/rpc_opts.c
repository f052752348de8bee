/* rpc_opts.c: what a daemon needs before it opens control connections (td_rpc.h): addresses
 * parsed from the options and the cluster secret found where the options say. */
#include "td_rpc.h"
#include "td_error.h"
#include "td_util.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- addresses -------------------------------------------------------------------------- */

int td_rpc_addr_parse(const char *text, td_rpc_addr_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!text || !*text)
        return td_err_set(TD_EINVAL, "empty address");
    if (td_str_startswith(text, "unix:") || text[0] == '/') {
        const char *p = text[0] == '/' ? text : text + 5;
        if (!*p || strlen(p) >= sizeof(out->path))
            return td_err_set(TD_EINVAL, "address \"%s\": bad unix socket path", text);
        out->is_unix = true;
        snprintf(out->path, sizeof(out->path), "%s", p);
        return 0;
    }
    if (td_str_startswith(text, "tcp://"))
        text += 6;
    char host[256];
    const char *port;
    if (text[0] == '[') {
        const char *end = strchr(text, ']');
        if (!end || end[1] != ':' || (size_t)(end - text - 1) >= sizeof(host))
            return td_err_set(TD_EINVAL, "address \"%s\": expected [v6-address]:port", text);
        memcpy(host, text + 1, (size_t)(end - text - 1));
        host[end - text - 1] = '\0';
        port = end + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || (size_t)(colon - text) >= sizeof(host))
            return td_err_set(TD_EINVAL, "address \"%s\": expected host:port", text);
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port = colon + 1;
    }
    uint64_t pn;
    if (td_parse_u64(port, &pn) || pn > 65535)
        return td_err_set(TD_EINVAL, "address \"%s\": bad port \"%s\"", text, port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(*host ? host : "0.0.0.0", port, &hints, &res);
    if (gai != 0 || !res)
        return td_err_set(TD_EINVAL, "address \"%s\": cannot resolve \"%s\": %s", text, host,
                          gai_strerror(gai));
    memcpy(&out->sa, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* ---- the cluster secret ------------------------------------------------------------------ */

int td_rpc_secret_load(const char *secret, const char *file, uint8_t **out, size_t *len)
{
    char *text = NULL, cred[4096];
    size_t n = 0;
    const char *from = "cluster.secret";
    *out = NULL;
    *len = 0;
    if (secret && *secret) {
        text = td_strdup(secret);
        n = text ? strlen(text) : 0;
    } else {
        const char *dir = getenv("CREDENTIALS_DIRECTORY");
        if ((!file || !*file) && dir) {
            snprintf(cred, sizeof(cred), "%s/cluster-secret", dir);
            if (access(cred, R_OK) == 0)
                file = cred;
        }
        if (!file || !*file)
            return td_err_set(TD_EAUTH, "no cluster secret: set cluster.secret_file (or "
                                        "cluster.secret, or a systemd credential cluster-secret)");
        int rc = td_file_read_all(file, &text, &n);
        if (rc)
            return td_err_set(rc, "cluster secret %s: %s", file, td_strerror(rc));
        from = file;
    }
    if (!text)
        return td_err_set(TD_ENOMEM, "out of memory");
    size_t a = 0;
    while (a < n && (text[a] == ' ' || text[a] == '\t' || text[a] == '\n' || text[a] == '\r'))
        a++;
    while (n > a && (text[n - 1] == ' ' || text[n - 1] == '\t' || text[n - 1] == '\n' ||
                     text[n - 1] == '\r'))
        n--;
    if (n - a < 16) {
        free(text);
        return td_err_set(TD_EAUTH, "%s: the cluster secret must be at least 16 bytes", from);
    }
    memmove(text, text + a, n - a);
    *out = (uint8_t *)text;
    *len = n - a;
    return 0;
}
