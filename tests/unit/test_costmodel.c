/* test_costmodel.c - cost features, prediction, non-negative fit, and the
 * estimator that fills a descriptor's planning fields. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "datahelix/estimate.h"

static void fit_recovers_known_coefficients(void **state)
{
    struct dh_cost_features f[12] = {{0}};
    double ms[12];
    struct dh_cost_model m = {.ms_per_audio_s = 1.5},
                         truth = {.base_ms = 2.0,
                                  .ms_per_src_mpx = 3.0,
                                  .ms_per_in_mb = 5.0,
                                  .ms_per_out_mpx = 7.0};
    struct dh_err e;

    (void)state;
    for (int i = 0; i < 12; i++) {
        f[i].src_mpx = 1.0 + i * 1.7;
        f[i].in_mb = 0.2 + (i % 5) * 0.9;
        f[i].out_mpx = 0.5 + (i % 3) * 1.3 + (i % 2);
        ms[i] = dh_cost_model_predict(&truth, &f[i]);
    }
    assert_int_equal(dh_cost_model_fit(f, ms, 12, &m, &e), 0);
    assert_true(fabs(m.base_ms - 2.0) < 1e-3);
    assert_true(fabs(m.ms_per_src_mpx - 3.0) < 1e-3);
    assert_true(fabs(m.ms_per_in_mb - 5.0) < 1e-3);
    assert_true(fabs(m.ms_per_out_mpx - 7.0) < 1e-3);
    /* the sound's coefficient is measured, not fitted: kept as it was */
    assert_true(m.ms_per_audio_s == 1.5);
    f[0].audio_s = 10;
    assert_true(fabs(dh_cost_model_predict(&m, &f[0]) -
                     dh_cost_model_predict(&truth, &f[0]) - 15.0) < 1e-2);
    assert_true(m.fit_rmse_ms < 1e-3);
    assert_int_equal(m.calibrated, 1);
    assert_int_equal(m.fit_samples, 12);
}

static void fit_never_returns_negative_costs(void **state)
{
    struct dh_cost_features f[8] = {{0}};
    double ms[8];
    struct dh_cost_model m = {0};
    struct dh_err e;

    (void)state;
    /* Time falls with input bytes here: an unconstrained fit would give the
     * bytes term a negative coefficient. */
    for (int i = 0; i < 8; i++) {
        f[i].src_mpx = 1.0 + i;
        f[i].in_mb = 8.0 - i + (i % 2) * 0.5;
        f[i].out_mpx = 0;
        ms[i] = 4.0 * f[i].src_mpx - 0.5 * f[i].in_mb + 10;
    }
    assert_int_equal(dh_cost_model_fit(f, ms, 8, &m, &e), 0);
    assert_true(m.base_ms >= 0 && m.ms_per_src_mpx >= 0 &&
                m.ms_per_in_mb >= 0 && m.ms_per_out_mpx >= 0);
    assert_true(m.ms_per_in_mb == 0);
    assert_true(m.ms_per_src_mpx > 3.0);
}

static void fit_rejects_bad_input(void **state)
{
    struct dh_cost_features f[2] = {{1, 1, 1}, {2, 2, 2}};
    double ms[2] = {1, NAN};
    struct dh_cost_model m = {.base_ms = 42};
    struct dh_err e;

    (void)state;
    assert_int_equal(dh_cost_model_fit(f, ms, 1, &m, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "at least 2"));
    assert_int_equal(dh_cost_model_fit(f, ms, 2, &m, &e), DH_EINVAL);
    assert_true(m.base_ms == 42); /* untouched on error */
}

static void features_follow_the_descriptor(void **state)
{
    struct dh_desc d;
    struct dh_cost_features f;

    (void)state;
    dh_desc_init(&d);
    d.kind = DH_KIND_VIDEO;
    d.frames = 100;
    d.width = 1000;
    d.height = 500;
    d.bytes = 3000000;
    dh_cost_features_of(&d, 10, 200, 100, &f);
    assert_true(fabs(f.src_mpx - 50.0) < 1e-9);
    assert_true(fabs(f.in_mb - 3.0) < 1e-9);
    assert_true(fabs(f.out_mpx - 0.2) < 1e-9);
    d.kind = DH_KIND_IMAGE;
    dh_cost_features_of(&d, 1, 200, 100, &f);
    assert_true(fabs(f.src_mpx - 0.5) < 1e-9);
}

static void estimator_fills_planning_fields(void **state)
{
    struct dh_estimator est;
    struct dh_err e;
    struct dh_desc d;
    char caption[] = "twelve bytes";

    (void)state;
    dh_sample_plan_default(&est.plan);
    assert_int_equal(dh_token_model_parse("videomae", &est.tokens, &e), 0);
    dh_cost_model_default(&est.cost);
    dh_desc_init(&d);
    d.kind = DH_KIND_VIDEO;
    d.frames = 50;
    d.duration_s = 2.0;
    d.width = 400;
    d.height = 224;
    d.bytes = 100000;
    d.text = caption;
    dh_estimate(&est, &d);
    assert_string_equal(d.profile, "16x224");
    assert_int_equal(d.est_out_bytes, 16LL * 400 * 224 * 3);
    assert_int_equal(d.est_tokens, 8 * 25 * 14 + 3);
    assert_true(d.est_cpu_ms > 0);
    /* Longer clips cost more. */
    double small = d.est_cpu_ms;
    d.frames = 200;
    d.duration_s = 8.0;
    dh_estimate(&est, &d);
    assert_true(d.est_cpu_ms > small);
    assert_string_equal(d.profile, "64x224");
    d.text = NULL;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fit_recovers_known_coefficients),
        cmocka_unit_test(fit_never_returns_negative_costs),
        cmocka_unit_test(fit_rejects_bad_input),
        cmocka_unit_test(features_follow_the_descriptor),
        cmocka_unit_test(estimator_fills_planning_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
