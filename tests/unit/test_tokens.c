/* test_tokens.c - token models, sampling-plan output shapes, profiles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "datahelix/estimate.h"
#include "datahelix/media.h"

static struct dh_token_model model(const char *spec)
{
    struct dh_token_model m;
    struct dh_err e;

    assert_int_equal(dh_token_model_parse(spec, &m, &e), 0);
    return m;
}

static void qwen_vl_rounds_sides_to_28(void **state)
{
    struct dh_token_model m = model("qwen-vl");

    (void)state;
    /* 16 frames at 224x224: 8 temporal x 8 x 8 */
    assert_int_equal(dh_token_model_count(&m, 16, 224, 224), 8 * 8 * 8);
    /* 400x224: 400/28 = 14.3 -> 14 */
    assert_int_equal(dh_token_model_count(&m, 16, 400, 224), 8 * 14 * 8);
    /* odd frame counts round up: 3 frames -> 2 temporal groups */
    assert_int_equal(dh_token_model_count(&m, 3, 28, 28), 2);
    /* an image is one temporal group */
    assert_int_equal(dh_token_model_count(&m, 1, 448, 448), 16 * 16);
    assert_int_equal(dh_token_model_count(&m, 0, 448, 448), 0);
    assert_int_equal(dh_token_model_count(&m, 4, 0, 448), 0);
}

static void videomae_and_dit(void **state)
{
    struct dh_token_model v = model("videomae");
    struct dh_token_model d = model("dit");

    (void)state;
    assert_int_equal(dh_token_model_count(&v, 16, 224, 224), 8 * 14 * 14);
    /* causal VAE: 17 frames -> 1 + 4 latent frames; 256/16 = 16 */
    assert_int_equal(dh_token_model_count(&d, 17, 256, 256), 5 * 16 * 16);
    assert_int_equal(dh_token_model_count(&d, 1, 256, 256), 1 * 16 * 16);
    /* sizes that do not divide round up */
    assert_int_equal(dh_token_model_count(&v, 2, 17, 16), 2);
}

static void custom_patch_spec(void **state)
{
    struct dh_token_model m = model("patch=14,tpatch=4");
    struct dh_token_model s;
    struct dh_err e;

    (void)state;
    assert_int_equal(dh_token_model_count(&m, 8, 28, 14), 2 * 2 * 1);
    assert_string_equal(m.name, "patch=14,tpatch=4");
    m = model("patch=10");
    assert_int_equal(m.tpatch, 1);
    assert_int_equal(dh_token_model_count(&m, 3, 20, 20), 3 * 2 * 2);
    const char *bad[] = {"",         "qwen",        "patch=",
                         "patch=0",  "patch=8,t=2", "patch=8,tpatch=",
                         "patch=8x", "patch=-3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dh_err_clear(&e);
        assert_int_equal(dh_token_model_parse(bad[i], &s, &e), DH_EINVAL);
        assert_non_null(strstr(e.msg, "qwen-vl, videomae, dit"));
    }
}

static void text_tokens(void **state)
{
    (void)state;
    assert_int_equal(dh_text_tokens(0), 0);
    assert_int_equal(dh_text_tokens(1), 1);
    assert_int_equal(dh_text_tokens(8), 2);
    assert_int_equal(dh_text_tokens(9), 3);
}

static void plan_specs_parse_and_format(void **state)
{
    struct dh_sample_plan p;
    struct dh_err e;
    char buf[32];

    (void)state;
    dh_sample_plan_default(&p);
    dh_sample_plan_format_frames(&p, buf, sizeof(buf));
    assert_string_equal(buf, "fps:8");
    assert_int_equal(dh_sample_plan_parse_frames("16", &p, &e), 0);
    assert_int_equal(p.frames, 16);
    dh_sample_plan_format_frames(&p, buf, sizeof(buf));
    assert_string_equal(buf, "16");
    assert_int_equal(dh_sample_plan_parse_frames("fps:2.5", &p, &e), 0);
    assert_true(p.frames == 0 && p.fps == 2.5);
    assert_int_equal(dh_sample_plan_parse_frames("all", &p, &e), 0);
    dh_sample_plan_format_frames(&p, buf, sizeof(buf));
    assert_string_equal(buf, "all");
    assert_int_equal(dh_sample_plan_parse_size("224x160", &p, &e), 0);
    assert_true(p.width == 224 && p.height == 160);
    dh_sample_plan_format_size(&p, buf, sizeof(buf));
    assert_string_equal(buf, "224x160");
    const char *badf[] = {
        "", "0", "-4", "fps:", "fps:0", "fps:x", "16x", "all2"};
    for (size_t i = 0; i < sizeof(badf) / sizeof(badf[0]); i++)
        assert_int_equal(dh_sample_plan_parse_frames(badf[i], &p, &e),
                         DH_EINVAL);
    const char *bads[] = {"",     "224",       "224x",    "x224",
                          "0x10", "224x224x3", "99999x2", "natural"};
    for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++)
        assert_int_equal(dh_sample_plan_parse_size(bads[i], &p, &e), DH_EINVAL);
}

static struct dh_desc video(int64_t frames, double dur, int w, int h, int rot)
{
    struct dh_desc d;

    dh_desc_init(&d);
    d.kind = DH_KIND_VIDEO;
    d.frames = frames;
    d.duration_s = dur;
    d.width = w;
    d.height = h;
    d.rotation = rot;
    return d;
}

static void plan_output_shapes(void **state)
{
    struct dh_sample_plan p;
    struct dh_desc d = video(100, 4.0, 600, 336, 0);
    int64_t f;
    int32_t w, h;

    (void)state;
    dh_sample_plan_default(&p); /* fps:8, native, max 256 */
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_true(f == 32 && w == 600 && h == 336);
    d = video(100, 4.0, 600, 336, 90); /* rotation swaps the sides */
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_true(w == 336 && h == 600);
    d = video(10, 4.0, 600, 336, 0); /* never more than the clip has */
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_int_equal(f, 10);
    d = video(100000, 4000.0, 600, 336, 0); /* the cap */
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_int_equal(f, 256);
    p.max_side = 300; /* longer side 600 -> 300 */
    d = video(100, 4.0, 600, 336, 0);
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_true(w == 300 && h == 168);
    p.frames = 16;
    p.width = 224;
    p.height = 224;
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_true(f == 16 && w == 224 && h == 224);
    d.kind = DH_KIND_IMAGE;
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_int_equal(f, 1);
    d.kind = DH_KIND_TEXT;
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_true(f == 0 && w == 0 && h == 0);
}

/* A header's claimed size (damaged or hostile) is clamped to what the
 * media pipeline can produce, so it cannot weigh millions of tokens. */
static void plan_output_clamped_to_decodable(void **state)
{
    struct dh_sample_plan p;
    struct dh_desc d = video(1000, 40.0, 65535, 65535, 0);
    struct dh_token_model m = model("qwen-vl");
    int64_t f;
    int32_t w, h;

    (void)state;
    dh_sample_plan_default(&p);
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_true(w <= 16384 && h <= 16384 && w >= 1 && h >= 1);
    assert_true(f >= 1 && f * w * h <= DH_MEDIA_MAX_PIXELS);
    assert_true(dh_token_model_count(&m, f, w, h) <= 400000);
    d = video(1000, 40.0, 65535, 100, 0); /* aspect kept */
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_int_equal(w, 16384);
    assert_int_equal(h, 25);
    p.fps = 0;
    p.frames = 0; /* every frame of a long 4K clip: over the pixel cap */
    d = video(100000, 4000.0, 3840, 2160, 0);
    dh_sample_plan_output(&p, &d, &f, &w, &h);
    assert_int_equal(f, DH_MEDIA_MAX_PIXELS / (3840 * 2160));
}

static void profile_buckets(void **state)
{
    char b[32];

    (void)state;
    dh_profile_name(DH_KIND_VIDEO, 16, 400, 224, b, sizeof(b));
    assert_string_equal(b, "16x224");
    dh_profile_name(DH_KIND_VIDEO, 13, 400, 230, b, sizeof(b));
    assert_string_equal(b, "16x224"); /* 13 > 16/sqrt(2) */
    dh_profile_name(DH_KIND_VIDEO, 11, 400, 224, b, sizeof(b));
    assert_string_equal(b, "8x224");
    dh_profile_name(DH_KIND_VIDEO, 32, 336, 600, b, sizeof(b));
    assert_string_equal(b, "32x336"); /* portrait: short side */
    dh_profile_name(DH_KIND_VIDEO, 64, 800, 448, b, sizeof(b));
    assert_string_equal(b, "64x448");
    dh_profile_name(DH_KIND_VIDEO, 240, 1920, 1080, b, sizeof(b));
    assert_string_equal(b, "256x1080");
    dh_profile_name(DH_KIND_IMAGE, 1, 50, 50, b, sizeof(b));
    assert_string_equal(b, "1x144");
    dh_profile_name(DH_KIND_TEXT, 0, 0, 0, b, sizeof(b));
    assert_string_equal(b, "text");
}

static void audio_tokens_presets_and_errors(void **state)
{
    struct dh_audio_tokens t;
    struct dh_err e;

    (void)state;
    assert_int_equal(dh_audio_tokens_parse("whisper", &t, &e), 0);
    assert_true(t.per_s == 50);
    assert_int_equal(dh_audio_tokens_parse("qwen-audio", &t, &e), 0);
    assert_true(t.per_s == 25);
    assert_int_equal(dh_audio_tokens_parse("12.5", &t, &e), 0);
    assert_true(t.per_s == 12.5);
    assert_int_equal(dh_audio_tokens_parse("none", &t, &e), 0);
    assert_true(t.per_s == 0);
    static const char *const bad[] = {"", "0", "-3", "x", "1e9", "5x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(dh_audio_tokens_parse(bad[i], &t, &e), DH_EINVAL);
}

/* est_tokens of `d` under `est`, without and with its sound counted. */
static int64_t sound_tokens(struct dh_estimator *est, struct dh_desc *d)
{
    struct dh_audio_tokens keep = est->audio;
    int64_t mute;

    est->audio.per_s = 0;
    dh_estimate(est, d);
    mute = d->est_tokens;
    est->audio = keep;
    dh_estimate(est, d);
    return d->est_tokens - mute;
}

/* The span the sampled frames cover, and the tokens it adds. */
static void audio_span_follows_the_plan(void **state)
{
    struct dh_estimator est = {0};
    struct dh_desc d;
    struct dh_err e;

    (void)state;
    dh_desc_init(&d);
    dh_sample_plan_default(&est.plan); /* fps:8, at most 256 frames */
    assert_int_equal(dh_token_model_parse("qwen-vl", &est.tokens, &e), 0);
    dh_cost_model_default(&est.cost);
    assert_int_equal(dh_audio_tokens_parse("whisper", &est.audio, &e), 0);
    d.kind = DH_KIND_VIDEO;
    d.width = d.height = 224;
    d.frames = 100;
    d.fps = 25;
    d.duration_s = 4;
    assert_int_equal(sound_tokens(&est, &d), 0); /* no audio stream */
    snprintf(d.audio_codec, sizeof(d.audio_codec), "aac");
    d.audio_duration_s = 3.5; /* shorter than the video: all of it */
    assert_int_equal(sound_tokens(&est, &d), 175);
    est.plan.max_frames = 16; /* fps:8 capped at 16 frames: 2 s */
    assert_true(dh_audio_span_s(&est.plan, &d, 16) == 2.0);
    assert_int_equal(sound_tokens(&est, &d), 100);
    est.plan.frames = 16; /* a fixed count covers the clip */
    assert_true(dh_audio_span_s(&est.plan, &d, 16) == 3.5);
    assert_int_equal(sound_tokens(&est, &d), 175);
    est.audio.per_s = 25;                         /* qwen-audio */
    assert_int_equal(sound_tokens(&est, &d), 88); /* ceil(87.5) */
    dh_desc_fini(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qwen_vl_rounds_sides_to_28),
        cmocka_unit_test(videomae_and_dit),
        cmocka_unit_test(custom_patch_spec),
        cmocka_unit_test(text_tokens),
        cmocka_unit_test(plan_specs_parse_and_format),
        cmocka_unit_test(plan_output_shapes),
        cmocka_unit_test(plan_output_clamped_to_decodable),
        cmocka_unit_test(profile_buckets),
        cmocka_unit_test(audio_tokens_presets_and_errors),
        cmocka_unit_test(audio_span_follows_the_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
