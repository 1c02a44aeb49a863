/*
 * av_util.h - small FFmpeg helpers shared by src/media (internal).
 */
#ifndef DH_MEDIA_AV_UTIL_H
#define DH_MEDIA_AV_UTIL_H

#include <stddef.h>

/* FFmpeg's text for an AVERROR code, into buf (always NUL-terminated). */
const char *dh__av_errstr(int averr, char *buf, size_t len);

/* Silences FFmpeg's own logging (we report errors ourselves); idempotent.
 * DATAHELIX_AV_LOG=1 in the environment keeps FFmpeg's warnings. */
void dh__av_quiet(void);

#endif
