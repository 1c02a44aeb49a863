/*
 * gen_encode.h - encode one synthetic clip into an MP4 file (internal).
 *
 * Thread-safety: reentrant; each call owns its own FFmpeg contexts.
 */
#ifndef DH_MEDIA_GEN_ENCODE_H
#define DH_MEDIA_GEN_ENCODE_H

#include <stdint.h>

#include "datahelix/error.h"

struct dh__gen_clip {
    const char *path; /* file to (over)write; removed if encoding fails */
    int width;        /* even, >= 16 */
    int height;       /* even, >= 16 */
    int64_t frames;   /* >= 1, at DH_GEN_FPS */
    uint64_t seed;    /* content seed for dh__gen_content_fill() */
    int stamp;        /* non-zero: dh__gen_stamp_draw() over each frame */
};

/*
 * The encoder gen-data uses: "libx264" if the linked libavcodec has it,
 * else "mpeg4"; NULL if it has neither.  Static string.
 */
const char *dh__gen_encoder_name(void);

/*
 * Encodes c->frames frames of dh__gen_content_fill(seed) into c->path as
 * MP4 (25 fps, GOP 50, B-frames, bit-exact muxing: same input, same bytes).
 * Returns 0, or DH_EUNSUPPORTED (no encoder), DH_EIO (file), DH_EMEDIA
 * (encoder/muxer), DH_ENOMEM; on error c->path does not exist afterwards
 * and `e` names it and the cause.
 */
DH_MUST_CHECK int dh__gen_encode_clip(const struct dh__gen_clip *c,
                                      struct dh_err *e);

#endif
