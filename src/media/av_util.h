/*
 * av_util.h - small FFmpeg helpers shared by src/media (internal).
 */
#ifndef DH_MEDIA_AV_UTIL_H
#define DH_MEDIA_AV_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <libavformat/avformat.h>

#include "datahelix/error.h"

/* FFmpeg's text for an AVERROR code, into buf (always NUL-terminated). */
const char *dh__av_errstr(int averr, char *buf, size_t len);

/* Silences FFmpeg's own logging (we report errors ourselves); idempotent.
 * DATAHELIX_AV_LOG=1 in the environment keeps FFmpeg's warnings. */
void dh__av_quiet(void);

/* 1 when the demuxer reads still images (image2, *_pipe). */
int dh__av_is_image_format(const AVInputFormat *f);

/* Display rotation of a stream in degrees clockwise: 0, 90, 180 or 270. */
int32_t dh__av_stream_rotation(const AVStream *st);
/* A stream's length in seconds: its own duration, else the container's
 * (as ffprobe says); 0: unknown. */
double dh__av_stream_seconds(const AVFormatContext *fc, const AVStream *st);

/* Index of the video stream (attached pictures excluded), gathering stream
 * info only when the header lacks codec or size; or a DH_E* code with `e`
 * naming `path`. */
int dh__av_find_video(AVFormatContext *fc, const char *path,
                      struct dh_err *e) DH_MUST_CHECK;

/* avformat_open_input() of a context whose pb the caller set (a source's
 * AVIOContext): `url` "file:PATH" for a whole local file (its name, for
 * the demuxers that go by extension), NULL for a shard member or a
 * buffer.  No protocol is allowed to what an input names (playlists,
 * concat lists, image patterns open nothing).  An AVERROR code. */
int dh__av_open_io(AVFormatContext **fc, const char *url);

/* Why an input that failed to open may have: " (a playlist or list of
 * other inputs: those are not opened; give its media files)" for a name
 * such lists have (.m3u8, .m3u, .mpd, .ffconcat, .concat), else "". */
const char *dh__av_list_hint(const char *name);

/* After a packet scan of stream `st`: fails with a message naming `path`
 * when fewer packets than the header promises arrived, or when they stop
 * (end_s, seconds from the stream start) more than 2.5 frames short of the
 * video's duration in the header; with only the container's duration and
 * other streams beside the video, the end of any stream's packets
 * (all_end_s, from the file's start; 0: not scanned) is held against it.
 * Where the headers cannot tell (no duration, a shared one and no scan of
 * the other streams, one guessed from the bit rate) the file passes
 * unchecked, and *unchecked (may be NULL) says so: `probe --verify`
 * decodes it. */
/* Does this packet of the video stream count as a frame of the clip?  Not
 * before the first keyframe (those pictures never leave the decoder) nor
 * when the demuxer marks it discarded (edit-list preroll).  `seen_key`
 * starts at 0 for each file.  The probe's frame count and the decoder's
 * frame table both count with this, so they agree. */
int dh__av_counts_as_frame(const AVPacket *pkt, int *seen_key);

int dh__av_check_complete(const AVFormatContext *fc, const AVStream *st,
                          int64_t packets, double end_s, double all_end_s,
                          int *unchecked, const char *path,
                          struct dh_err *e) DH_MUST_CHECK;

#endif
