/*
 * gen_content.h - the pure, deterministic frame generator of `gen-data`
 * (internal).  No FFmpeg and no allocation here, so it is unit-tested alone
 * (tests/unit/test_gen_content.c).
 *
 * Thread-safety: all functions are reentrant; they touch only their
 * arguments.
 */
#ifndef DH_MEDIA_GEN_CONTENT_H
#define DH_MEDIA_GEN_CONTENT_H

#include <stdint.h>

/*
 * A caller-owned YUV420P picture: data[0] is width x height luma, data[1]
 * and data[2] are ((width+1)/2) x ((height+1)/2) chroma, each row
 * linesize[i] bytes apart (linesize >= the row width).
 */
struct dh__gen_planes {
    uint8_t *data[3];
    int linesize[3];
    int width;
    int height;
};

/*
 * Fills every pixel of `pl` with frame `frame` of the scene selected by
 * `seed`: a rotating, scrolling procedural texture, 3-6 bouncing coloured
 * boxes and light per-pixel noise.  Values stay in limited range (Y 16..235,
 * U/V 16..240).  A pure function of (width, height, frame, seed).
 */
void dh__gen_content_fill(const struct dh__gen_planes *pl, int64_t frame,
                          uint64_t seed);

/*
 * The frame stamp of `gen-data --stamp`: frame index `frame` (mod 4096) as
 * 12 blocks of 16x16 luma (235 for a 1 bit, 16 for a 0 bit, most
 * significant bit first) between two marker blocks that are always 235, in
 * one row centred horizontally at y 8..23; chroma under the row is 128.
 * Drawn over what is already in `pl`; clipped to the picture, so a picture
 * narrower than DH__GEN_STAMP_W or lower than 24 rows carries only part of
 * it.  A pure function of (width, height, frame).
 */
#define DH__GEN_STAMP_BITS 12
#define DH__GEN_STAMP_BLOCK 16
#define DH__GEN_STAMP_Y 8
#define DH__GEN_STAMP_W ((DH__GEN_STAMP_BITS + 2) * DH__GEN_STAMP_BLOCK)
void dh__gen_stamp_draw(const struct dh__gen_planes *pl, int64_t frame);

#endif
