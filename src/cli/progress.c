/*
 * progress.c - a one-line progress bar with rate and ETA on stderr.
 * Drawn only when stderr is a terminal; anywhere else (a cluster job's log,
 * a pipe) the same facts come as a plain line every DH_PROGRESS_LOG_S
 * seconds ($DATAHELIX_PROGRESS_S; 0: none), so a long run's log shows it
 * is alive without filling up with bars.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli/cli.h"

#define DH_PROGRESS_LOG_S 10.0

static double log_period(void)
{
    const char *s = getenv("DATAHELIX_PROGRESS_S");
    double v;

    if (s && *s && dh_cli_parse_double(s, 0, 86400, &v) == 0)
        return v;
    return DH_PROGRESS_LOG_S;
}

void dh_progress_start(struct dh_progress *p, const char *label, uint64_t total)
{
    p->label = label;
    p->total = total;
    p->done = 0;
    p->failed = 0;
    p->t_start = dh_cli_now();
    p->t_last_draw = 0;
    p->t_last_log = p->t_start;
    p->note[0] = '\0';
    p->enabled = isatty(STDERR_FILENO);
    p->log_every_s = p->enabled ? 0 : log_period();
}

void dh_progress_log_every(struct dh_progress *p, double secs)
{
    p->log_every_s = secs > 0 ? secs : 0;
}

void dh_progress_set_note(struct dh_progress *p, const char *note)
{
    snprintf(p->note, sizeof(p->note), "%s", note ? note : "");
}

static void rates(const struct dh_progress *p, double now, double *rate,
                  double *eta)
{
    double el = now - p->t_start;

    *rate = el > 0 ? (double)p->done / el : 0;
    *eta = *rate > 0 ? (double)(p->total - p->done) / *rate : 0;
}

static void draw(struct dh_progress *p, double now)
{
    int width = 30, fill = p->total ? (int)(width * p->done / p->total) : 0;
    double rate, eta;

    rates(p, now, &rate, &eta);
    fprintf(stderr, "\r%s [", p->label);
    for (int i = 0; i < width; i++)
        fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %llu/%llu %.0f/s ETA %.0fs", (unsigned long long)p->done,
            (unsigned long long)p->total, rate, eta);
    if (p->failed)
        fprintf(stderr, " (%llu failed)", (unsigned long long)p->failed);
    if (p->note[0])
        fprintf(stderr, " %s", p->note);
    fprintf(stderr, "\033[K");
    fflush(stderr);
}

/* The same facts as the bar, as one line a log keeps. */
static void log_line(struct dh_progress *p, double now)
{
    double rate, eta;

    rates(p, now, &rate, &eta);
    fprintf(stderr, "%s: %llu/%llu (%.0f%%), %.1f/s, ETA %.0f s", p->label,
            (unsigned long long)p->done, (unsigned long long)p->total,
            p->total ? 100.0 * (double)p->done / (double)p->total : 100.0, rate,
            eta);
    if (p->failed)
        fprintf(stderr, ", %llu failed", (unsigned long long)p->failed);
    fprintf(stderr, "%s%s\n", p->note[0] ? ", " : "", p->note);
    fflush(stderr);
}

void dh_progress_update(struct dh_progress *p, uint64_t done, uint64_t failed)
{
    double now;

    p->done = done;
    p->failed = failed;
    if (!p->enabled && p->log_every_s <= 0)
        return;
    now = dh_cli_now();
    if (!p->enabled) {
        if (now - p->t_last_log >= p->log_every_s && done != p->total) {
            p->t_last_log = now;
            log_line(p, now);
        }
        return;
    }
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
