/*
 * media_internal.h - the state of a media worker (struct dh_media) shared
 * by media_open.c (file + frame table), media_decode.c (what to decode,
 * seeking, skipping) and media_scale.c (geometry, rotation, layout, dtype).
 *
 * Frame table: presentation timestamps ascending (pts[]), and keyframes as
 * presentation index + the timestamp to seek to.  Built from the MOV index
 * without reading packets when the stream is constant-rate and its start
 * time known, else by a demux-only scan.  Timestamps are the container's
 * own, whatever they start at.  When timestamps cannot identify frames
 * (missing or repeated pts), `counting` is set: frames are then identified
 * by their output order from the start of the stream, and nothing seeks.
 * A file whose seeks miss is decoded forward from then on (`forward_only`);
 * after every seek a gate holds pictures back until the decoder has its
 * keyframe (docs/media.md, "How the pipeline knows which frame it holds").
 *
 * Buffers with a `cap` keep their capacity across files: steady state
 * allocates nothing per frame.  Not thread-safe: one per worker.
 */
#ifndef DH_MEDIA_INTERNAL_H
#define DH_MEDIA_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libswscale/swscale.h>

#include "datahelix/media.h"
#include "datahelix/media_reuse.h"
#include "datahelix/media_stages.h"
#include "media/source.h"

struct dh_media {
    /* reused across files */
    AVPacket *pkt;
    AVFrame *frame;
    AVFrame *hold; /* snap-ref: the best candidate so far, not yet scaled */
    struct SwsContext *sws;
    uint8_t *scratch;
    size_t scratch_cap;
    int threads;
    int watchdog_ms;            /* dh_media_set_watchdog(); 0: off */
    uint64_t deadline_ms;       /* monotonic; 0: none for this file */
    struct SwsContext *sws_set; /* the context colour details were set on */
    int sws_cs, sws_range;
    int sws_key[5]; /* source w, h, format, output w, h of m->sws */

    /* frame table */
    int64_t *pts;
    size_t pts_cap;
    int64_t *key_idx;  /* presentation index of each keyframe */
    int64_t *key_seek; /* its pts: what av_seek_frame(BACKWARD) lands on;
                          the MOV demuxer shifts dts, so not the dts */
    size_t key_cap;
    int64_t n, nkey;
    int counting;
    double tb;    /* seconds per pts unit */
    int64_t half; /* half a frame duration, in pts units */

    /* selection: idx[i] = source index of output frame i (after snapping:
     * the frame actually used); planned[i] = what the plan asked for */
    int64_t idx[DH_MEDIA_MAX_FRAMES];
    int64_t planned[DH_MEDIA_MAX_FRAMES];
    int64_t ord[DH_MEDIA_MAX_FRAMES]; /* decode order of output slots */
    int64_t fb[DH_MEDIA_MAX_FRAMES];  /* snap-ref: slots left for exact */
    int64_t count, valid;
    double stride, shift;
    struct dh_media_plan sel_plan; /* the plan idx[] was made for */
    int selected;

    /* the open file; name points into name_buf (kept across files, grown
     * only for a longer name: no allocation per file in steady state) */
    char *name;
    char *name_buf;
    size_t name_cap;
    AVFormatContext *fc;
    AVIOContext *avio;
    struct dh_source src; /* every input is read through it (source.h) */
    const char *url;      /* what FFmpeg is told the input is: "file:PATH"
                              for a whole file (its name, for demuxers that
                              go by extension), NULL for a member or a
                              buffer */
    AVCodecContext *cc;
    int stream;

    /* decoder reuse (media_open.c, "Decoder reuse"): a closed file's
     * decoder waits in `spare` for the next file opened with the same
     * codec parameters (cc_par) and thread count; one that met an error or
     * a concealed picture (cc_tainted) is freed instead */
    AVCodecContext *spare;
    AVCodecParameters *cc_par; /* what cc, or spare, was opened with */
    int cc_threads;
    int cc_tainted;
    int no_reuse; /* dh__media_set_decoder_reuse(m, 0) */
    int64_t decoder_opens, decoder_reuses; /* since dh_media_create */
    struct dh_media_info info;
    int image;

    /* decode progress */
    int64_t cur_key;    /* keyframe number of the packets being sent, -1 */
    int64_t last_index; /* presentation index of the last decoded frame */
    int eof;
    int64_t decoded, seeks;
    int emit_in_order;   /* slots are written in increasing order: swscale
                          may write straight into them (media_scale.c) */
    int gate;            /* since the last seek or restart no keyframe picture
                          came out: what does is not yet trustworthy (a
                          P-picture decoded against a missing reference) */
    int gate_key_sent;   /* a keyframe packet went in since the gate closed */
    int64_t gate_key_ts; /* its timestamp */
    int forward_only;    /* seeking is off for this file: a seek missed its
                          target (or timestamps cannot identify frames);
                          targets are reached by decoding forward */
    int64_t fallbacks;   /* times a missed seek fell back to decoding from
                          the start */

    /* stage sums since the last dh__media_stage_note (media_stages.h), ms:
     * read, decode (scale included until the note subtracts it), scale,
     * audio */
    double stage_ms[DH_MS_COUNT];
    float *stage_rows;     /* the caller's sink, stage_n rows; NULL: none */
    uint64_t *stage_bytes; /* its read bytes per position; NULL: none */
    uint32_t bytes_n;
    int64_t bytes_mark; /* src.bytes at the last note */
    uint32_t stage_n;
    /* dh__media_progress(): read by another thread */
    _Atomic uint32_t progress_pos;
    _Atomic uint64_t progress_ms;
};

/* media_open.c */
int dh__media_rewind(struct dh_media *m, int64_t key, struct dh_err *e);
int dh__media_restart(struct dh_media *m, struct dh_err *e);
/* Decode state after a flush at keyframe `key` (-1: none yet). */
void dh__media_repositioned(struct dh_media *m, int64_t key);
int64_t dh__media_frame_index(const struct dh_media *m, int64_t ts);
int dh__media_in_table(const struct dh_media *m, int64_t ts);
/* A decoded picture's timestamp: FFmpeg's best effort, else its pts. */
int64_t dh__media_picture_ts(const AVFrame *f);
/* Seconds from the clip's start of frame `at`, for messages. */
double dh__media_frame_time(const struct dh_media *m, int64_t at);
/* 0 for a picture that cannot be a frame of the clip (see media_open.c);
 * clears the keyframe gate once one passes it. */
int dh__media_trustworthy(struct dh_media *m, const AVFrame *f);
/* Every packet of the video stream goes through this before the decoder. */
void dh__media_note_packet(struct dh_media *m, const AVPacket *pkt);
int64_t dh__media_key_at_or_before(const struct dh_media *m, int64_t index);
const char *dh__media_errstr(int averr, char *buf, size_t len);

/* media_decode.c: the one decode loop.  Sends `pkt` (NULL: end of stream,
 * drain) and hands every picture that can be a frame of the clip
 * (dh__media_trustworthy) to pic(ctx, f, e), whose non-zero return stops
 * it.  Errors name the frame after m->last_index (dh__media_av_fail with
 * `what`). */
typedef int (*dh__media_picture_fn)(void *ctx, AVFrame *f, struct dh_err *e);
int dh__media_feed(struct dh_media *m, const AVPacket *pkt, const char *what,
                   dh__media_picture_fn pic, void *ctx, struct dh_err *e);
/* av_read_frame() into m->pkt, with AVERROR_EOF turned into AVERROR(EIO)
 * when a read of the source failed (dh__media_av_fail then names it). */
int dh__media_read_frame(struct dh_media *m);
/* DH_EMEDIA "<file>: <what> near frame N (T s): <FFmpeg's reason>" (what
 * NULL: "<file>: frame N ..."), or the watchdog's error when it cut the
 * call. */
int dh__media_av_fail(struct dh_media *m, int averr, const char *what,
                      struct dh_err *e);

/* media_scale.c: writes frame `f` as output frame `slot` of plan `p`. */
int dh__media_emit(struct dh_media *m, const struct dh_media_plan *p,
                   AVFrame *f, int64_t slot, uint8_t *dst, struct dh_err *e);
/* Fills output frame `slot` with zeros or a copy of output frame `from`. */
void dh__media_fill(const struct dh_media_plan *p, uint8_t *dst, int64_t slot,
                    int64_t from);
void dh__media_scale_fini(struct dh_media *m);

/* 1 once the open file's watchdog deadline has passed (media_open.c). */
int dh__media_overdue(const struct dh_media *m);
/* The watchdog's DH_ETIMEOUT for the open file. */
int dh__media_watchdog_error(const struct dh_media *m, struct dh_err *e);

#endif
