/* test_metrics.c - the metrics endpoint's pure parts and its bind rules
 * (docs/metrics.md): histogram buckets, the exposition text of a
 * snapshot (every family once, cumulative buckets, escaped labels, rank
 * figures only when reported), snapshot copies, allocation failure; the
 * HTTP server's refusal of a non-loopback bind without a token and its
 * token file checks.  The served HTTP (status codes, hostile clients, a
 * live job) is tested in tests/integration/test_metrics.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/alloc.h"
#include "runtime/metrics_http.h"
#include "runtime/metrics_snap.h"

static void buckets_take_their_values(void **state)
{
    struct dh_mx_hist h;

    (void)state;
    memset(&h, 0, sizeof(h));
    dh__mx_observe(&h, DH_MX_B_US, 0.5); /* <= 1 */
    dh__mx_observe(&h, DH_MX_B_US, 1);   /* le is inclusive */
    dh__mx_observe(&h, DH_MX_B_US, 1.5); /* <= 2 */
    dh__mx_observe(&h, DH_MX_B_US, 1e9); /* +Inf */
    dh__mx_observe(&h, DH_MX_B_US, -3);  /* counted as 0 */
    assert_int_equal(h.n[0], 3);
    assert_int_equal(h.n[1], 1);
    assert_int_equal(h.n[12], 1); /* after the 12 bounds of B_US */
    assert_int_equal(h.count, 5);
    assert_true(h.sum > 1e9 && h.sum < 1e9 + 4);
}

static void snap_fill(struct dh_mx_snap *s)
{
    memset(s, 0, sizeof(*s));
    s->st.requests = 41;
    s->st.servers = 1;
    s->decisions[DH_PLACE_REASON_LOCAL_MEETS] = 7;
    dh__mx_observe(&s->decide_us, DH_MX_B_US, 3);
    dh__mx_observe(&s->decide_us, DH_MX_B_US, 30);
    s->n_servers = s->cap_servers = 2;
    s->servers = calloc(2, sizeof(*s->servers));
    assert_non_null(s->servers);
    s->servers[0] = (struct dh_mx_server){.id = 5,
                                          .alive = 1,
                                          .rank = 0,
                                          .queue_depth = 3,
                                          .tasks = 9,
                                          .out_bps = 1.5e6};
    snprintf(s->servers[0].addr, sizeof(s->servers[0].addr), "%s",
             "ipc:///tmp/a\"b\\c\nd");
    s->servers[1] = (struct dh_mx_server){.id = 6, .remote = 1, .dead = 1};
    snprintf(s->servers[1].addr, sizeof(s->servers[1].addr), "%s",
             "tcp://10.0.0.2:7600");
    s->n_ranks = s->cap_ranks = 2;
    s->ranks = calloc(2, sizeof(*s->ranks));
    assert_non_null(s->ranks);
    s->ranks[0] = (struct dh_mx_rank){.rank = 0,
                                      .requests = 4,
                                      .reported = 1,
                                      .steps = 12,
                                      .misses = 2,
                                      .window_ms = 20};
    dh__mx_observe(&s->ranks[0].input_wait, DH_MX_B_MS, 0.05);
    dh__mx_observe(&s->ranks[0].input_wait, DH_MX_B_MS, 7);
    s->ranks[1] = (struct dh_mx_rank){.rank = 3, .requests = 1};
}

static int count(const char *hay, const char *needle)
{
    int n = 0;

    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static void text_of_a_snapshot(void **state)
{
    struct dh_mx_snap s;
    char *t = NULL;
    size_t len = 0;

    (void)state;
    snap_fill(&s);
    assert_int_equal(dh__mx_format(&s, &t, &len), 0);
    assert_int_equal(strlen(t), len);
    assert_non_null(strstr(t, "\ndatahelix_requests_total 41\n"));
    assert_non_null(
        strstr(t, "datahelix_decisions_total{reason=\"local_meets\"} 7\n"));
    /* Cumulative buckets, +Inf equal to the count. */
    assert_non_null(strstr(t, "datahelix_decision_us_bucket{le=\"5\"} 1\n"));
    assert_non_null(strstr(t, "datahelix_decision_us_bucket{le=\"50\"} 2\n"));
    assert_non_null(strstr(t, "datahelix_decision_us_bucket{le=\"+Inf\"} 2\n"));
    assert_non_null(strstr(t, "datahelix_decision_us_count 2\n"));
    assert_non_null(strstr(t, "datahelix_decision_us_sum 33\n"));
    /* Labels escaped; both servers in each per-server family. */
    assert_non_null(strstr(t, "datahelix_server_up{server=\"5\",role=\"local\","
                              "rank=\"0\",addr=\"ipc:///tmp/a\\\"b\\\\c\\nd\"} "
                              "1\n"));
    assert_non_null(strstr(t, "datahelix_server_dead{server=\"6\","
                              "role=\"remote\",addr=\"tcp://10.0.0.2:7600\"} "
                              "1\n"));
    assert_int_equal(count(t, "datahelix_server_queue_depth{"), 2);
    assert_non_null(
        strstr(t, "datahelix_server_out_bytes_per_second{server=\"5\""));
    /* Rank figures: the reported ones only for rank 0. */
    assert_non_null(strstr(t, "datahelix_rank_steps{rank=\"0\"} 12\n"));
    assert_null(strstr(t, "datahelix_rank_steps{rank=\"3\"}"));
    assert_non_null(strstr(t, "datahelix_rank_requests_total{rank=\"3\"} 1\n"));
    assert_non_null(strstr(t, "datahelix_rank_input_wait_ms_bucket{rank=\"0\","
                              "le=\"0.1\"} 1\n"));
    assert_non_null(strstr(t, "datahelix_rank_input_wait_ms_bucket{rank=\"0\","
                              "le=\"10\"} 2\n"));
    assert_non_null(
        strstr(t, "datahelix_rank_input_wait_ms_count{rank=\"0\"} 2\n"));
    /* Every family is declared once. */
    assert_int_equal(count(t, "# TYPE datahelix_server_up "), 1);
    assert_int_equal(count(t, "# TYPE datahelix_rank_input_wait_ms "), 1);
    assert_int_equal(count(t, "# TYPE "), count(t, "# HELP "));
    assert_int_equal(t[len - 1], '\n');
    free(t);
    free(s.servers);
    free(s.ranks);
}

static void copies_grow_and_survive_no_memory(void **state)
{
    struct dh_mx_snap s, d;
    char *t = (char *)"untouched";
    size_t len = 5;

    (void)state;
    snap_fill(&s);
    memset(&d, 0, sizeof(d));
    assert_int_equal(dh__mx_snap_copy(&d, &s), 0);
    assert_int_equal(d.n_servers, 2);
    assert_int_equal(d.servers[1].id, 6);
    assert_ptr_not_equal(d.servers, s.servers);
    assert_int_equal(d.ranks[0].steps, 12);
    dh__alloc_fail_after(0);
    assert_int_equal(dh__mx_format(&s, &t, &len), DH_ENOMEM);
    dh__alloc_fail_reset();
    assert_string_equal(t, "untouched");
    assert_int_equal(len, 5);
    dh__mx_snap_fini(&d);
    assert_null(d.servers);
    free(s.servers);
    free(s.ranks);
}

static int render_none(void *ctx, char **out, size_t *len)
{
    (void)ctx;
    (void)out;
    (void)len;
    return DH_EIO;
}

static void beyond_loopback_needs_a_token(void **state)
{
    struct dh_mhttp *h = NULL;
    struct dh_mhttp_opts o = {.listen = "0.0.0.0:0", .render = render_none};
    struct dh_err e;

    (void)state;
    assert_int_equal(dh__mhttp_start(&o, &h, &e), DH_EINVAL);
    assert_null(h);
    assert_non_null(strstr(e.msg, "refusing to listen on 0.0.0.0:0"));
    assert_non_null(strstr(e.msg, "--metrics-token-file"));
    o.listen = "127.0.0.1";
    assert_int_equal(dh__mhttp_start(&o, &h, &e), DH_EINVAL);
    assert_non_null(strstr(e.msg, "not HOST:PORT"));
    o.listen = "127.0.0.1:0";
    assert_int_equal(dh__mhttp_start(&o, &h, &e), 0);
    assert_non_null(strstr(dh__mhttp_addr(h), "127.0.0.1:"));
    assert_string_not_equal(dh__mhttp_addr(h), "127.0.0.1:0");
    dh__mhttp_stop(h);
    h = NULL;
    /* A token binds too (tests bind loopback only: the non-loopback
     * bind with a token is the same branch of check_exposure()). */
    o.token = "0123456789abcdef";
    assert_int_equal(dh__mhttp_start(&o, &h, &e), 0);
    dh__mhttp_stop(h);
    o.listen = "[::1]:0";
    if (dh__mhttp_start(&o, &h, &e) == 0) { /* IPv6 may be off here */
        assert_non_null(strstr(dh__mhttp_addr(h), "[::1]:"));
        dh__mhttp_stop(h);
    }
}

static void token_file_rules(void **state)
{
    char path[256], tok[DH_MHTTP_TOKEN_MAX + 1];
    const char *dir = getenv("DH_TEST_TMP");
    struct dh_err e;
    FILE *f;

    (void)state;
    snprintf(path, sizeof(path), "%s/metrics-token-%d", dir ? dir : "/tmp",
             (int)getpid());
    assert_non_null(f = fopen(path, "w"));
    fputs("s3cret-token-of-20b\nsecond line\n", f);
    fclose(f);
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(dh__mhttp_load_token(path, tok, sizeof(tok), &e),
                     DH_EINVAL);
    assert_non_null(strstr(e.msg, "chmod 600"));
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(dh__mhttp_load_token(path, tok, sizeof(tok), &e), 0);
    assert_string_equal(tok, "s3cret-token-of-20b");
    assert_non_null(f = fopen(path, "w"));
    fputs("short\n", f);
    fclose(f);
    assert_int_equal(dh__mhttp_load_token(path, tok, sizeof(tok), &e),
                     DH_EINVAL);
    assert_non_null(strstr(e.msg, "16.."));
    unlink(path);
    assert_int_equal(dh__mhttp_load_token(path, tok, sizeof(tok), &e), DH_EIO);
    assert_non_null(strstr(e.msg, path));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buckets_take_their_values),
        cmocka_unit_test(text_of_a_snapshot),
        cmocka_unit_test(copies_grow_and_survive_no_memory),
        cmocka_unit_test(beyond_loopback_needs_a_token),
        cmocka_unit_test(token_file_rules),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
