/*
 * table_summary.c - the per-profile summary of a descriptor table that
 * `probe --summary` prints: how the data mix will load CPUs and GPUs.
 * Profiles are few (tens), so a linear lookup is enough.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "datahelix/table.h"

#define MAX_PROFILES 128

struct prof_acc {
    char name[DH_PROFILE_MAX];
    int64_t count;
    double frames, width, height, cpu_ms, tokens, out_bytes;
};

static struct prof_acc *find(struct prof_acc *a, size_t *n, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (!strcmp(a[i].name, name))
            return &a[i];
    if (*n == MAX_PROFILES)
        return &a[MAX_PROFILES - 1]; /* the last bucket absorbs the rest */
    memset(&a[*n], 0, sizeof(a[*n]));
    snprintf(a[*n].name, sizeof(a[*n].name), "%s", name);
    return &a[(*n)++];
}

static void add(struct prof_acc *p, const struct dh_desc *d)
{
    p->count++;
    p->frames += (double)d->frames;
    p->width += d->width;
    p->height += d->height;
    p->cpu_ms += d->est_cpu_ms;
    p->tokens += (double)d->est_tokens;
    p->out_bytes += (double)d->est_out_bytes;
}

static void row(FILE *f, const struct prof_acc *p)
{
    double n = p->count ? (double)p->count : 1;

    fprintf(f, "%-10s %6lld %8.0f %5.0fx%-5.0f %9.1f %9.0f %9.2f %9.1f\n",
            p->name, (long long)p->count, p->frames / n, p->width / n,
            p->height / n, p->cpu_ms / n, p->tokens / n, p->out_bytes / n / 1e6,
            p->cpu_ms / 1e3);
}

/* Orders "FxS" names by frames, then short side; others ("text") last. */
static int by_shape(const void *a, const void *b)
{
    const char *x = ((const struct prof_acc *)a)->name;
    const char *y = ((const struct prof_acc *)b)->name;
    long fx = strtol(x, NULL, 10), fy = strtol(y, NULL, 10);
    const char *sx = strchr(x, 'x'), *sy = strchr(y, 'x');

    if (!sx || !sy)
        return sx ? -1 : sy ? 1 : strcmp(x, y);
    if (fx != fy)
        return fx < fy ? -1 : 1;
    return (int)(strtol(sx + 1, NULL, 10) - strtol(sy + 1, NULL, 10));
}

void dh_cli_print_profile_summary(FILE *f, const struct dh_desc *descs,
                                  const int *ok, size_t n)
{
    static struct prof_acc acc[MAX_PROFILES];
    struct prof_acc total;
    size_t np = 0;

    memset(&total, 0, sizeof(total));
    snprintf(total.name, sizeof(total.name), "all");
    for (size_t i = 0; i < n; i++) {
        if (ok && !ok[i])
            continue;
        add(find(acc, &np, descs[i].profile), &descs[i]);
        add(&total, &descs[i]);
    }
    qsort(acc, np, sizeof(acc[0]), by_shape);
    fprintf(f, "%-10s %6s %8s %11s %9s %9s %9s %9s\n", "profile", "count",
            "frames", "resolution", "cpu_ms", "tokens", "out_MB", "cpu_s");
    fprintf(f, "%-10s %6s %8s %11s %9s %9s %9s %9s\n", "", "", "(mean)",
            "(mean)", "(mean)", "(mean)", "(mean)", "(total)");
    for (size_t i = 0; i < np; i++)
        row(f, &acc[i]);
    row(f, &total);
}
