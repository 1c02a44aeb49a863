/*
 * progress.c - a one-line progress bar with rate and ETA on stderr.
 * Drawn only when stderr is a terminal so logs and pipes stay clean.
 */
#include <unistd.h>

#include "cli/cli.h"

void dh_progress_start(struct dh_progress *p, const char *label,
                       uint64_t total)
{
    p->label = label;
    p->total = total;
    p->done = 0;
    p->failed = 0;
    p->t_start = dh_cli_now();
    p->t_last_draw = 0;
    p->enabled = isatty(STDERR_FILENO);
}

static void draw(struct dh_progress *p, double now)
{
    double el = now - p->t_start;
    double rate = el > 0 ? (double)p->done / el : 0;
    double eta = rate > 0 ? (double)(p->total - p->done) / rate : 0;
    int width = 30, fill = p->total ? (int)(width * p->done / p->total) : 0;

    fprintf(stderr, "\r%s [", p->label);
    for (int i = 0; i < width; i++)
        fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %llu/%llu %.0f/s ETA %.0fs", (unsigned long long)p->done,
            (unsigned long long)p->total, rate, eta);
    if (p->failed)
        fprintf(stderr, " (%llu failed)", (unsigned long long)p->failed);
    fprintf(stderr, "\033[K");
    fflush(stderr);
}

void dh_progress_update(struct dh_progress *p, uint64_t done, uint64_t failed)
{
    double now;

    p->done = done;
    p->failed = failed;
    if (!p->enabled)
        return;
    now = dh_cli_now();
    if (now - p->t_last_draw < 0.1 && done != p->total)
        return;
    p->t_last_draw = now;
    draw(p, now);
}

void dh_progress_finish(struct dh_progress *p)
{
    if (p->enabled)
        fprintf(stderr, "\r\033[K");
}
