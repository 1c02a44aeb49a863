/*
 * err_kind.h - which error codes say something about the sample they
 * name.  A failure the sample caused (it does not open, decode, or stays
 * within its watchdog) joins the quarantine lists of the client and the
 * DataServer; a resource or transport failure (a full arena or queue,
 * memory, a limit of the batch, a peer's malformed message or death) says
 * nothing about the sample it names and must not.  One list for both.
 */
#ifndef DH_CORE_ERR_KIND_H
#define DH_CORE_ERR_KIND_H

#include "datahelix/error.h"

static inline int dh__err_blames_sample(int code)
{
    switch (code) {
    case DH_ETIMEOUT:
    case DH_ENOMEM:
    case DH_ETOOBIG:
    case DH_EARENA:
    case DH_EPROTO:
    case DH_EPEERDEAD:
        return 0;
    default:
        return code < 0;
    }
}

#endif
