/*
 * error.c - dh_strerror() and the dh_err message buffer.
 * Pure; no I/O, no allocation.
 */
#include "datahelix/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *dh_strerror(int code)
{
    switch (code) {
    case DH_OK:
        return "success";
#define DH_ERR_CASE_(name, val, text)                                          \
    case DH_E##name:                                                           \
        return text;
        DH_ERRNO_MAP(DH_ERR_CASE_)
#undef DH_ERR_CASE_
    default:
        return "unknown error";
    }
}

void dh_err_clear(struct dh_err *e)
{
    if (!e)
        return;
    e->code = 0;
    e->msg[0] = '\0';
}

int dh_err_set(struct dh_err *e, int code, const char *fmt, ...)
{
    va_list ap;

    if (!e)
        return code;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return code;
}
