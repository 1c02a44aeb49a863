/*
 * cpu_pool.h - which CPUs a DataServer's workers run on, and how much CPU
 * a worker thread's task took (internal; docs/placement.md "CPU pools").
 *
 * The Coordinator gates tasks per pool of CPUs (place.h "pools"): the
 * LOCAL servers of one host whose workers share the same CPUs.  A server
 * names its CPUs by a count and a key: the count is its affinity mask's,
 * lowered by a cgroup v2 CPU quota (cpu.max) when one is set; the key is a
 * hash of the kernel's boot id and the mask, so two servers on one
 * machine with the same mask share a key, and servers of two machines
 * (or two cpusets) do not.
 *
 * The parsers are pure (unit tested on fabricated text); the readers are
 * the one file read each.  Thread-safety: no state.
 */
#ifndef DH_RUNTIME_CPU_POOL_H
#define DH_RUNTIME_CPU_POOL_H

#include <stddef.h>
#include <stdint.h>

/* cgroup v2 cpu.max ("max 100000" or "QUOTA PERIOD"): the CPUs the quota
 * allows, rounded up, or 0 for no quota or text it cannot read. */
uint32_t dh__cpu_quota_cpus(const char *cpu_max);

/* /proc/thread-self/schedstat ("CPU_NS WAIT_NS SLICES"): the thread's time
 * on a CPU and waiting for one, in ns.  0, or -1 for text it cannot read. */
int dh__schedstat_parse(const char *text, uint64_t *cpu_ns, uint64_t *wait_ns);

/* The calling process's CPUs: *cpus (0 if unknown) and *key (0 if
 * unknown: then it is in no pool). */
void dh__cpu_pool_probe(uint32_t *cpus, uint64_t *key);

/* The calling thread's schedstat; -1 where the kernel has none. */
int dh__thread_sched(uint64_t *cpu_ns, uint64_t *wait_ns);

#endif
