/*
 * cpu_pool.c - a DataServer's CPUs and a thread's CPU time (cpu_pool.h).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/hash.h"
#include "runtime/cpu_pool.h"

/* Affinity masks up to this many CPUs are read (more are counted as this). */
#define MASK_CPUS 4096

uint32_t dh__cpu_quota_cpus(const char *cpu_max)
{
    unsigned long long quota, period;
    char word[32];

    if (!cpu_max || sscanf(cpu_max, "%31s", word) != 1 || !strcmp(word, "max"))
        return 0;
    if (sscanf(cpu_max, "%llu %llu", &quota, &period) != 2 || period == 0 ||
        quota == 0)
        return 0;
    quota = (quota + period - 1) / period;
    return quota > MASK_CPUS ? MASK_CPUS : (uint32_t)quota;
}

int dh__schedstat_parse(const char *text, uint64_t *cpu_ns, uint64_t *wait_ns)
{
    unsigned long long c, w;

    if (!text || sscanf(text, "%llu %llu", &c, &w) != 2)
        return -1;
    *cpu_ns = c;
    *wait_ns = w;
    return 0;
}

/* The first line of a small file into buf (NUL-terminated), or -1. */
static int read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return -1;
    n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return 0;
}

/* The quota of this process's cgroup v2 group (/proc/self/cgroup's
 * "0::PATH"), in CPUs, or 0. */
static uint32_t cgroup_cpus(void)
{
    char line[512], path[640], text[64];
    const char *rel;
    size_t n;

    if (read_small("/proc/self/cgroup", line, sizeof(line)) < 0 ||
        strncmp(line, "0::", 3) != 0)
        return 0;
    rel = line + 3;
    n = strcspn(rel, "\n");
    if (snprintf(path, sizeof(path), "/sys/fs/cgroup%.*s/cpu.max", (int)n,
                 rel) >= (int)sizeof(path) ||
        read_small(path, text, sizeof(text)) < 0)
        return 0;
    return dh__cpu_quota_cpus(text);
}

void dh__cpu_pool_probe(uint32_t *cpus, uint64_t *key)
{
    size_t sz = CPU_ALLOC_SIZE(MASK_CPUS);
    cpu_set_t *mask = CPU_ALLOC(MASK_CPUS);
    char boot[64];
    uint32_t n, q;

    *cpus = 0;
    *key = 0;
    if (!mask)
        return;
    CPU_ZERO_S(sz, mask);
    if (sched_getaffinity(0, sz, mask) == 0 &&
        (n = (uint32_t)CPU_COUNT_S(sz, mask)) > 0) {
        q = cgroup_cpus();
        *cpus = q > 0 && q < n ? q : n;
        if (read_small("/proc/sys/kernel/random/boot_id", boot, sizeof(boot)) ==
            0) {
            *key = dh__hash64(mask, sz, dh__hash64(boot, strlen(boot), 0));
            if (*key == 0)
                *key = 1;
        }
    }
    CPU_FREE(mask);
}

int dh__thread_sched(uint64_t *cpu_ns, uint64_t *wait_ns)
{
    char buf[128];

    if (read_small("/proc/thread-self/schedstat", buf, sizeof(buf)) < 0)
        return -1;
    return dh__schedstat_parse(buf, cpu_ns, wait_ns);
}
