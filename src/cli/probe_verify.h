/*
 * probe_verify.h - the --verify pass of `datahelix probe` (internal to the
 * CLI): every probed video and image decoded in full by dh_media_verify()
 * on --jobs threads, the files that fail left out of the table, progress
 * on stderr, and a resume cache beside the table (verify_cache.h).
 */
#ifndef DH_CLI_PROBE_VERIFY_H
#define DH_CLI_PROBE_VERIFY_H

#include <stddef.h>
#include <stdint.h>

struct dh_desc;
struct dh_probe_list;

struct probe_verify_opts {
    int64_t jobs;
    int keep_going;         /* else stop at the first file that fails */
    int quiet;              /* no closing line */
    const char *cache_path; /* NULL: no resume cache (table on stdout) */
};

struct probe_verify_stats {
    size_t files;    /* videos and images verified (decoded or cached) */
    size_t left_out; /* of those, failed */
    size_t cached;   /* verdicts reused from the cache */
    size_t decoded;  /* decoded in this run */
    double media_s;  /* seconds of video decoded in this run (files that
                        verified) */
    double wall_s;
    int stopped; /* --fail-fast stopped the pass */
};

/*
 * Verifies items i with ok[i] != 0 and descs[i].kind video or image (text
 * is not decoded); clears ok[i] for each that fails and prints it as one
 * line `datahelix: probe: PATH: reason` on stderr.  Reads and appends
 * o->cache_path.  Returns 0, or DH_EXIT_FAIL (after one error line) when
 * the pass itself could not run (out of memory, an unwritable cache);
 * *st is filled in either way.
 */
int dh_cli_probe_verify(const struct dh_probe_list *list,
                        const struct dh_desc *descs, int *ok,
                        const struct probe_verify_opts *o,
                        struct probe_verify_stats *st);

#endif
