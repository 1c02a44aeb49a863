/*
 * av_util.c - FFmpeg error text and log level (see av_util.h).
 */
#include "media/av_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <libavutil/error.h>
#include <libavutil/log.h>

const char *dh__av_errstr(int averr, char *buf, size_t len)
{
    if (av_strerror(averr, buf, len) < 0)
        snprintf(buf, len, "FFmpeg error %d", averr);
    return buf;
}

static void set_level(void)
{
    const char *v = getenv("DATAHELIX_AV_LOG");

    av_log_set_level(v && *v == '1' ? AV_LOG_WARNING : AV_LOG_QUIET);
}

void dh__av_quiet(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    pthread_once(&once, set_level);
}
