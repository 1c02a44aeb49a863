/*
 * av_util.c - FFmpeg error text and log level (see av_util.h).
 */
#include "media/av_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <math.h>
#include <string.h>
#include <strings.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/display.h>
#include <libavutil/error.h>
#include <libavutil/imgutils.h>
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

int dh__av_is_image_format(const AVInputFormat *f)
{
    size_t n = strlen(f->name);

    /* "image2" opens files by name, "*_pipe" demuxers by content. */
    return !strcmp(f->name, "image2") ||
           (n > 5 && !strcmp(f->name + n - 5, "_pipe"));
}

double dh__av_stream_seconds(const AVFormatContext *fc, const AVStream *st)
{
    if (st->duration != AV_NOPTS_VALUE && st->duration > 0)
        return (double)st->duration * av_q2d(st->time_base);
    if (fc->duration != AV_NOPTS_VALUE && fc->duration > 0)
        return (double)fc->duration / AV_TIME_BASE;
    return 0;
}

int32_t dh__av_stream_rotation(const AVStream *st)
{
    const uint8_t *m = av_stream_get_side_data(st, AV_PKT_DATA_DISPLAYMATRIX,
                                               NULL);
    double theta;
    long r;

    if (!m)
        return 0;
    theta = -av_display_rotation_get((const int32_t *)m);
    if (!isfinite(theta))
        return 0;
    r = lround(theta / 90.0) * 90 % 360;
    return (int32_t)(r < 0 ? r + 360 : r);
}

static int find_video_stream(const AVFormatContext *fc)
{
    for (unsigned i = 0; i < fc->nb_streams; i++) {
        const AVStream *st = fc->streams[i];
        if (st->codecpar->codec_type == AVMEDIA_TYPE_VIDEO &&
            !(st->disposition & AV_DISPOSITION_ATTACHED_PIC))
            return (int)i;
    }
    return -1;
}

/* A header may claim any size; FFmpeg's decoders refuse pictures past
 * av_image_check_size() (about 16,000 x 16,000), so such a file is not
 * decodable whatever it holds, and its size must not reach the estimates
 * (a claimed 65535 x 65535 would plan as millions of tokens). */
static int check_claimed_size(const AVStream *st, int idx, const char *path,
                              struct dh_err *e)
{
    int w = st->codecpar->width, h = st->codecpar->height;

    if (av_image_check_size((unsigned)w, (unsigned)h, 0, NULL) < 0)
        return dh_err_set(e, DH_EMEDIA,
                          "%s: the header claims %dx%d "
                          "pictures, beyond what FFmpeg decodes",
                          path, w, h);
    return idx;
}

int dh__av_find_video(AVFormatContext *fc, const char *path, struct dh_err *e)
{
    int idx = find_video_stream(fc);
    char buf[128];
    int rc;

    /* Stream info decodes a few frames: only when the header lacks the
     * codec or the frame size. */
    if (idx >= 0 && fc->streams[idx]->codecpar->width > 0 &&
        fc->streams[idx]->codecpar->codec_id != AV_CODEC_ID_NONE)
        return check_claimed_size(fc->streams[idx], idx, path, e);
    rc = avformat_find_stream_info(fc, NULL);
    if (rc < 0)
        return dh_err_set(e, DH_EMEDIA, "%s: reading stream info: %s", path,
                          dh__av_errstr(rc, buf, sizeof(buf)));
    idx = find_video_stream(fc);
    if (idx < 0)
        return dh_err_set(e, DH_EMEDIA, "%s: no video or image stream", path);
    if (fc->streams[idx]->codecpar->width <= 0)
        return dh_err_set(e, DH_EMEDIA, "%s: video stream has no frame size",
                          path);
    return check_claimed_size(fc->streams[idx], idx, path, e);
}

const char *dh__av_list_hint(const char *name)
{
    static const char *const ext[] = {".m3u8", ".m3u", ".mpd", ".ffconcat",
                                      ".concat"};
    size_t n = name ? strlen(name) : 0;

    for (size_t i = 0; i < sizeof(ext) / sizeof(ext[0]); i++) {
        size_t m = strlen(ext[i]);

        if (n > m && !strcasecmp(name + n - m, ext[i]))
            return " (a playlist or list of other inputs: those are not "
                   "opened; give its media files)";
    }
    return "";
}

int dh__av_open_io(AVFormatContext **fc, const char *url)
{
    AVDictionary *opts = NULL;
    int rc;

    /* No input opens others: a playlist (HLS, DASH), a concat list or an
     * image pattern that names files or URLs cannot reach them (a FIFO
     * there would block a worker in open(), and it could read any file the
     * user can); no protocol at all is open to what an input names. */
    av_dict_set(&opts, "protocol_whitelist", "none", 0);
    rc = avformat_open_input(fc, url ? url : "", NULL, &opts);
    av_dict_free(&opts);
    return rc;
}

int dh__av_counts_as_frame(const AVPacket *pkt, int *seen_key)
{
    if (pkt->flags & AV_PKT_FLAG_KEY)
        *seen_key = 1;
    return *seen_key && !(pkt->flags & AV_PKT_FLAG_DISCARD);
}

/* Nothing to hold the packets' end against: the file is unchecked unless
 * its header's frame count was (AVI). */
static int no_duration(const AVStream *st, int *unchecked)
{
    if (unchecked)
        *unchecked = st->nb_frames <= 0;
    return 0;
}

int dh__av_check_complete(const AVFormatContext *fc, const AVStream *st,
                          int64_t packets, double end_s, double all_end_s,
                          int *unchecked, const char *path, struct dh_err *e)
{
    AVRational r = st->avg_frame_rate.num ? st->avg_frame_rate
                                          : st->r_frame_rate;
    double frame_s = r.num && r.den ? 1 / av_q2d(r) : 0.04;
    /* Muxers disagree by up to two frame durations on where a stream ends
     * (FLV's header counts one past the last packet's end, others stop at
     * its start) and round to their time base: 2.5 frames and a tick. */
    double slack = 2.5 * frame_s + av_q2d(st->time_base);
    const char *whose = "video";
    double dur;

    if (unchecked)
        *unchecked = 0;
    /* AVI and others state the frame count in the header. */
    if (st->nb_frames > 0 && packets < st->nb_frames)
        return dh_err_set(e, DH_EMEDIA,
                          "%s: truncated or damaged: the header promises %lld "
                          "frames, the file holds %lld",
                          path, (long long)st->nb_frames, (long long)packets);
    if (end_s <= 0 ||
        fc->duration_estimation_method == AVFMT_DURATION_FROM_BITRATE)
        return no_duration(st, unchecked); /* no timestamps, or a duration
                                              guessed from the size */
    /* The video's own duration, or the container's when the video is all
     * it holds.  With other streams the container's may be theirs (audio
     * longer than the video by seconds is common): then it is held against
     * where any stream's packets end, when the scan read them all, and
     * otherwise the headers cannot tell: the file is left unchecked rather
     * than called damaged (`probe --verify` decodes it). */
    if (st->duration != AV_NOPTS_VALUE && st->duration > 0) {
        dur = (double)st->duration * av_q2d(st->time_base);
    } else if (fc->duration != AV_NOPTS_VALUE && fc->duration > 0 &&
               (fc->nb_streams == 1 || all_end_s > 0)) {
        dur = (double)fc->duration / AV_TIME_BASE;
        if (fc->nb_streams > 1) {
            end_s = all_end_s;
            whose = "its";
            slack += 0.25; /* an audio packet's length, and more */
        }
    } else {
        return no_duration(st, unchecked);
    }
    if (end_s + slack < dur)
        return dh_err_set(e, DH_EMEDIA,
                          "%s: truncated or damaged: %s packets end at "
                          "%.3f s but the header says %.3f s",
                          path, whose, end_s, dur);
    return 0;
}
