/*
 * verify_cache.h - what `datahelix probe --verify` already decoded, kept
 * in a JSONL file beside the table (OUT.verify.jsonl) so that a run that
 * was interrupted, or re-run over a grown folder, decodes only what it has
 * not seen (internal to the CLI).
 *
 * One line per verified file:
 *   {"v":1,"path":P,"size":N,"mtime_ns":N,"ok":true,"frames":N,
 *    "media_s":S}                     ("reason":R instead when ok is false)
 * appended with one write(2) as each file finishes, so a kill -9 loses at
 * most the line being written; a torn or foreign line is skipped on load.
 * A later line for a path replaces an earlier one.  An entry counts only
 * while the file's size and mtime are what the line recorded.
 *
 * Thread-safety: after open, lookups may run on any number of threads at
 * once, concurrently with appends (which serialise on a lock); open,
 * rewrite and close run alone.
 */
#ifndef DH_CLI_VERIFY_CACHE_H
#define DH_CLI_VERIFY_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "datahelix/error.h"

/* One file's verdict, as recorded. */
struct dh_verify_entry {
    int64_t size;
    int64_t mtime_ns;
    int ok;
    int64_t frames;
    double media_s;
    char *reason; /* why it failed (no path prefix), NULL when ok; owned */
};

struct dh_verify_cache;

/*
 * Loads `path` if it exists and opens it for appending (creating it, 0644).
 * DH_EIO when it cannot be read or created, DH_ENOMEM.  *out owned by the
 * caller (close).
 */
int dh_verify_cache_open(const char *path, struct dh_verify_cache **out,
                         struct dh_err *e) DH_MUST_CHECK;

/* The entry for `file` when its size and mtime match, else NULL; borrowed
 * until close. */
const struct dh_verify_entry *
dh_verify_cache_find(const struct dh_verify_cache *c, const char *file,
                     int64_t size, int64_t mtime_ns);

/* Entries loaded, and lines the file holds (loaded + appended + skipped). */
size_t dh_verify_cache_loaded(const struct dh_verify_cache *c);
size_t dh_verify_cache_lines(const struct dh_verify_cache *c);

/*
 * Appends `v` for `file` and hands the line to the kernel before returning
 * (survives the process being killed, not a power cut).  DH_EIO (disk
 * full...), DH_EINVAL for a path JSON cannot hold, DH_ENOMEM; the cache
 * file is unchanged then.
 */
int dh_verify_cache_append(struct dh_verify_cache *c, const char *file,
                           const struct dh_verify_entry *v,
                           struct dh_err *e) DH_MUST_CHECK;

/* The i-th entry to keep and its path, or NULL to skip item i. */
typedef const struct dh_verify_entry *(*dh_verify_cache_item_fn)(
    void *arg, size_t i, const char **path);

/*
 * Replaces the file by the entries item(0..n-1) gives, atomically (a
 * temporary file renamed over it), dropping stale and duplicate lines.
 * Appends after this go to the new file.
 */
int dh_verify_cache_rewrite(struct dh_verify_cache *c, size_t n,
                            dh_verify_cache_item_fn item, void *arg,
                            struct dh_err *e) DH_MUST_CHECK;

/* Closes the file and frees everything.  Accepts NULL. */
void dh_verify_cache_close(struct dh_verify_cache *c);

/* Frees what `v` owns. */
void dh_verify_entry_fini(struct dh_verify_entry *v);

#endif
