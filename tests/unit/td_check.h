/* td_check.h: what every Check suite's main() does. */
#ifndef TD_CHECK_H
#define TD_CHECK_H

#include <check.h>

/* Run a suite (forking per test unless CK_FORK=no) and return the process exit status. */
static inline int td_check_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif
