/*
 * datahelix/media_reuse.h - what a media worker carried from one file to
 * the next (issue 21 item 2; docs/media.md "Decoder reuse").
 *
 * A worker keeps the decoder of the file it closes and takes it over for
 * the next file whose codec parameters are the same (codec, dimensions,
 * pixel format, profile, level, colour details, extradata) and whose
 * thread count is the same, flushed; any other file gets a decoder of its
 * own.  These counters say how often each happened, for the tests and
 * `datahelix decode --json`.
 */
#ifndef DATAHELIX_MEDIA_REUSE_H
#define DATAHELIX_MEDIA_REUSE_H

#include <stdint.h>

#include "datahelix/media.h"

/* Decoders opened, and decoders taken over from a previous file, since
 * dh_media_create(). */
void dh__media_decoder_counts(const struct dh_media *m, int64_t *opens,
                              int64_t *reuses);
/* on = 0: every file gets a decoder of its own (as before issue 21; for
 * `datahelix decode --no-decoder-reuse`, to measure what reuse saves). */
void dh__media_set_decoder_reuse(struct dh_media *m, int on);

#endif
